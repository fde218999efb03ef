"""The speed settings change speed, not results: trimmed padding, the attention kernel, compile (compile's default
and mode: tests/unit/test_compile.py; a grown global batch: tests/distributed/test_training.py).

Their measured effect is judged by bench/optimizations.py and bench/ddp_overhead.py, never here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.collate import LENGTH_MULTIPLE, SEQUENCE_COLUMNS, collate_for, collate_trimmed
from distqa.qa.model import build_model, forward, qa_loss
from distqa.qa.nq.cache import NQWindows
from distqa.qa.nq.prepared import prepare_nq
from distqa.tasks import make_task

from support.compare import final_weights, max_difference
from support.qa import FAST_ARGS, QA_ARGS
from support.runs import run_training

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def load(*flags: str):
    return load_config(["--dropout", "0", *flags], environ={}, dotenv_path="/nonexistent")


@pytest.fixture(scope="module")
def nq_windows(tmp_path_factory: pytest.TempPathFactory) -> NQWindows:
    """The NQ sample's training windows (tiny-cpu window settings): long documents, so most windows are
    full and the last one of each document is short."""
    config = load("--task", "nq", "--nq-cache-dir", str(tmp_path_factory.mktemp("cache")), "--num-proc", "1")
    return NQWindows(prepare_nq(config, load_tokenizer(config), progress=False), "train")


def test_a_batch_is_cut_after_its_longest_window_rounded_up_to_a_multiple_of_8(nq_windows: NQWindows) -> None:
    lengths = [int(nq_windows[i]["attention_mask"].sum()) for i in range(len(nq_windows))]
    short = [i for i, n in enumerate(lengths) if n < 100]
    full = next(i for i, n in enumerate(lengths) if n == 128)
    assert len(short) >= 4, "the sample should hold short windows"
    items = [nq_windows[i] for i in short[:4]]
    batch, padded = collate_trimmed(items), default_collate(items)
    longest = max(lengths[i] for i in short[:4])
    assert batch["input_ids"].shape[1] == -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE < 128
    for name in SEQUENCE_COLUMNS:  # only padding is cut, and the columns stay aligned
        kept = batch[name].shape[1]
        assert torch.equal(batch[name], padded[name][:, :kept])
        assert padded["attention_mask"][:, kept:].sum() == 0
    for name in ("start_positions", "end_positions", "answer_type"):
        assert torch.equal(batch[name], padded[name])
    assert (batch["end_positions"] < batch["input_ids"].shape[1]).all()
    # A batch holding one full window keeps every position.
    assert collate_trimmed([*items, nq_windows[full]])["input_ids"].shape[1] == 128
    assert collate_for(False) is default_collate


def test_trimmed_batches_give_the_padded_batches_logits_and_loss(nq_windows: NQWindows) -> None:
    config = load()
    torch.manual_seed(0)
    model = build_model(config).eval()
    lengths = [int(nq_windows[i]["attention_mask"].sum()) for i in range(len(nq_windows))]
    items = [nq_windows[i] for i in sorted(range(len(lengths)), key=lengths.__getitem__)[:8]]
    trimmed, padded = collate_trimmed(items), default_collate(items)
    kept = trimmed["input_ids"].shape[1]
    assert kept < 128
    with torch.no_grad():
        short, full = forward(model, trimmed), forward(model, padded)
    mask = trimmed["attention_mask"].bool()
    for name in ("start_logits", "end_logits"):
        torch.testing.assert_close(getattr(short, name)[mask], getattr(full, name)[:, :kept][mask],
                                   rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(short.answer_type_logits, full.answer_type_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(qa_loss(short, trimmed), qa_loss(full, padded), rtol=1e-5, atol=1e-6)


def test_the_attention_kernel_is_the_one_asked_for_and_sdpa_equals_eager() -> None:
    models, outputs = {}, {}
    dataset = make_task(load()).train_dataset()
    batch = default_collate([dataset[i] for i in range(4)])
    for kernel in ("sdpa", "eager"):
        torch.manual_seed(0)
        models[kernel] = build_model(load("--attn-implementation", kernel)).eval()
        assert models[kernel].encoder.config._attn_implementation == kernel
        with torch.no_grad():
            outputs[kernel] = forward(models[kernel], batch)
    for a, b in zip(outputs["sdpa"], outputs["eager"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match=r"attn_implementation: invalid value 'flash' .*choose one of"):
        load("--attn-implementation", "flash")


@pytest.mark.parametrize(("flags", "named"), [((), "trim_padding"), (("--trim-padding", "false", "--unpad", "true"),
                                                                     "unpad")])
def test_cuda_graphs_with_a_length_per_batch_are_refused_in_one_line(flags: tuple[str, ...], named: str) -> None:
    with pytest.raises(ConfigError, match=rf"reduce-overhead records CUDA graphs .*{named} gives each batch .*"
                                          r"--trim-padding false --unpad false"):
        load("--compile-mode", "reduce-overhead", *flags)


@pytest.mark.slow
@pytest.mark.distributed
def test_compiled_ddp_training_with_accumulation_ends_with_the_eager_weights(tmp_path: Path) -> None:
    """2 gloo ranks × 2 accumulation steps (no_sync inside the compiled DDP module), trimmed batches of
    varying length (the NQ sample: one dynamic-shape graph), compiled vs eager: the same weights up to
    the float rounding of fused kernels; the compile time logged apart."""
    common = [*QA_ARGS, "--output-dir", str(tmp_path), "--max-seq-len", "128", "--max-question-len", "32",
              "--task", "nq", "--nq-cache-dir", str(tmp_path / "cache"), "--global-batch-size", "16",
              "--per-rank-batch-size", "4", "--max-steps", "4", "--checkpoint-every", "0", "--dropout", "0",
              "--max-grad-norm", "0", "--eval-every", "0", "--validation-fraction", "0"]
    config = load_config(common, environ={}, dotenv_path="/nonexistent")  # the cache both runs read, built here
    prepare_nq(config, load_tokenizer(config), progress=False)  # (2 ranks need it built before they start)
    run_training([*common, "--run-name", "eager", "--compile", "false"], nproc=2)
    compiled = run_training([*common, "--run-name", "compiled", "--compile", "true"], nproc=2, timeout=400)
    compile_line = re.search(r"torch\.compile: the first step took ([\d.]+) s", compiled.stdout + compiled.stderr)
    assert compile_line, "the compile time is not logged"
    eager, with_compile = final_weights(tmp_path / "eager"), final_weights(tmp_path / "compiled")
    assert max_difference(eager, with_compile) < 1e-4
    assert json.loads((tmp_path / "compiled" / "config.json").read_text())["compile"] is True


@pytest.mark.distributed
def test_activation_checkpointing_under_ddp_with_accumulation_ends_with_the_weights_of_a_run_without(
        tmp_path: Path) -> None:
    """2 gloo ranks × 2 accumulation steps, dropout on: the recomputed layers replay their dropout masks, so the
    run with activation checkpointing ends where the run without it does (to 1e-5)."""
    common = [*FAST_ARGS, "--output-dir", str(tmp_path), "--global-batch-size", "16", "--per-rank-batch-size", "4",
              "--max-steps", "4", "--checkpoint-every", "0", "--dropout", "0.1"]
    run_training([*common, "--run-name", "stored"], nproc=2)
    run_training([*common, "--run-name", "recomputed", "--activation-checkpointing", "true"], nproc=2)
    assert max_difference(final_weights(tmp_path / "stored"), final_weights(tmp_path / "recomputed")) < 1e-5


@pytest.mark.slow
def test_activation_checkpointing_compiled_gives_the_eager_gradients() -> None:
    """torch.compile over the checkpointed encoder (one process): the same loss and gradients as eager, to float
    rounding, and the layers really are checkpointed."""
    config = load("--activation-checkpointing", "true", "--dropout", "0")
    torch.manual_seed(0)
    model = build_model(config)
    assert model.encoder.is_activation_checkpointing
    inputs = {"input_ids": torch.randint(5, 200, (4, 48)), "attention_mask": torch.ones(4, 48, dtype=torch.long)}

    def gradients(module: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        output = module(**inputs)
        loss = output.start_logits.logsumexp(-1).mean() + output.answer_type_logits.square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model.train()
    eager_loss, eager = gradients(model)
    compiled_loss, compiled = gradients(torch.compile(model))
    assert torch.allclose(eager_loss, compiled_loss, atol=1e-5) and len(eager) == len(compiled)
    assert max((a - b).abs().max().item() for a, b in zip(eager, compiled, strict=True)) < 1e-4


def test_activation_checkpointing_on_an_encoder_without_it_is_refused_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers  # only here: the class whose support this test takes away

    monkeypatch.setattr(transformers.BertModel, "supports_gradient_checkpointing", False)
    with pytest.raises(ConfigError, match=r"activation_checkpointing: transformers' BertModel cannot recompute"):
        build_model(load("--activation-checkpointing", "true"))
