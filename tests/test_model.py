"""Model heads and loss, optimizer groups, precision choice, the committed offline tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from distqa.config import ConfigError, load_config
from distqa.data import AnswerType, build_dataset
from distqa.model import QAModel, build_model, qa_loss
from distqa.optim import Precision, build_optimizer

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


@pytest.fixture(scope="module")
def config():
    return load_config(["--max-seq-len", "64", "--max-question-len", "16", "--dropout", "0"], environ={},
                       dotenv_path="/nonexistent")


@pytest.fixture(scope="module")
def model(config) -> QAModel:
    torch.manual_seed(0)
    return build_model(config)


@pytest.fixture(scope="module")
def batch(config) -> dict[str, torch.Tensor]:
    dataset = build_dataset(config, AutoTokenizer.from_pretrained(config.tokenizer_source))
    items = [dataset[i] for i in range(8)]
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


def test_outputs_have_span_and_five_way_type_logits(model: QAModel, batch) -> None:
    output = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert output.start_logits.shape == output.end_logits.shape == (8, 64)
    assert output.answer_type_logits.shape == (8, len(AnswerType)) == (8, 5)


def test_every_parameter_gets_a_gradient(model: QAModel, batch) -> None:
    """DDP runs with find_unused_parameters=False: an unused parameter (e.g. BERT's pooler) would fail."""
    assert model.encoder.pooler is None
    model.zero_grad()
    qa_loss(model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]), batch).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert not missing


def test_loss_is_finite_when_no_window_has_an_answer(model: QAModel, batch) -> None:
    no_answer = dict(batch)
    no_answer["start_positions"] = torch.zeros_like(batch["start_positions"])
    no_answer["end_positions"] = torch.zeros_like(batch["end_positions"])
    no_answer["answer_type"] = torch.full_like(batch["answer_type"], AnswerType.UNKNOWN)
    model.zero_grad()
    output = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    loss = qa_loss(output, no_answer)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    # Same under bf16 autocast with extreme logits.
    scaled = output._replace(start_logits=output.start_logits.detach().bfloat16() * 1e4,
                             end_logits=output.end_logits.detach().bfloat16() * 1e4)
    assert math.isfinite(qa_loss(scaled, no_answer).item())


def test_padding_is_masked_out_of_the_span_loss(model: QAModel, batch) -> None:
    output = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    padding = batch["attention_mask"] == 0
    assert padding.any()
    noisy = output._replace(start_logits=output.start_logits.masked_fill(padding, 1e6),
                            end_logits=output.end_logits.masked_fill(padding, 1e6))
    torch.testing.assert_close(qa_loss(noisy, batch), qa_loss(output, batch))


def test_no_weight_decay_on_biases_and_layernorm(model: QAModel, config) -> None:
    optimizer = build_optimizer(model, config, torch.device("cpu"))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == config.weight_decay and plain["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    plain_names = {names[id(p)] for p in plain["params"]}
    assert any("LayerNorm" in n for n in plain_names) and any(n.endswith("bias") for n in plain_names)
    assert not any("LayerNorm" in names[id(p)] or names[id(p)].endswith("bias") for p in decayed["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_precision_choice_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert Precision.choose("auto", cpu).dtype is None
    bf16 = Precision.choose("bf16", cpu)
    assert bf16.dtype == torch.bfloat16 and not bf16.scaler.is_enabled()
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        Precision.choose("fp16", cpu)


def test_sequence_longer_than_the_encoder_is_rejected() -> None:
    config = load_config(["--max-seq-len", "1024"], environ={}, dotenv_path="/nonexistent")
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        build_model(config)


def test_committed_tiny_tokenizer_works_offline(config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_source)
    encoded = tokenizer("Who wrote the novel?", "The novel was written in 1999 by a teacher.")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    assert "[UNK]" not in tokens
    assert encoded["token_type_ids"][-1] == 1 and encoded["token_type_ids"][0] == 0
    assert len(tokenizer) == build_model(config).encoder.config.vocab_size


def test_tiny_model_directory_can_be_rebuilt(tmp_path) -> None:
    from distqa.tiny import build_tiny_model_dir

    from conftest import REPO_ROOT

    out = build_tiny_model_dir(REPO_ROOT / "data" / "tokenizer-corpus.txt", tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(out)
    committed = AutoTokenizer.from_pretrained(REPO_ROOT / "data" / "tiny-bert")
    assert tokenizer.all_special_tokens == committed.all_special_tokens
    assert abs(len(tokenizer) - len(committed)) < 0.05 * len(committed)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "electra"])
def test_any_bert_family_encoder_trains_every_parameter(family: str, tmp_path, batch) -> None:
    """Built from a local config directory: pooler removed where there is one, token types passed
    only to encoders that take them, every parameter reached by the loss (required by DDP here)."""
    from transformers import AutoConfig

    sizes = {"bert": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
             "roberta": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             max_position_embeddings=130, type_vocab_size=1),
             "distilbert": dict(dim=32, n_layers=1, n_heads=2, hidden_dim=64),
             "electra": dict(hidden_size=32, embedding_size=16, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64)}[family]
    AutoConfig.for_model(family, vocab_size=1266, **sizes).save_pretrained(tmp_path)
    config = load_config(["--model-name-or-path", str(tmp_path), "--tokenizer-name-or-path", "data/tiny-bert",
                          "--max-seq-len", "64", "--max-question-len", "16"], environ={}, dotenv_path="/nonexistent")
    model = build_model(config)
    assert getattr(model.encoder, "pooler", None) is None
    assert model.uses_token_types == (family in ("bert", "electra"))
    qa_loss(model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]), batch).backward()
    assert all(p.grad is not None for p in model.parameters())
