"""This checkout and the machinery task the tests train: where things are, whether this is a fork, and the
machinery task's arguments and data."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = str(REPO_ROOT / "scripts" / "worker.sh")
IN_A_FORK = (REPO_ROOT / "fork.toml").is_file()
"""This checkout is a fork (make new-fork, docs/FORKING.md): the files a fork owns (README.md, project.toml,
.neuro/project.yml) hold its values, not the template's, and the parts it left out are gone."""

# The machinery's task: tests whose claim is about distribution, faults, launchers, checkpoints, tracking or hangs
# train the example fork's text classifier (examples/text_classification: torch only, a bag of words with dropout,
# an accuracy that keeps best.pt, 960 training texts), not the QA model. Runs take a second or two of training.
MACHINERY_TASK = "examples.text_classification.task:TextClassification"
MACHINERY_ARGS = [
    "--task", MACHINERY_TASK, "--preset", "none",
    "--progress-bar", "false", "--tensorboard", "false", "--log-every", "1", "--warmup-steps", "2",
]
EXAMPLE = REPO_ROOT / "examples" / "text_classification"
EXAMPLE_PRESET = str(EXAMPLE / "preset.toml")
REVIEWS = EXAMPLE / "reviews.tsv"


def reviews(directory: Path, lines: int) -> list[str]:
    """``--data-file`` for the machinery task's first ``lines`` reviews, written under ``directory``: with
    ``validation_fraction`` 0.2, 80 lines leave 64 training texts (an epoch in a few steps)."""
    path = directory / f"reviews-{lines}.tsv"
    path.write_text("".join(REVIEWS.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]), encoding="utf-8")
    return ["--data-file", str(path)]
