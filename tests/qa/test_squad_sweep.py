"""A sweep on 2 emulated nodes per trial, with the tiny model on the learnable synthetic SQuAD data: one sweep run,
checked by several tests (module-scoped).

The sweep is ``configs/sweeps/demo.toml`` (``make sweep-demo``) searched by TPE instead of its grid: the learning
rate from 3e-3 (it learns) and two values far too small (1e-7, 3e-8), each point with seeds 1 and 2 (6 trials), 40
steps each, evaluated every 10, pruned by the median rule once 2 trials completed; the sampler seed is one whose
stream draws the good rate first, then each small one. It is stopped by SIGTERM in the middle of trial-001 (asked
for at its step 16 by the trial's own rank 0, so no clock decides where) and run again with the same command, which
draws trials 2 to 5 anew: they continue the sampler's stream (a sampler built afresh drew trial 0's point again).
Then the best trial's settings (and the interrupted trial's, when another) train once more, standalone, through
the command the sweep prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from distqa.sweeps import study as studies
from distqa.sweeps.runner import settings_class
from distqa.sweeps.space import read_sweep

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port
from support.repo import REPO_ROOT
from support.runs import AT_STEP
from support.shared_runs import once_per_session

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DEMO = tomllib.loads((REPO_ROOT / "configs" / "sweeps" / "demo.toml").read_text())
STEPS, EVAL_EVERY = DEMO["fixed"]["max_steps"], DEMO["fixed"]["eval_every"]
GOOD, *TOO_SMALL = DEMO["space"]["lr"]
TPE = (REPO_ROOT / "configs" / "sweeps" / "demo.toml").read_text().replace(
    'search = "grid"', 'search = "tpe"\ntrials = 6\nsampler_seed = 11')


def run(command: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The sweep, stopped and resumed, once per test session (support.shared_runs.once_per_session): worksteal may hand
    this module's tests to two xdist workers."""
    root, record = once_per_session(tmp_path_factory, "squad-sweep", run_the_sweep)
    outcome = {name: SimpleNamespace(**result) for name, result in record.items()}
    sweep_dir = root / "sweep"
    records = {r.number: r for r in studies.records(studies.load_study(sweep_dir), running_now=False)}
    return {**outcome, "records": records, "dir": sweep_dir, "root": root}


