"""Model heads and loss, the committed offline tiny model (the optimizer's groups and the precision choice:
tests/unit/test_optim.py)."""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.encoders.config import TINY_MODEL_DIR
from distqa.encoders.pretrained import check_sources
from distqa.qa.answers import AnswerType
from distqa.qa.model import QAModel, build_model, qa_loss
from distqa.tasks import make_task

from support.processes import clean_env
from support.repo import REPO_ROOT

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
    dataset = make_task(config).train_dataset()
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
    from distqa.encoders.tiny import build_tiny_model_dir

    from support.repo import REPO_ROOT

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


def weightless_copy(tmp_path: Path) -> Path:
    """The tiny model's directory as a pretrained model would be, but without its weights."""
    directory = tmp_path / "no-weights"
    shutil.copytree(TINY_MODEL_DIR, directory)
    return directory


@pytest.mark.parametrize(("case", "message"), [
    ("no weights", r"holds a config but no weights \(model.safetensors or pytorch_model.bin\).*--from-scratch true"),
    ("no config.json", r"cannot load an encoder config from .*no-weights.*config.json"),
    ("broken tokenizer", r"tokenizer_name_or_path=.*cannot load a tokenizer from .*tokenizer.json"),
])
def test_a_model_or_tokenizer_that_cannot_load_is_a_configuration_error(case: str, message: str,
                                                                        tmp_path: Path) -> None:
    directory = weightless_copy(tmp_path)
    args = ["--model-name-or-path", str(directory), "--from-scratch", "false"]
    if case == "no config.json":
        (directory / "config.json").unlink()
    if case == "broken tokenizer":
        (directory / "model.safetensors").write_bytes(b"")  # only its presence is checked before loading
        (directory / "tokenizer.json").write_text("{not json")
        args += ["--tokenizer-name-or-path", str(directory)]
    config = load_config(args, environ={}, dotenv_path="/nonexistent")
    with pytest.raises(ConfigError, match=message) as err:
        check_sources(config)
    assert "\n" not in str(err.value)
    # from scratch, a weightless directory is what it needs
    if case == "no weights":
        check_sources(dataclasses.replace(config, from_scratch=True))


@pytest.mark.parametrize("nproc", [1, 2])
def test_train_on_a_weightless_model_stops_before_any_process_group(nproc: int, tmp_path: Path) -> None:
    """The issue's command: the bert-base preset pointed at the tiny model's directory (no weights)."""
    launcher = [sys.executable, "-m", "distqa.train"]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                    "-m", "distqa.train"]
    result = subprocess.run([*launcher, "--preset", "bert-base", "--model-name-or-path", "data/tiny-bert",
                             "--output-dir", str(tmp_path)], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "configuration error" in line]
    # Each rank finds it before any process group; torchrun ends the other ranks as soon as one has failed, so a
    # rank slower to get there (a busy machine) may be ended before it says it: one line per rank at most.
    assert 1 <= len(errors) <= nproc and len(set(errors)) == 1, result.stderr
    assert "data/tiny-bert" in errors[0] and "--from-scratch true" in errors[0]
    assert "Traceback" not in result.stderr or nproc > 1  # torchrun prints its own summary of failed ranks
    assert not any(tmp_path.iterdir())  # no run directory: it stopped before the runtime started
