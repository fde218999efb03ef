"""``--unpad``: the encoder runs on the windows' real tokens only (distqa.encoders.varlen) and gives the padded
model's logits, loss and gradients; DeBERTa, whose attention cannot take variable-length windows, is refused.

On CPU the attention is the per-window SDPA fallback of the varlen kernel (the same block-diagonal attention); the
kernel itself runs in bench/gpu_packing.py on a GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from distqa.checkpoint.format import ModelCheckpoint, Progress
from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.encoders.varlen import VARLEN_ATTENTION
from distqa.qa.config import QAConfig
from distqa.qa.hf_format import export_model
from distqa.qa.model import QAModel, build_model, qa_loss
from distqa.record.rundir import versions
from distqa.tasks import make_task

from support.qa import FAST_ARGS, QA_ARGS, TinyEncoder
from support.runs import run_training

pytestmark = pytest.mark.usefixtures("no_torchrun_env")

TOLERANCE = 1e-5


def load(*flags: str) -> QAConfig:
    return load_config([*QA_ARGS, "--dropout", "0", *flags], environ={}, dotenv_path=os.devnull)


def models(*flags: str) -> tuple[QAModel, QAModel]:
    """The padded model and the unpadded one with the same weights (dropout off)."""
    torch.manual_seed(0)
    padded = build_model(load(*flags))
    unpadded = build_model(load(*flags, "--unpad", "true"))
    unpadded.load_state_dict(padded.state_dict())
    return padded, unpadded


def windows(config: QAConfig, count: int = 8) -> dict[str, torch.Tensor]:
    """``count`` DummyDataset windows, stacked at max_seq_len: about a third of them end early."""
    dataset = make_task(config).train_dataset()
    items = [dataset[index] for index in range(count)]
    return {name: torch.stack([item[name] for item in items]) for name in items[0]}


def row_lengths(encoder: torch.nn.Module) -> list[tuple[int, ...]]:
    """Records the shape of every ``input_ids`` the encoder's embeddings see."""
    shapes: list[tuple[int, ...]] = []
    encoder.embeddings.register_forward_hook(lambda _module, args, kwargs, _output: shapes.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return shapes


def test_the_unpadded_model_gives_the_padded_logits_loss_and_gradients() -> None:
    padded, unpadded = models()
    batch = windows(load())
    lengths = batch["attention_mask"].sum(dim=1)
    assert len(set(lengths.tolist())) > 2 and lengths.min() < batch["attention_mask"].shape[1]  # windows differ
    assert unpadded.encoder.config._attn_implementation == VARLEN_ATTENTION
    seen = row_lengths(unpadded.encoder)

    outputs, losses = [], []
    for model in (padded, unpadded):
        model.zero_grad()
        output = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = qa_loss(output, batch)
        loss.backward()
        outputs.append(output)
        losses.append(loss)

    assert seen == [(1, int(lengths.sum()))]  # one row of the real tokens, no padding
    real = batch["attention_mask"].bool()
    for padded_logits, unpadded_logits in zip(outputs[0][:2], outputs[1][:2], strict=True):
        torch.testing.assert_close(unpadded_logits[real], padded_logits[real], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(outputs[1].answer_type_logits, outputs[0].answer_type_logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(losses[1], losses[0], atol=TOLERANCE, rtol=0)
    gradients = dict(padded.named_parameters())
    for name, parameter in unpadded.named_parameters():
        torch.testing.assert_close(parameter.grad, gradients[name].grad, atol=TOLERANCE, rtol=1e-4,
                                   msg=lambda message, name=name: f"{name}: {message}")


def test_a_batch_without_padding_runs_as_it_is() -> None:
    padded, unpadded = models()
    batch = windows(load())
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])  # every position a token
    seen = row_lengths(unpadded.encoder)
    with torch.no_grad():
        expected = padded(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        output = unpadded(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert seen == [tuple(batch["input_ids"].shape)]  # no gathering when there is nothing to drop
    for got, want in zip(output, expected, strict=True):
        torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)


def test_every_encoder_family_unpads_to_its_padded_logits_or_is_refused(tiny_encoder: TinyEncoder) -> None:
    """RoBERTa numbers positions from its padding id + 1, ModernBERT's local layers see a sliding window, DistilBERT
    takes no token types: each gives its padded logits. DeBERTa's attention has its own kernel: one ConfigError."""
    flags = ("--model-name-or-path", str(tiny_encoder.directory))
    if tiny_encoder.family == "deberta-v3":
        with pytest.raises(ConfigError, match=r"^unpad: transformers' DebertaV2Model .*--unpad false"):
            build_model(load(*flags, "--unpad", "true"))
        return
    padded, unpadded = (model.eval() for model in models(*flags))
    batch = windows(load(*flags))
    real = batch["attention_mask"].bool()
    assert not real.all()
    with torch.no_grad():
        expected = padded(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        output = unpadded(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    for got, want in zip(output[:2], expected[:2], strict=True):
        torch.testing.assert_close(got[real], want[real], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(output.answer_type_logits, expected.answer_type_logits, atol=TOLERANCE, rtol=0)


def test_attention_dropout_is_off_and_hidden_dropout_stays() -> None:
    encoder = build_model(load_config([*QA_ARGS, "--unpad", "true"], environ={}, dotenv_path=os.devnull)).encoder
    assert encoder.config.attention_probs_dropout_prob == 0
    assert encoder.config.hidden_dropout_prob > 0  # the tiny BERT's own 0.1


def test_an_unpadded_model_exports_as_a_plain_transformers_model(tmp_path: Path) -> None:
    """The export is read by transformers alone: its config keeps the encoder's attention dropout (which
    ``--unpad`` turns off in training) and names no distqa attention."""
    config = load_config([*QA_ARGS, "--unpad", "true"], environ={}, dotenv_path=os.devnull)
    model = build_model(config)
    assert model.encoder.config.attention_probs_dropout_prob == 0
    checkpoint = ModelCheckpoint(model=model.state_dict(), config=config.to_dict(), task_state={}, evaluation=None,
                                 progress=Progress(step=1), versions=versions())
    exported = json.loads((export_model(checkpoint, tmp_path / "model") / "config.json").read_text())
    assert exported["attention_probs_dropout_prob"] == 0.1  # data/tiny-bert's own
    assert VARLEN_ATTENTION not in json.dumps(exported)


def test_a_training_run_with_unpad(tmp_path: Path) -> None:
    """``python -m distqa.train --unpad true`` on the dummy task: the encoder runs unpadded, the run ends."""
    result = run_training([*FAST_ARGS, "--unpad", "true", "--max-steps", "2", "--global-batch-size", "8",
                           "--per-rank-batch-size", "8", "--output-dir", str(tmp_path), "--run-name", "unpad"])
    log = result.stdout + result.stderr
    assert f"unpad: the encoder runs on the windows' real tokens only (attention '{VARLEN_ATTENTION}'" in log
    assert "training finished at step 2" in log
