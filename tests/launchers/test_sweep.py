"""The sweep's own logic, without a trial: the sweep file and its one-line refusals, the flags a trial gets, the
search (a grid in the file's order, seeds, the budget, interrupted trials first), the pruning rule, the record of
each trial's end, the table, the picture, the reason of a failure and the one process per sweep directory.
The sweeps themselves run in tests/qa/test_squad_sweep.py (2 emulated nodes) and tests/distributed/test_platform.py
(trials on the platform's stand-in jobs)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from distqa.config import Config, ConfigError
from distqa.config.sources import load_config
from distqa.sweeps import results, runner
from distqa.sweeps import study as studies
from distqa.sweeps.launch import Launcher, failure_reason
from distqa.sweeps.pruning import TrialPruner, parse_trial
from distqa.sweeps.space import check_trial_configs, flags, read_sweep, trial_args

from support.processes import clean_env, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT

BASE = """
search = "grid"
seeds = [1, 2]
[fixed]
max_steps = 40
[space]
lr = [3e-3, 1e-7]
weight_decay = { low = 0.0, high = 0.1, points = 3 }
"""


def spec_of(tmp_path: Path, text: str = BASE, name: str = "s"):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return read_sweep(str(path), lambda preset, task: Config)


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as err:
        spec_of(tmp_path, text)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_grid_runs_every_point_per_seed_in_the_files_order(tmp_path: Path) -> None:
    spec = spec_of(tmp_path)
    assert spec.trials == 12 and spec.grid_size() == 6
    assert [p["lr"] for p in spec.grid_points()] == [3e-3] * 3 + [1e-7] * 3
    assert [p["weight_decay"] for p in spec.grid_points()][:3] == [0.0, 0.05, 0.1]
    log = spec_of(tmp_path, BASE.replace("{ low = 0.0, high = 0.1, points = 3 }",
                                         "{ low = 1e-4, high = 1e-2, log = true, points = 3 }"))
    assert log.settings[1].grid() == (1e-4, 1e-3, 1e-2)
    study = studies.create_study(tmp_path / "d", spec, {})
    order = [(t.params["lr"], t.params["weight_decay"], t.user_attrs["seed"])
             for t in iter(lambda: studies.next_trial(study, spec), None)]
    assert order[:4] == [(3e-3, 0.0, 1), (3e-3, 0.0, 2), (3e-3, 0.05, 1), (3e-3, 0.05, 2)] and len(order) == 12
    assert studies.next_trial(study, spec) is None, "the budget is spent"


def test_random_search_draws_each_point_once_and_runs_it_with_every_seed_within_the_budget(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, BASE.replace('search = "grid"', 'search = "random"\ntrials = 5'))
    study = studies.create_study(tmp_path / "d", spec, {})
    drawn = [(t.params["lr"], t.params["weight_decay"], t.user_attrs["seed"])
             for t in iter(lambda: studies.next_trial(study, spec), None)]
    assert [seed for *_, seed in drawn] == [1, 2, 1, 2, 1]
    assert drawn[0][:2] == drawn[1][:2] and drawn[2][:2] == drawn[3][:2] and drawn[0][:2] != drawn[2][:2]
    assert all(0.0 <= wd <= 0.1 and lr in (3e-3, 1e-7) for lr, wd, _ in drawn)


@pytest.mark.parametrize("search", ["random", "tpe"])
def test_a_resumed_random_or_tpe_sweep_draws_what_an_uninterrupted_one_draws(tmp_path: Path, search: str) -> None:
    """The issue's case in one process: a log-uniform lr and a list, 6 trials, the sweep stopped while trial 2 runs
    and its study opened again as the same command opens it. The resumed sweep goes on with the sampler's stream
    (each draw seeded by the sampler seed and the trials before it): no point of trials 0-2 is drawn again.
    tests/qa/test_squad_sweep.py stops and resumes a TPE sweep's processes."""
    spec = spec_of(tmp_path, f'search = "{search}"\ntrials = 6\n[space]\nlr = {{ low = 1e-5, high = 1e-2, log = true }}'
                             '\nper_rank_batch_size = [16, 32, 64]\n')

    def draws(directory: Path, stop_during: int | None) -> list[dict]:
        study, drawn = studies.create_study(directory, spec, {}), []
        while (trial := studies.next_trial(study, spec)) is not None:
            drawn.append(trial.params)
            if trial.number == stop_during:  # the same command again: the study from its journal, trial 2 resumed
                study = studies.create_study(directory, spec, {})
                assert [t.number for t in studies.interrupted(study)] == [stop_during]
            study.tell(trial.number, -abs(math.log10(trial.params["lr"]) + 3))  # TPE reads the values so far
        return drawn

    resumed = draws(tmp_path / "resumed", stop_during=2)
    assert resumed == draws(tmp_path / "uninterrupted", stop_during=None) and len(resumed) == 6
    assert len({point["lr"] for point in resumed}) == 6, "no point drawn twice"
    assert draws(tmp_path / "again", stop_during=None) == resumed, "the same sweep file draws the same points"


