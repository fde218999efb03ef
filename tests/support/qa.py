"""What the QA tasks' tests share (tests/qa/, template.toml's part qa): their small run configurations and the tiny
encoders of every family (the ``tiny_encoder`` fixture of tests/qa/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from distqa.encoders.tiny import build_family_dir

from support.repo import REPO_ROOT

# The QA tasks' own end-to-end tests: a configuration small enough for a 2-core machine, every code path real.
# QA_ARGS are settings every built-in (QA) task has; FAST_ARGS adds the DummyDataset's size (the default task's).
QA_ARGS = [
    "--preset", "none", "--max-seq-len", "64", "--max-question-len", "16",
    "--progress-bar", "false", "--tensorboard", "false", "--log-every", "1", "--warmup-steps", "2",
]
FAST_ARGS = [*QA_ARGS, "--dummy-size", "256"]


@dataclass(frozen=True)
class TinyEncoder:
    """A tiny model directory of one encoder family (tokenizer trained here, the family's config, no weights)."""

    family: str
    directory: Path
    tokenizer: PreTrainedTokenizerBase


_TINY_ENCODERS: dict[str, TinyEncoder] = {}


def tiny_encoder_of(family: str, tmp_path_factory: pytest.TempPathFactory) -> TinyEncoder:
    """The tiny model directory of ``family`` (``distqa.encoders.tiny``), built once per session (a second or two
    each) and shared by every test that asks for it: the ``tiny_encoder`` fixture's (tests/qa/conftest.py), or a test
    that needs every family at once (tests/qa/test_export.py)."""
    if family not in _TINY_ENCODERS:
        directory = build_family_dir(family, REPO_ROOT / "data" / "tokenizer-corpus.txt",
                                     tmp_path_factory.mktemp(family))
        _TINY_ENCODERS[family] = TinyEncoder(family, directory, AutoTokenizer.from_pretrained(directory))
    return _TINY_ENCODERS[family]
