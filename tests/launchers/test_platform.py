"""The platform recipe without the platform and without a training run: live.yml through neuro-flow's own parser
(every job renders), and the platform launcher (python -m distqa.launch.platform, which
scripts/run_distributed_on_platform.sh execs) against a stand-in neuro-flow (tests/standin/platform_cli.py): dry runs
and refusals in this process, options from flags, environment and .env, a master never scheduled, a rebuild, the
external store's job submitted first, sixteen nodes watched with one CLI call a poll. The launcher's training runs:
tests/distributed/test_platform.py."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.launch.platform.cli import main as launcher_main
from distqa.upkeep.project import split_setting

from support.apolo import (
    LAUNCH,
    STANDIN,
    STORE,
    events,
    finish,
    jobs,
    launch,
    platform_fixture,  # noqa: F401  (the fixture `platform`)
)
from support.processes import clean_env, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import platform_polls  # bench/ is not a package: the watch measured on light jobs, as the bench measures it

JOBS = {"train", "doctor", "prepare", "predict", "distributed_training", "rendezvous_store", "jupyter", "tensorboard",
        "filebrowser", "remote_debug"}


# --- live.yml ----------------------------------------------------------------------------------

def test_live_yml_parses_with_neuro_flow_and_has_the_jobs() -> None:
    """The jobs are live.yml's (the template's), the image and the volumes they use project.yml's (the project's)."""
    from apolo_flow.parser import parse_live, parse_project_stream

    flow = parse_live(REPO_ROOT, REPO_ROOT / ".neuro" / "live.yml")
    assert set(flow.jobs) == JOBS and flow.images is None and flow.volumes is None
    with (REPO_ROOT / ".neuro" / "project.yml").open() as project_yml:
        project = parse_project_stream(project_yml)
    assert set(project.images) == {"myimage"} and project.images["myimage"].build_preset is not None
    assert set(project.volumes) == {"data", "code", "config", "results", "notebooks", "cache"}


def test_every_job_renders_with_its_defaults_and_mounts_data_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendering each job with neuro-flow's own evaluator fails on any undefined volume, image or
    param reference (and on contexts used where neuro-flow does not allow them)."""
    monkeypatch.chdir(REPO_ROOT)  # the CLI (and the stand-in) finds .neuro/ from the working directory
    sys.path.insert(0, str(STANDIN.parent))
    import platform_cli

    flow = platform_cli._flow()
    assert set(flow.job_ids) == JOBS
    for job_id in JOBS:
        multi = asyncio.run(flow.is_multi(job_id))
        job = platform_cli.render(job_id, "s-0" if multi else None, {})
        assert job.cmd, job_id
        assert job.life_span and job.life_span <= 2 * 86400, f"{job_id}: every job needs a bounded life span"
        mounts = {v.rsplit(":", 2)[1]: v.rsplit(":", 2)[2] for v in job.volumes}
        if job_id in ("train", "doctor", "prepare", "predict", "distributed_training"):
            assert mounts["/data"] == "ro" and mounts["/project/results"] == "rw", job_id
            assert job.image.endswith(f"{flow.project.id}:v1")  # the project's (a fork names its own)
    training = platform_cli.render("distributed_training", "r-1", {"node_rank": "1", "master_addr": "m.x",
                                                                   "run_id": "r", "args": "--lr '1e-3'"})
    words = shlex.split(training.cmd)
    assert words[-3:] == ["--", "--lr", "1e-3"]
    assert words[words.index("--master-addr") + 1] == "m.x" and words[words.index("--node-rank") + 1] == "1"
    assert "run:r" in training.tags and training.detach
    predict = shlex.split(platform_cli.render("predict", None, {"run_id": "r", "input": "/data/in.jsonl"}).cmd)
    assert predict[:5] == ["bash", "/project/scripts/in_job.sh", "python", "-m", "distqa.predict"]
    assert predict[predict.index("--checkpoint") + 1] == "/project/results/r/checkpoints/best.pt"
    assert predict[predict.index("--output") + 1] == "/project/results/r/submission.csv"
    # A fork runs its own modules: the training jobs' entry module reaches worker.sh, predict takes another module.
    for job_id in ("train", "distributed_training"):
        words = shlex.split(platform_cli.render(job_id, "r-0", {"entry_module": "mytask.train"}).cmd)
        assert words[words.index("--entry-module") + 1] == "mytask.train" and words.index("--entry-module") < \
            words.index("--")
        default = shlex.split(platform_cli.render(job_id, "r-0", {}).cmd)
        assert default[default.index("--entry-module") + 1] == "distqa.train"
    assert shlex.split(platform_cli.render("predict", None, {"module": "mytask.answer"}).cmd)[4] == "mytask.answer"
    # prepare builds whatever the project's task builds: its flags start with project.toml's [jobs] args (in_job.sh
    # --project-args inserts them), then the job's own; no setting of a task is the job's default.
    prepare = platform_cli.render("prepare", None, {"args": "--num-proc 4"})
    assert shlex.split(prepare.cmd)[2:] == ["--project-args", "python", "-m", "distqa.prepare", "--num-proc", "4"]
    assert {k: v for k, v in prepare.env.items() if k.startswith("DISTQA_")} == {
        "DISTQA_NUM_PROC": "8", "DISTQA_OUTPUT_DIR": "/project/results"}