def test_a_resumed_study_is_the_same_one_and_keeps_its_count(tmp_path: Path) -> None:
    spec = spec_of(tmp_path)
    study = studies.create_study(tmp_path / "d", spec, {})
    first = studies.next_trial(study, spec)
    again = studies.create_study(tmp_path / "d", spec, {})  # the same command, run again
    assert [t.number for t in studies.interrupted(again)] == [first.number]
    assert len(again.get_trials()) == 12, "no grid point enqueued twice"
    other = spec_of(tmp_path, BASE.replace("3e-3", "1e-3"))
    with pytest.raises(ConfigError, match="holds a sweep of another sweep file"):
        studies.create_study(tmp_path / "d", other, {})


@pytest.mark.parametrize(("text", "message"), [
    (BASE.replace("lr = [3e-3, 1e-7]", "lrr = [3e-3]"), "unknown setting 'lrr' for task settings Config; did you "
                                                         "mean 'lr'?"),
    (BASE.replace("lr = [3e-3, 1e-7]", "lr = []"), "[space] lr is an empty list"),
    (BASE.replace("lr = [3e-3, 1e-7]", "lr = { low = 1e-3, high = 1e-3 }"), "the range 0.001..0.001 is empty"),
    (BASE.replace("lr = [3e-3, 1e-7]", "lr = { low = 1e-2, high = 1e-3, points = 3 }"), "is empty"),
    (BASE.replace("{ low = 0.0, high = 0.1, points = 3 }", "{ low = 0.0, high = 0.1, log = true, points = 3 }"),
     "a log range must lie above zero"),
    (BASE.replace("lr = [3e-3, 1e-7]", "lr = ['fast']"), "lr: invalid value 'fast'"),
    (BASE.replace("lr = [3e-3, 1e-7]", "seed = [1, 2]"), "seed cannot be set here: list the seeds in `seeds`"),
    (BASE.replace(", points = 3 ", " "), "a grid needs `points`"),
    ("trials = 13\n" + BASE, "trials = 13, but the grid has 12 trials"),
    (BASE.replace('"grid"', '"annealing"'), "search 'annealing' is none of"),
    (BASE + "[prune]\nrule = 'mean'\n", "[prune] rule 'mean' is none of"),
    (BASE.replace("[fixed]", "[fixed]\nmax_stepz = 3"), "[fixed]: unknown setting 'max_stepz'"),
    ("lr = [1e-3]\n", "unknown key 'lr'"),
])
def test_bad_sweep_files_are_refused_in_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    assert message in refusal(tmp_path, text)


def test_batch_sizes_the_world_size_cannot_split_are_refused_before_any_trial(tmp_path: Path) -> None:
    """A global batch smaller than the world size leaves ranks without an example (one that does not divide evenly is
    trained in uneven shares)."""
    spec = spec_of(tmp_path, BASE.replace("lr = [3e-3, 1e-7]", "global_batch_size = [32, 3]"))
    environ = {"WORLD_SIZE": "4"}
    with pytest.raises(ConfigError) as err:
        check_trial_configs(spec, lambda args: load_config([*MACHINERY_ARGS, *args], environ, dotenv_path="/none"),
                            ["--per-rank-batch-size", "1"])
    assert "global_batch_size=3" in str(err.value) and "global_batch_size (3) is smaller than world_size (4)" \
        in str(err.value)
    check_trial_configs(spec, lambda args: load_config([*MACHINERY_ARGS, *args], {"WORLD_SIZE": "3"},
                                                       dotenv_path="/none"), ["--per-rank-batch-size", "2"])


