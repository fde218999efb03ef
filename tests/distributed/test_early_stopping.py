"""``--early-stopping-patience K`` on 2 ranks (the example fork's task, scored by accuracy): the run ends after K
evaluations in a row without improvement, on both ranks at the same step, with a checkpoint and exit 0, and says
why; a run interrupted after one such evaluation and resumed stops at the same step, with the same weights."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from support.compare import final_weights, max_difference
from support.repo import REPO_ROOT
from support.runs import run_training

PRESET = str(REPO_ROOT / "examples" / "text_classification" / "preset.toml")
ARGS = ["--preset", PRESET, "--max-steps", "400", "--eval-every", "5", "--checkpoint-every", "5",
        "--log-every", "50", "--early-stopping-patience", "3", "--progress-bar", "false", "--tensorboard", "false"]
EVALUATION = re.compile(r"eval at step (\d+): accuracy ([\d.]+)")
STOPPED = re.compile(r"early stopping at step (\d+): 3 evaluations without an improvement of accuracy by more than 0 "
                     r"\(best ([\d.]+)\)")


def rank_logs(run_dir: Path) -> list[str]:
    return [(run_dir / "logs" / f"rank-{rank}.log").read_text() for rank in (0, 1)]


def test_two_ranks_stop_together_after_the_patience_and_a_resume_stops_at_the_same_step(tmp_path: Path) -> None:
    run_training([*ARGS, "--output-dir", str(tmp_path), "--run-name", "whole"], nproc=2)
    logs = rank_logs(tmp_path / "whole")
    stopped = [STOPPED.search(log) for log in logs]
    assert all(stopped), logs[0][-3000:]
    stop_step = int(stopped[0].group(1))
    assert [int(m.group(1)) for m in stopped] == [stop_step, stop_step], "both ranks stop at the same step"
    assert stop_step < 400
    # The evaluations (rank 0 logs them) that led there: the last 3 beat no best before them.
    evaluations = [(int(step), float(value)) for step, value in EVALUATION.findall(logs[0])]
    assert evaluations[-1][0] == stop_step
    best_before = max(value for _, value in evaluations[:-3])
    assert all(value <= best_before for _, value in evaluations[-3:])
    assert float(stopped[0].group(2)) == best_before
    checkpoint = torch.load(tmp_path / "whole" / "checkpoints" / f"step-{stop_step:08d}.pt", weights_only=True)
    assert checkpoint["progress"]["evaluations_without_improvement"] == 3

    # Interrupted after the first evaluation without improvement, as after a kill before the next checkpoint: the
    # same run directory with the checkpoints after it taken away (keep_checkpoints 3 leaves it the newest of the
    # three kept), then resumed: the count comes back with the checkpoint.
    whole = final_weights(tmp_path / "whole")
    first_miss = evaluations[-3][0]
    assert first_miss < stop_step
    for newer in (tmp_path / "whole" / "checkpoints").glob("step-*.pt*"):
        if int(newer.name.split(".")[0].removeprefix("step-")) > first_miss:
            newer.unlink()
    assert max(int(p.stem.removeprefix("step-")) for p in (tmp_path / "whole" / "checkpoints").glob("step-*.pt")) \
        == first_miss
    resumed = run_training([*ARGS, "--output-dir", str(tmp_path), "--run-name", "whole"], nproc=2)
    assert f"resumed from {tmp_path / 'whole' / 'checkpoints' / f'step-{first_miss:08d}.pt'}" in resumed.stderr
    # The rank logs are appended to: the first run's stop, then the resumed run's, at the same step on both ranks.
    assert [[int(step) for step, _ in STOPPED.findall(log)] for log in rank_logs(tmp_path / "whole")] == \
        [[stop_step, stop_step], [stop_step, stop_step]]
    assert max_difference(final_weights(tmp_path / "whole"), whole) < 1e-6

    # Once stopped, a relaunch (--resume auto) does not train on.
    again = run_training([*ARGS, "--output-dir", str(tmp_path), "--run-name", "whole"], nproc=2)
    assert f"already at step {stop_step}, where early stopping ended the run: nothing to do" in again.stderr
