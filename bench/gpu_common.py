"""What the parts of bench/gpu.sh share: the model they build, the device they run on, the JSON they write.

No GPU machine reaches a model hub, and throughput needs no pretrained weights: the model is a BERT of
bert-base-uncased's sizes (:data:`BERT_SIZES`), or one of the large encoders of the presets
(:data:`LARGE_ENCODERS`), written as a ``config.json`` into a temporary directory and built with random
weights (``from_scratch``), with the offline tokenizer of ``data/tiny-bert`` (its ids all fall inside every
one of these vocabularies). On CPU (``--device cpu``, the smoke run of the tests) the model is the tiny BERT
of ``data/tiny-bert`` itself, or a tiny encoder of the same family: a large one on two cores would take
minutes per step.

Each part writes one JSON file (``--json``); ``bench/gpu_report.py`` prints them as one table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from harness import pin_threads
from transformers import BertConfig, DebertaV2Config, PretrainedConfig, RobertaConfig
from transformers.utils import logging as hf_logging

from distqa.checkpoint.files import write_json
from distqa.encoders.config import TINY_MODEL_DIR

BERT_SIZES: dict[str, dict[str, int]] = {
    "bert-base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                  "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512},
    "bert-large": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                   "intermediate_size": 4096, "vocab_size": 30522, "max_position_embeddings": 512},
}
"""bert-base-uncased's and bert-large-uncased's sizes (their hub config.json files); the rest is BertConfig's
defaults, which are theirs (GELU, type vocabulary 2, LayerNorm eps 1e-12)."""

LARGE_ENCODERS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "bert-large": (BertConfig, BERT_SIZES["bert-large"]),
    "roberta-large": (RobertaConfig, {
        "num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096,
        "vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}),
    "deberta-v3-large": (DebertaV2Config, {
        "num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096,
        "vocab_size": 128100, "max_position_embeddings": 512, "type_vocab_size": 0, "layer_norm_eps": 1e-7,
        "relative_attention": True, "max_relative_positions": -1, "position_buckets": 256,
        "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
        "position_biased_input": False, "pad_token_id": 0}),
}
"""The encoders of the large presets, by the preset's model (bert-large-uncased, roberta-large,
microsoft/deberta-v3-large): the config class and the sizes of each hub config.json; the rest is the
class's defaults, which are theirs (GELU, dropout 0.1)."""

MODELS = ("bert-base", "tiny")


TINY_SIZES = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512,
              "vocab_size": 1268, "position_buckets": 32}
"""What ``tiny=True`` replaces in a config: a model of the same family that steps in milliseconds on CPU
(data/tiny-bert's sizes; DeBERTa keeps 32 relative-position buckets, fewer than a smoke run's tokens)."""


def encoder_config(name: str, tiny: bool = False) -> PretrainedConfig:
    """The config of ``name`` (a key of :data:`BERT_SIZES` or :data:`LARGE_ENCODERS`), with random weights to come;
    ``tiny``: the same family at :data:`TINY_SIZES`."""
    config_class, sizes = LARGE_ENCODERS.get(name) or (BertConfig, BERT_SIZES[name])
    if tiny:
        sizes = sizes | {key: value for key, value in TINY_SIZES.items() if key in sizes}
    return config_class(**sizes)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--model`` and ``--json``, the same in every part of bench/gpu.sh."""
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (the real figures) or cpu (a smoke run of the script with the tiny model)")
    parser.add_argument("--model", choices=MODELS, default=None,
                        help="bert-base (random weights, default on cuda) or tiny (data/tiny-bert, default on cpu)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here for bench/gpu_report.py")


def start_training_part(args: argparse.Namespace) -> torch.device:
    """What every part that trains does first: its torch threads (``--threads``), the device checked, the libraries'
    notices that say nothing here silenced, and fp32 matrix products as distqa.train sets them (TF32 where fp32
    remains). Returns the device."""
    pin_threads(args.threads)
    device = check_device(args.device)
    hf_logging.set_verbosity_error()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="torch.utils.data")  # pin_memory without an accelerator
    torch.set_float32_matmul_precision("high")
    return device


def check_device(device: str) -> torch.device:
    """The device of the run; one line naming the fix when CUDA was asked for and is not there."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA GPU (torch.cuda.is_available() is false); run on a "
                         "GPU machine, or pass --device cpu for a smoke run with the tiny model")
    return torch.device(device)


def model_name(args: argparse.Namespace) -> str:
    return args.model or ("bert-base" if args.device == "cuda" else "tiny")


@contextlib.contextmanager
def model_flags(name: str, tiny: bool = False) -> Iterator[list[str]]:
    """Flags of ``distqa.train`` (and of :func:`harness.bench_config`) that select model ``name`` (``tiny``: its
    family at :data:`TINY_SIZES`) with random weights and the offline tokenizer; a config of these sizes lives in
    a temporary directory for the block."""
    tokenizer = ["--tokenizer-name-or-path", str(TINY_MODEL_DIR), "--from-scratch", "true"]
    if name == "tiny":
        yield ["--model-name-or-path", str(TINY_MODEL_DIR), *tokenizer]
        return
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as directory:
        encoder_config(name, tiny).save_pretrained(directory)
        yield ["--model-name-or-path", str(directory), *tokenizer]


def device_name(device: torch.device) -> str:
    """What the figures ran on: the CUDA device name (what distqa.record.throughput's peak table matches), or
    the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    return f"CPU: {model}"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after it counts the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


@dataclass(kw_only=True)
class Measured:
    """The measured figures of one row of a part (medians over the repeats; None until measured), which
    bench/gpu_report.py prints; each part's row adds what it varies (gpu_bert.py's Row, gpu_large.py's
    LargeRow)."""

    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    warmup_s: float | None = None
    note: str = ""
    repeats: list[float] = field(default_factory=list)
    """samples/s of every repeat."""


def peak_memory_gib(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` since the last :func:`reset_peak_memory`, in GiB; None on CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def write_part(path: Path | None, part: str, device: torch.device, **figures: Any) -> None:
    """One part's figures as JSON (for bench/gpu_report.py), or printed when no path is given."""
    record = {"part": part, "device": device_name(device), "device_type": device.type,
              "torch": torch.__version__, "cuda": torch.version.cuda, **figures}
    if path is None:
        print(json.dumps(record, indent=2))
    else:
        write_json(path, record)


def first_line(err: BaseException) -> str:
    """An exception as one line: what a failed contender's row shows."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]