def test_a_trials_flags_parse_back_to_its_settings_exactly(tmp_path: Path) -> None:
    spec = spec_of(tmp_path)
    settings = {"lr": 3e-05, "weight_decay": 0.1 / 3, "eval_every": 7, "tensorboard": False}
    args = trial_args(spec, settings, 2)
    assert args[:2] == ["--max-steps", "40"] and args[-2:] == ["--seed", "2"]
    config = load_config([*MACHINERY_ARGS, *args], {}, dotenv_path="/none")
    assert (config.lr, config.weight_decay, config.eval_every, config.tensorboard, config.seed) == \
        (3e-05, 0.1 / 3, 7, False, 2)
    assert flags({"compile": None}) == ["--compile", "none"]


def completed(study: optuna.Study, values: dict[int, float]) -> None:
    trial = study.ask()
    for step, value in values.items():
        trial.report(value, step)
    study.tell(trial, max(values.values()))


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")  # optuna's median of a NaN trial: it is pruned
def test_the_median_rule_prunes_a_trial_behind_the_completed_ones_at_the_same_step(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, BASE + "[prune]\nstartup_trials = 2\nmin_step = 10\n")
    study = studies.create_study(tmp_path / "d", spec, {})
    completed(study, {10: 40.0, 20: 45.0})
    bad = studies.next_trial(study, spec)
    pruner = TrialPruner(f"{tmp_path / 'd'}:{bad.number}")
    assert not pruner.ask(10, 30.0, "f1", "max"), "one completed trial is not enough (startup_trials = 2)"
    completed(study, {5: 1.0, 10: 38.0, 20: 46.0})
    assert pruner.ask(20, 30.0, "f1", "max"), "30 is below the median of 45 and 46 at step 20"
    early = TrialPruner(f"{tmp_path / 'd'}:{studies.next_trial(study, spec).number}")
    assert not early.ask(5, 0.0, "f1", "max"), "before min_step"
    good = TrialPruner(f"{tmp_path / 'd'}:{studies.next_trial(study, spec).number}")
    assert not good.ask(20, 45.5, "f1", "max"), "at the median: not behind"
    lower = TrialPruner(f"{tmp_path / 'd'}:{studies.next_trial(study, spec).number}")
    assert lower.ask(20, math.nan, "loss", "min"), "a NaN evaluation is pruned"


def test_a_pruner_that_cannot_reach_the_study_never_prunes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pruner = TrialPruner(f"{tmp_path / 'nowhere'}:3")
    assert not pruner.ask(10, 1.0, "f1", "max") and not pruner.ask(20, 0.0, "f1", "max")
    assert sum("reporting to the sweep's study failed" in r.message for r in caplog.records) == 1
    assert parse_trial("/a:b/dir:12") == (Path("/a:b/dir"), 12)
    with pytest.raises(ConfigError, match="SWEEP_DIR:TRIAL_NUMBER"):
        parse_trial("dir")


