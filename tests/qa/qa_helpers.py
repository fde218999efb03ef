"""What the QA tasks' tests share (tests/qa/, template.toml's part qa): their small run configurations."""

from __future__ import annotations

# The QA tasks' own end-to-end tests: a configuration small enough for a 2-core machine, every code path real.
# QA_ARGS are settings every built-in (QA) task has; FAST_ARGS adds the DummyDataset's size (the default task's).
QA_ARGS = [
    "--preset", "none", "--max-seq-len", "64", "--max-question-len", "16",
    "--progress-bar", "false", "--tensorboard", "false", "--log-every", "1", "--warmup-steps", "2",
]
FAST_ARGS = [*QA_ARGS, "--dummy-size", "256"]
