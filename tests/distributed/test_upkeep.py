"""A fork made with `make new-fork` and updated with `make update-template` still trains (docs/FORKING.md): on the
synthetic upstream of tests/support/upkeep.py (this checkout as commit A, a fork of it without the QA tasks, Slurm
and the notebooks, the template moved on to B), the updated fork's own test trains its task on 2 emulated nodes
through a lost node and a resume to the uninterrupted weights, and its commands need nothing of the QA package."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.upkeep import (
    NAME,
    in_fork,
    template_only,
    upstream_and_fork_fixture,  # noqa: F401  (the fixture `upstream_and_fork`)
)


@pytest.mark.slow
@template_only
def test_the_updated_forks_own_test_trains_its_task_through_a_lost_node_to_the_uninterrupted_weights(
        upstream_and_fork, tmp_path: Path) -> None:
    """The fork's tests/test_mytask.py (written by make new-fork), run by pytest in the fork as its `make test`
    would: its stub task on 2 emulated nodes, node 1 lost after step 30, the same command again, the weights of an
    uninterrupted run. Then the fork's commands need nothing of the QA package: the doctor passes with its task,
    and predict, a QA-only command, refuses its checkpoint in one line."""
    _, fork, _, _ = upstream_and_fork
    own = in_fork(fork, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "pytest"),
                  f"tests/test_{NAME}.py", timeout=900)
    assert own.returncode == 0, own.stdout[-5000:] + own.stderr[-3000:]
    assert "1 passed" in own.stdout
    assert in_fork(fork, "-c", "import importlib.util; print(importlib.util.find_spec('distqa.qa'))").stdout == "None\n"
    doctor = in_fork(fork, "-m", "distqa.doctor", "--preset", f"configs/{NAME}.toml")
    assert doctor.returncode == 0 and "doctor: all checks passed on 1 rank(s)" in doctor.stdout + doctor.stderr
    best = next((tmp_path / "pytest").rglob("killed/checkpoints/best.pt"))
    predict = in_fork(fork, "-m", "distqa.predict", "--checkpoint", str(best), "--input", f"data/{NAME}/reviews.tsv",
                      "--output", str(tmp_path / "predictions.csv"))
    lines = predict.stderr.strip().splitlines()
    assert predict.returncode == 2 and len(lines) == 1 and "distqa.predict" in lines[0] and NAME in lines[0], lines
    assert not (tmp_path / "predictions.csv").exists()