def test_a_trials_end_is_recorded_from_its_summary_and_the_table_sorts_by_the_objective(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, BASE.replace("seeds = [1, 2]", "seeds = [1]"))
    study = studies.create_study(tmp_path / "d", spec, {})
    trials = [studies.next_trial(study, spec) for _ in range(5)]
    loss = {"status": "FINISHED", "best_metric": "loss", "best_mode": "min", "step": 40}
    for trial, value in zip(trials[:3], (0.6, 0.4, 0.9), strict=True):
        trial.report(-value, 10)  # the trials' rank 0 reports the metric signed (distqa.sweeps.pruning)
    assert studies.record_outcome(study, 0, {**loss, "best_value": 0.5}, "") == "done"
    assert studies.record_outcome(study, 1, {**loss, "best_value": 0.3}, "") == "done"
    assert studies.record_outcome(study, 2, {**loss, "best_value": 0.9, "step": 10, "pruned_at": 10}, "") == "pruned"
    assert studies.record_outcome(study, 3, None, "CUDA out of memory (exit 1)") == "failed"
    assert studies.record_outcome(study, 4, {**loss, "best_value": math.nan}, "") == "failed"
    records = studies.records(study, running_now=False)
    assert [(r.number, r.state) for r in results.sorted_records(records)] == [
        (1, "done"), (0, "done"), (2, "pruned"), (3, "failed"), (4, "failed"), (5, "waiting")]
    assert results.best_record(records).number == 1
    table = results.table(records, ["lr", "weight_decay"]).splitlines()
    assert table[0].split() == ["trial", "lr", "weight_decay", "seed", "loss", "step", "state", "time"]
    assert table[1].split()[0] == "trial-001" and table[1].split()[4:7] == ["0.3", "40", "done"]
    assert "trial-003 failed: CUDA out of memory (exit 1)" in table
    assert "trial-004 failed: the objective loss is NaN" in "\n".join(table)
    assert trials[0].number == 0
    page = results.picture(study, records, "t")  # Optuna's slice and intermediate values plots, as inline SVG
    assert page.count("<svg") == 2 and "<script" not in page and all(
        ref.startswith(("#", "data:")) for ref in re.findall(r'href="([^"]*)"', page)), "self-contained, no script"
    assert "loss (lower is better); best: trial-001, loss 0.3" in page and page.count("best: trial-001") == 3, \
        "the direction named and the best trial marked in each setting's slice"
    assert "trial-001 (best)" in page, "its evaluations marked among the others'"