def test_in_job_project_args_puts_the_projects_jobs_args_before_the_jobs_own(tmp_path: Path) -> None:
    """The prepare job's module gets project.toml's [jobs] args (the project's task and preset), then its own."""
    env = clean_env(DISTQA_OUTPUT_DIR=str(tmp_path), HF_HOME=str(tmp_path / "cache"))
    in_job = ["bash", str(REPO_ROOT / "scripts" / "in_job.sh"), "--project-args"]
    done = subprocess.run([*in_job, "echo", "-m", "module", "--own", "1"], env=env, capture_output=True, text=True,
                          timeout=60)
    project = split_setting(REPO_ROOT / "project.toml", "jobs.args", {"DISTQA_OUTPUT_DIR": str(tmp_path)})
    assert done.stdout.split() == ["-m", "module", *project, "--own", "1"], done.stdout + done.stderr
    refused = subprocess.run([*in_job, "true"], env=env, capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stderr) == (2, "in_job.sh: --project-args comes before python -m MODULE\n")


@pytest.mark.parametrize("job_id", ["distributed_training", "train"])
@pytest.mark.parametrize(("life_span", "stop_after_s"), [("1d", 86400 - 900), ("90m", 5400 - 540), ("600", 540)])
def test_a_nodes_job_stops_itself_with_a_checkpoint_before_its_life_span(
        monkeypatch: pytest.MonkeyPatch, job_id: str, life_span: str, stop_after_s: int) -> None:
    """The life span the launcher gives a node's job (--life-span → the job's life_span), or a one-node train
    job's own, reaches the job's worker.sh, which sends the graceful stop a tenth of it (at most 15 min)
    before the platform's kill."""
    monkeypatch.chdir(REPO_ROOT)
    sys.path.insert(0, str(STANDIN.parent))
    import platform_cli

    job = platform_cli.render(job_id, "r-0", {"life_span": life_span, "run_id": "r"})
    words = shlex.split(job.cmd)
    assert words[:2] == ["bash", "/project/scripts/worker.sh"]
    dash = words.index("--")
    worker = ["bash", str(REPO_ROOT / "scripts" / "worker.sh"), *words[2:dash], "--nproc-per-node", "1", "--dry-run",
              *words[dash:]]
    result = subprocess.run(worker, cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert job.life_span == stop_after_s + min(900, job.life_span // 10)  # the platform's kill comes after
    assert f", stop after {stop_after_s}s" in result.stderr, result.stderr


def dry_run(capsys: pytest.CaptureFixture[str], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The launcher's dry run in this process: its exit status and output."""
    code = launcher_main(["--dry-run", *args], clean_env(**env))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def test_dry_run_prints_commands_whose_params_live_yml_defines(capsys: pytest.CaptureFixture[str]) -> None:
    from apolo_flow.parser import parse_live

    result = dry_run(capsys, "--nodes", "3", "--run-id", "t1", "--preset", "gpu-xl", "--entry-module", "mytask.train",
                     "--", "--max-steps", "5", "--lr", "1e-4")
    assert result.returncode == 0, result.stderr
    runs = [shlex.split(line) for line in result.stdout.splitlines() if " run " in line]
    assert len(runs) == 3
    defined = set(parse_live(REPO_ROOT, REPO_ROOT / ".neuro" / "live.yml").jobs["distributed_training"].params)
    for rank, words in enumerate(runs):
        assert words[1:3] == ["run", "distributed_training"]
        assert words[words.index("--suffix") + 1] == f"t1-{rank}"
        params = {words[i + 1]: words[i + 2] for i, w in enumerate(words) if w == "--param"}
        assert set(params) <= defined, f"params the job does not define: {set(params) - defined}"
        assert params["node_rank"] == str(rank) and params["nodes"] == "3" and params["run_id"] == "t1"
        assert params["preset"] == "gpu-xl" and shlex.split(params["args"]) == ["--max-steps", "5", "--lr", "1e-4"]
        assert params["entry_module"] == "mytask.train"
        assert (params["master_addr"] == "") == (rank == 0)
    assert "logs distributed_training t1-0" in result.stdout


def test_nodes_come_from_flag_then_environment_then_dotenv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("# comment\nNODES=3  # three nodes\nDISTQA_LR=1e-4\n")

    def nodes(*flags: str, **env: str) -> int:
        result = dry_run(capsys, "--run-id", "t2", *flags, ENV_FILE=str(env_file), **env)
        assert result.returncode == 0, result.stderr
        return result.stdout.count(" run distributed_training ")

    assert nodes() == 3
    assert nodes(NODES="4") == 4
    assert nodes("--nodes", "5", NODES="4") == 5
    bad = dry_run(capsys, "--nodes", "two")
    assert bad.returncode == 2 and "nodes must be a whole number, got 'two'" in bad.stderr


def test_external_store_comes_from_flag_then_environment_then_dotenv_and_a_bad_value_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """EXTERNAL_STORE (environment, else .env; empty is unset) is 0 or 1; anything else, or a store for one node,
    stops the launcher in one line before any job is submitted."""
    env_file = tmp_path / ".env"

    def launch(*flags: str, **env: str) -> subprocess.CompletedProcess[str]:
        return dry_run(capsys, "--run-id", "st", "--nodes", "2", *flags, ENV_FILE=str(env_file), **env)

    def store_jobs(*flags: str, **env: str) -> int:
        result = launch(*flags, **env)
        assert result.returncode == 0, result.stderr
        return result.stdout.count(" run rendezvous_store ")

    env_file.write_text("NODES=2\n")
    assert store_jobs() == 0 and store_jobs("--external-store") == 1 and store_jobs(EXTERNAL_STORE="1") == 1
    env_file.write_text("EXTERNAL_STORE=1\n")
    assert store_jobs() == 1 and store_jobs(EXTERNAL_STORE="0") == 0
    for value in ("yes", "true", "2"):
        env_file.write_text(f"EXTERNAL_STORE={value}\n")
        bad = launch()
        assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, (value, bad.stderr)
        assert (f"EXTERNAL_STORE must be 0 or 1 (1: --external-store), got '{value}' (environment or .env)"
                in bad.stderr), bad.stderr
    env_file.write_text("")
    one = launch("--external-store", "--nodes", "1")
    assert one.returncode == 2 and one.stdout == "" and "--external-store needs --nodes 2 or more" in one.stderr


def test_a_master_that_is_never_scheduled_fails_after_the_timeout_from_any_directory(
        platform: dict[str, str], tmp_path: Path) -> None:
    """`neuro-flow run` waits while its job is pending (the stand-in too); --timeout becomes the job's
    schedule_timeout, so the platform fails a job it could not place (pending for 600 s here), and the
    launcher stops on that failure: not on its own later deadline, not after the CLI's wait. Started from
    another directory: the launcher runs the flow CLI in the repository."""
    launcher = launch({**platform, "STANDIN_PENDING_S": "600"}, "slow", "--timeout", "2", cwd=tmp_path)
    output = finish(launcher, timeout=120)  # a hang guard: the platform fails the job after 2 s
    assert launcher.returncode == 1, output
    # The message of the launcher's branch for a job the platform failed; its own deadline (--timeout + 60 s)
    # would name the last status instead ("the master job (last status: pending)").
    assert "the master job (distributed_training slow-0) was not started within 2 s" in output
    assert [(j["status"], j["schedule_timeout"]) for j in jobs(platform).values()] == [("failed", 2)]
    assert [(e["key"], e["event"], e.get("reason")) for e in events(platform)] == [
        ("distributed_training-slow-0", "submitted", None),
        ("distributed_training-slow-0", "failed", "not scheduled within the schedule timeout (2 s)")]


def test_rebuilding_after_a_change_replaces_the_image(platform: dict[str, str], tmp_path: Path) -> None:
    """The builder refuses an existing tag without -F (apolo_extras); project.yml's force_rebuild makes
    the documented `neuro-flow build myimage` work a second time. Without it the stand-in refuses."""
    for _ in range(2):
        built = subprocess.run(["neuro-flow", "build", "myimage"], cwd=REPO_ROOT, env=platform, capture_output=True,
                               text=True, timeout=120)
        assert built.returncode == 0, built.stdout + built.stderr
    assert re.search(r"Successfully built \S+ \(\d+ files, \d+ bytes", built.stdout)
    copy = tmp_path / "copy"
    (copy / ".neuro").mkdir(parents=True)
    (copy / "Dockerfile").write_text("FROM scratch\n")
    project = (REPO_ROOT / ".neuro" / "project.yml").read_text()  # the image is the project's
    (copy / ".neuro" / "project.yml").write_text(project.replace("force_rebuild: true", "force_rebuild: false"))
    shutil.copy(REPO_ROOT / ".neuro" / "live.yml", copy / ".neuro" / "live.yml")
    again = subprocess.run(["neuro-flow", "build", "myimage"], cwd=copy, env=platform, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 1 and "exists. Use -F/--force-overwrite" in again.stderr
    forced = subprocess.run(["neuro-flow", "build", "-F", "myimage"], cwd=copy, env=platform, capture_output=True,
                            text=True, timeout=120)
    assert forced.returncode == 0, forced.stderr


def test_the_training_jobs_take_the_tracker_and_a_token_only_from_a_platform_secret(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--tracker mlflow reaches every node as params (the launcher's dry run) and, rendered by neuro-flow's own
    evaluator, as the jobs' environment; a token given as itself, not as secret:NAME, is refused."""
    monkeypatch.chdir(REPO_ROOT)
    sys.path.insert(0, str(STANDIN.parent))
    import platform_cli

    result = dry_run(capsys, "--nodes", "2", "--run-id", "t1", "--tracker", "mlflow", "--mlflow-uri",
                     "https://mlflow.example", "--mlflow-token", "secret:mlflow-token")
    assert result.returncode == 0, result.stderr
    for line in (line for line in result.stdout.splitlines() if " run " in line):
        words = shlex.split(line)
        params = {words[i + 1]: words[i + 2] for i, w in enumerate(words) if w == "--param"}
        assert (params["tracker"], params["mlflow_uri"], params["mlflow_token"]) == (
            "mlflow", "https://mlflow.example", "secret:mlflow-token")
        for job_id, suffix in (("distributed_training", "t1-0"), ("train", None)):
            job = platform_cli.render(job_id, suffix, {k: params[k] for k in ("tracker", "mlflow_uri", "mlflow_token")})
            assert {k: job.env[k] for k in ("DISTQA_TRACKER", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN")} == {
                "DISTQA_TRACKER": "mlflow", "MLFLOW_TRACKING_URI": "https://mlflow.example",
                "MLFLOW_TRACKING_TOKEN": "secret:mlflow-token"}
    default = platform_cli.render("distributed_training", "t1-0", {})
    assert default.env["DISTQA_TRACKER"] == "none" and default.env["MLFLOW_TRACKING_TOKEN"] == ""
    refused = dry_run(capsys, "--tracker", "mlflow", "--mlflow-uri", "https://m.x", "--mlflow-token", "a-raw-token")
    assert refused.returncode == 2 and "secret:NAME" in refused.stderr


# --- --external-store: the rendezvous store in a CPU job of its own, node 0 a node like any other -----------------

def test_external_store_job_is_submitted_first_every_node_is_its_client_and_ctrl_c_kills_it_too(
        platform: dict[str, str]) -> None:
    """The store's job runs (a CPU preset, python -m distqa.launch.rendezvous_store on the launcher's port) before any
    node's job is submitted; then every node, node 0 too, is submitted at once with --external-store and the store job's
    internal hostname. The nodes wait for a platform node (held) when Ctrl-C comes: every job is cancelled, the store's
    as well. No training runs: the command lines are the claim (the next tests run them)."""
    held = Path(platform["STANDIN_PLATFORM_DIR"]) / "held"
    held.mkdir(parents=True)
    nodes = [f"distributed_training-xs-{rank}" for rank in range(2)]
    for key in nodes:
        (held / key).touch()
    launcher = launch({**platform, "STORE_PRESET": "cpu-tiny"}, "xs", "--external-store", "--min-nodes", "1")
    try:
        wait_for(lambda: launcher.poll() is not None or set(nodes) <= set(jobs(platform)), timeout=120)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGINT)
    finally:
        output = finish(launcher, timeout=120)
    assert launcher.returncode == 130, output
    started = jobs(platform)
    assert {k: j["status"] for k, j in started.items()} == dict.fromkeys([f"{STORE}-xs", *nodes], "cancelled")
    store = started[f"{STORE}-xs"]
    port = store["params"]["port"]
    assert store["command"] == [sys.executable, "-m", "distqa.launch.rendezvous_store", "--port", port], \
        store["command"]
    assert store["preset"] == "cpu-tiny" and "run:xs" in store["tags"]  # STORE_PRESET from the environment
    order = [(e["key"], e["event"]) for e in events(platform)]
    for key in nodes:
        assert order.index((f"{STORE}-xs", "running")) < order.index((key, "submitted")), order
        command = started[key]["command"]
        assert "--external-store" in command, command
        assert command[command.index("--master-addr") + 1] == store["hostname"] != started[key]["hostname"]
        assert command[command.index("--master-port") + 1] == port
    assert f"rendezvous store {STORE} xs is running at {store['hostname']}" in output
    assert f"killing {STORE} xs (the rendezvous store)" in output


def test_every_entry_point_and_script_reads_one_env_file_env_file_else_the_working_directorys(tmp_path: Path) -> None:
    """The trainer's settings (``python -m distqa.config.sources --run-dir``, which resolves them as train does) and
    the platform launcher (``--dry-run``: its node count) read the same file: ``$ENV_FILE``, else ``.env`` in the
    working directory, whatever the repository holds; an ENV_FILE naming no file is refused by both in one line."""
    here = tmp_path / "here"
    here.mkdir()
    (here / ".env").write_text("NODES=3\nDISTQA_RUN_NAME=from-here\n")
    other = tmp_path / "other.env"
    other.write_text("NODES=4\nDISTQA_RUN_NAME=from-other\n")

    def read(**env: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        launcher = subprocess.run(["bash", str(LAUNCH), "--dry-run", "--run-id", "t"], cwd=here, env=clean_env(**env),
                                  capture_output=True, text=True, timeout=60)
        trainer = subprocess.run([sys.executable, "-m", "distqa.config.sources", "--run-dir", "--preset", "none"],
                                 cwd=here,
                                 env=clean_env(**env), capture_output=True, text=True, timeout=60)
        return launcher, trainer

    for env, nodes, run_name in (({}, 3, "from-here"), ({"ENV_FILE": str(other)}, 4, "from-other")):
        launcher, trainer = read(**env)
        assert launcher.returncode == 0 and trainer.returncode == 0, launcher.stderr + trainer.stderr
        assert launcher.stdout.count(" run distributed_training ") == nodes, (env, launcher.stdout)
        assert Path(trainer.stdout.strip()).name == run_name, env
    missing = str(tmp_path / "missing.env")
    for result in read(ENV_FILE=missing):
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert f"ENV_FILE={missing}: no such file" in line


def test_the_jobs_start_every_node_through_worker_sh() -> None:
    """The platform's jobs start each node with scripts/worker.sh, as every launcher does
    (tests/launchers/test_launchers.py)."""
    text = (REPO_ROOT / ".neuro/live.yml").read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert "scripts/worker.sh" in "\n".join(code)


@pytest.mark.parametrize(("min_nodes", "nnodes"), [("2", "2:3"), ("", "3")])
def test_the_platform_launcher_passes_the_range_to_every_nodes_worker_sh(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], min_nodes: str, nnodes: str) -> None:
    """run_distributed_on_platform.sh --min-nodes → the job's min_nodes param (.neuro/live.yml, read by the real
    neuro-flow parser through tests/standin) → worker.sh --min-nodes → torchrun --nnodes MIN:MAX; without it the
    node count stays fixed, as before."""
    monkeypatch.chdir(REPO_ROOT)
    sys.path.insert(0, str(STANDIN.parent))
    import platform_cli

    launcher = dry_run(capsys, "--nodes", "3", *(["--min-nodes", min_nodes] if min_nodes else []), "--run-id", "e1")
    assert launcher.returncode == 0, launcher.stderr
    runs = [shlex.split(line) for line in launcher.stdout.splitlines() if " run " in line]
    params = {runs[1][i + 1]: runs[1][i + 2] for i, w in enumerate(runs[1]) if w == "--param"}
    assert params["min_nodes"] == (min_nodes or "3")
    job = platform_cli.render("distributed_training", "e1-1", {k: v for k, v in params.items() if k != "args"}
                              | {"min_nodes": min_nodes})
    words = shlex.split(job.cmd)
    dash = words.index("--")
    worker = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "worker.sh"), *words[2:dash], "--nproc-per-node", "1",
                             "--dry-run", *words[dash:], *MACHINERY_ARGS, "--global-batch-size", "12",
                             "--per-rank-batch-size", "2"],
                            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1"),
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode == 0, worker.stderr
    torchrun = shlex.split(worker.stdout)
    assert torchrun[torchrun.index("--nnodes") + 1] == nnodes


def test_the_watch_looks_at_sixteen_nodes_with_one_cli_process_a_poll() -> None:
    """docs/DESIGN.md, "Scale": a launcher lists its jobs in one call per poll. Sixteen light jobs (a sleep each, the
    stand-in's command/ file: no trainer) run on the stand-in; the launcher's own watch loop, three polls: each
    poll starts exactly one CLI process, `ps`, and nothing else while no job ends (an ended job's one `status` and
    its resubmission: test_platform_launcher.py). The per-node look it replaced, taken before each poll on the same
    jobs, started sixteen."""
    measured = platform_polls.measure(16, polls=3)
    assert measured["new_calls"] == [["ps"]] * 3
    per_node = [f"status distributed_training {platform_polls.RUN_ID}-{rank}" for rank in range(16)]
    assert measured["old_calls"] == [per_node] * 3
    assert measured["new_processes_per_poll"] == 1 and measured["old_processes_per_poll"] == 16