def run_the_sweep(root: Path) -> dict[str, dict[str, Any]]:
    """Stop the demo sweep in trial-001 and run the same command again; each command's exit status and output."""
    data, cache, sweep_dir = root / "data", root / "cache", root / "sweep"
    for name, seed, articles in (("train", 0, 300), ("dev", 1, 40)):
        subprocess.run([sys.executable, "-m", "distqa.qa.squad.synthetic", "--output", str(data / f"{name}.json"),
                        "--articles", str(articles), "--seed", str(seed), "--facts", "1", "--plausible", "0",
                        "--filler-words", "10"], check=True, capture_output=True, timeout=120)
    data_args = ["--squad-train-file", str(data / "train.json"), "--squad-validation-file", str(data / "dev.json"),
                 "--squad-cache-dir", str(cache)]
    # The trials run an entry module that stops the sweep from trial-001's step 16 (support.runs.AT_STEP), and so skip
    # the local launcher's prepare: the cache is built here, once, as the launcher would.
    subprocess.run([sys.executable, "-m", "distqa.prepare", "--preset", "tiny-synthetic-squad", *data_args],
                   cwd=REPO_ROOT, env=clean_env(), check=True, capture_output=True, timeout=300)
    (root / "at_step.py").write_text(AT_STEP)
    (root / "demo-tpe.toml").write_text(TPE)
    command = [sys.executable, "-m", "distqa.sweep", str(root / "demo-tpe.toml"), "--sweep-dir", str(sweep_dir),
               "--launcher-args", "--entry-module at_step", "--", *data_args]
    # at_step.py's folder first on the path, before the caller's (a checkout's src/ ahead of an installed one's).
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = clean_env(PYTHONPATH=path, AT_STEP="15", AT_RUN="trial-001", SIGNAL="SIGTERM", AT_WAIT_STOP="1",
                    ACTED_FILE=str(root / "acted"))
    show = [sys.executable, "-m", "distqa.sweep", "--show", str(sweep_dir)]
    # The sweep's own pid is the target: exec keeps the shell's ($$).
    runs = {"stopped": run(["bash", "-c", f'export TARGET_PID=$$; exec {shlex.join(command)}'], env, timeout=900),
            "shown": run(show, env, timeout=120),
            "resumed": run(command, env, timeout=900),  # the same command again
            "again": run(show, env, timeout=120)}
    return {name: {"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr} for name, r in runs.items()}


def test_a_stopped_sweep_exits_75_and_the_same_command_resumes_it_running_no_trial_or_point_twice(
        swept: dict, tmp_path: Path) -> None:
    stopped, resumed = swept["stopped"], swept["resumed"]
    assert stopped.returncode == 75, stopped.stderr[-4000:]
    assert "trial-001 stopped with a checkpoint; the same command resumes it" in stopped.stderr
    assert "trial-002" not in stopped.stderr, "no trial starts after the stop"
    interrupted = [line for line in swept["shown"].stdout.splitlines() if line.startswith("trial-001 ")]
    assert interrupted and interrupted[0].split()[-2] == "interrupted", swept["shown"].stdout
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resuming trial-001, interrupted by a stop, from their checkpoints" in resumed.stderr
    assert "trial-000:" not in resumed.stderr, "a finished trial is never run again"
    records = swept["records"]
    assert sorted(records) == list(range(6)), "the trial count is kept"
    # The resumed sweep drew trials 2 to 5 as an uninterrupted one draws them (each draw seeded by the sampler seed and
    # the trials before it), so no point was drawn twice: the space's 3 points, each with both seeds.
    spec = read_sweep(str(swept["root"] / "demo-tpe.toml"), lambda preset, task: settings_class(preset, task, []))
    study = studies.create_study(tmp_path, spec, {})
    uninterrupted = [t.params["lr"] for t in iter(lambda: studies.next_trial(study, spec), None)]
    assert uninterrupted == [GOOD, GOOD, *(lr for lr in TOO_SMALL for _ in DEMO["seeds"])], \
        "sampler_seed 11 no longer draws the good rate first, then each small one: choose another in TPE above"
    assert [records[n].settings["lr"] for n in range(6)] == uninterrupted
    assert {n: r.launches for n, r in records.items()} == {0: 1, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1}
    log = (swept["dir"] / "trial-001" / "logs" / "rank-0.log").read_text()
    # Asked for at step 16; the ranks agree every stop_check_every (10) steps: at step 20.
    assert "stopped by SIGTERM at step 20" in (swept["dir"] / "trial-001" / "launcher.log").read_text()
    assert re.search(r"resumed from \S+step-00000020.pt at step 20", log), log[-3000:]


def test_the_pruned_trials_are_the_bad_ones_and_pruning_saves_at_least_40_percent_of_the_steps(swept: dict) -> None:
    records = swept["records"]
    assert {n for n, r in records.items() if r.state == "done"} == {n for n, r in records.items()
                                                                    if r.settings["lr"] == GOOD} == {0, 1}
    assert {n for n, r in records.items() if r.state == "pruned"} == {n for n, r in records.items()
                                                                      if r.settings["lr"] in TOO_SMALL}
    for number, record in records.items():
        summary = json.loads((swept["dir"] / studies.trial_dir_name(number) / "summary.json").read_text())
        assert summary["status"] == "FINISHED" and summary["step"] == record.step
        if record.state == "pruned":  # stopped at its first evaluation, behind both completed trials there
            assert summary["pruned_at"] == record.step == EVAL_EVERY
            assert all(record.evaluations[EVAL_EVERY] < records[n].evaluations[EVAL_EVERY] for n in (0, 1))
            assert (swept["dir"] / studies.trial_dir_name(number) / "checkpoints" / "step-00000010.pt").exists()
        else:
            assert record.step == STEPS and summary["pruned_at"] == 0
    # Without pruning no trial stops before max_steps: no early stopping (patience 0), no stop_at_step, and none
    # failed, so each of the 6 trains exactly STEPS steps; that sweep's count needs no second run.
    trained, unpruned = sum(r.step for r in records.values()), len(records) * STEPS
    assert 1 - trained / unpruned >= 0.40, (trained, unpruned)
    table = swept["resumed"].stdout
    assert table.splitlines()[0].split() == ["trial", "lr", "seed", "f1", "step", "state", "time"]
    assert [line.split()[0] for line in table.splitlines()[1:3]] == \
        [studies.trial_dir_name(n) for n in sorted((0, 1), key=lambda n: -records[n].best)]
    assert "6 of 6 trials: 2 done, 4 pruned" in table and (swept["dir"] / "sweep.html").is_file()
    assert swept["again"].stdout == table, "--show prints the table of a finished sweep"


def test_the_best_trial_and_the_interrupted_one_equal_standalone_runs_of_their_settings(swept: dict) -> None:
    records, table = swept["records"], swept["resumed"].stdout
    best = max((r for r in records.values() if r.state == "done"), key=lambda r: r.best)
    assert f"best: trial-{best.number:03d}, f1 {best.best:.4g}: {swept['dir']}/trial-{best.number:03d}/checkpoints" \
           f"/best.pt" in table
    reproduce = shlex.split(table.split("reproduce: ", 1)[1].splitlines()[0])
    assert reproduce[:3] == ["scripts/run_distributed_locally.sh", "--nodes", "2"]
    for record in {best.number: best, 1: records[1]}.values():  # trial-001 was interrupted and resumed
        name = f"alone-{record.number}"
        args = [*reproduce[:3], "--run-id", name, "--", *reproduce[4:-2], "--lr", repr(record.settings["lr"]),
                "--seed", str(record.seed), "--output-dir", str(swept["root"] / "alone")]
        result = run(["bash", *args], clean_env(RDZV_PORT=str(free_port())), timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        alone = json.loads((swept["root"] / "alone" / name / "summary.json").read_text())
        assert alone["best_value"] == record.best, "same settings, same seed: the same metric, exactly"
        trial_dir = swept["dir"] / studies.trial_dir_name(record.number)
        assert max_difference(final_weights(trial_dir), final_weights(swept["root"] / "alone" / name)) <= 1e-6


def test_a_trials_ranks_share_one_config_hash_with_its_settings(swept: dict) -> None:
    """The settings are drawn once, in the sweep, and reach every rank as flags: the preflight of every trial finds
    both ranks on one config, the hash of the config.json that holds the trial's learning rate and seed."""
    for number, record in swept["records"].items():
        trial_dir = swept["dir"] / studies.trial_dir_name(number)
        config = json.loads((trial_dir / "config.json").read_text())
        assert (config["lr"], config["seed"]) == (record.settings["lr"], record.seed)
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
        log = (trial_dir / "logs" / "rank-0.log").read_text()
        agreed = re.findall(r"preflight: 2 ranks on 2 nodes agree on code \w+, config (\w+)", log)
        assert agreed and set(agreed) == {digest}, (number, agreed, digest)