@pytest.mark.parametrize(("log", "reason"), [
    ("[node 0] distqa.train: configuration error: lr must be > 0, got -1.0; typical values are 1e-5 .. 1e-3.\n"
     "worker.sh: run 'trial-001' node 0: the workers refused to run (exit 2); why is above\n",
     "distqa.train: configuration error: lr must be > 0, got -1.0; typical values are 1e-5 .. 1e-3. (exit 2)"),
    ("[node 0] Traceback (most recent call last):\n[node 0]   File \"x.py\", line 3\n"
     "[node 0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
     "[node 0] torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
     "a node exited with status 1: stopping the others\n",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (exit 1)"),
    ("[platform] master distributed_training sw-t0-0 is running at 127.0.0.10\n"
     "[platform] node 1 (distributed_training sw-t0-1) cancelled; its logs: 'neuro-flow logs x'\n"
     "[platform] stopping every job of run 'sw-t0'\n",
     "node 1 (distributed_training sw-t0-1) cancelled; its logs: 'neuro-flow logs x' (exit 1)"),
])
def test_a_failed_trials_reason_is_one_line_from_its_launchers_output(log: str, reason: str) -> None:
    code = int(reason.rsplit("exit ", 1)[1].rstrip(")"))
    assert failure_reason(log, code) == reason


def test_launchers_commands_and_the_reproducing_command() -> None:
    platform = Launcher("platform", nodes=4, extra=["--preset", "gpu-large"], run_id_prefix="BERT recipe!")
    words = platform.command(12, ["--lr", "3e-05"])
    assert words[1].endswith("run_distributed_on_platform.sh") and words[words.index("--run-id") + 1] == "bert-reci-t12"
    assert words[-3:] == ["--", "--lr", "3e-05"]
    assert Launcher("slurm", nodes=2).command(3, ["--lr", "1"])[:3] == ["sbatch", "--parsable", "--wait"]
    local = "scripts/run_distributed_locally.sh --nodes 2 -- --lr 3e-05"
    assert Launcher("local").reproduce(["--lr", "3e-05"]) == local
    assert platform.outcome(130, stop_asked=True) == "stopped"
    assert platform.outcome(130, stop_asked=False) == "failed", "130 without our stop: someone else's interrupt"
    assert Launcher("local").outcome(75, stop_asked=False) == "stopped", "stopped from outside: resumed"
    assert Launcher("local").outcome(143, stop_asked=True) == "stopped", "signalled before its handlers were set"
    assert Launcher("local").outcome(1, stop_asked=False) == "failed"


def test_a_second_sweep_process_or_a_bad_sweep_file_is_refused_in_one_line_before_anything_is_written(
        tmp_path: Path) -> None:
    sweep_file = tmp_path / "s.toml"
    sweep_file.write_text(BASE.replace("[fixed]", "[fixed]\ntask = 'examples.text_classification.task:"
                                                  "TextClassification'"))
    with studies.exclusive(tmp_path / "d"):
        assert studies.in_use(tmp_path / "d")
        result = subprocess.run([sys.executable, "-m", "distqa.sweep", str(sweep_file), "--sweep-dir",
                                 str(tmp_path / "d"), "--", "--preset", "none"],
                                cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"distqa.sweep: {tmp_path / 'd'} is in use by another "
                                                             "sweep process")
    assert not (tmp_path / "d" / "sweep.json").exists(), "refused before anything was written"
    assert not studies.in_use(tmp_path / "d")
    sweep_file.write_text(sweep_file.read_text().replace("lr = [", "lrate = ["))
    bad = subprocess.run([sys.executable, "-m", "distqa.sweep", str(sweep_file), "--sweep-dir", str(tmp_path / "e"),
                          "--", "--preset", "none"], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "[space]: unknown setting 'lrate' for task settings TextClassificationConfig" in bad.stderr
    assert not (tmp_path / "e").exists(), "no trial, no sweep directory"


def test_with_mlflow_the_sweep_has_one_run_and_each_trials_run_is_its_child(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's MLflow run is made once and found again on a resume (its id kept in the study); a trial's
    tracker opens its run as that run's child. Against MLflow's own file store (no server)."""
    from mlflow.tracking import MlflowClient

    from distqa.record.tracking import MLflowTracker

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    spec = spec_of(tmp_path)
    study = studies.create_study(tmp_path / "d", spec, {})
    extra = [*MACHINERY_ARGS, "--tracker", "mlflow", "--mlflow-experiment", "sweeps"]
    parent = runner.mlflow_parent_run(study, spec, extra, {"WORLD_SIZE": "2"})
    resumed = studies.create_study(tmp_path / "d", spec, {})
    assert parent and runner.mlflow_parent_run(resumed, spec, extra, {"WORLD_SIZE": "2"}) == parent
    assert runner.mlflow_parent_run(study, spec, MACHINERY_ARGS, {}) is None, "no tracker, no sweep run"
    opened: list[str] = []
    tracker = MLflowTracker(uri, "sweeps", "trial-000", None, {"lr": "0.003"}, opened.append,
                            tags={"mlflow.parentRunId": parent})
    tracker.finish("FINISHED", [])
    client = MlflowClient(uri)
    child = client.get_run(opened[0])
    assert child.data.tags["mlflow.parentRunId"] == parent and child.info.status == "FINISHED"
    assert client.get_run(parent).info.run_name == f"sweep {spec.name}"


def test_a_resume_is_refused_while_an_interrupted_trials_launcher_from_a_killed_sweep_still_runs() -> None:
    """A sweep killed outright (SIGKILL) leaves its trials' launchers running in their own sessions; running the
    command again then names the launcher instead of starting a second one on the same run directory."""
    import socket

    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--run-id", "trial-003"])
    try:  # until the child has exec'd, /proc shows the forked pytest's command line: wait for its own
        wait_for(lambda: b"trial-003" in Path(f"/proc/{launcher.pid}/cmdline").read_bytes(), timeout=60)
        with pytest.raises(ConfigError, match=rf"trial-003's launcher \(pid {launcher.pid}\) from an earlier sweep "
                                              r"process still runs; stop it"):
            runner.refuse_if_still_running(3, f"{socket.gethostname()}:{launcher.pid}")
        runner.refuse_if_still_running(4, f"{socket.gethostname()}:{launcher.pid}")  # another trial's pid: not it
        runner.refuse_if_still_running(3, f"elsewhere:{launcher.pid}")  # another host's: not seen from here
    finally:
        launcher.kill()
        launcher.wait()
    runner.refuse_if_still_running(3, f"{socket.gethostname()}:{launcher.pid}")
