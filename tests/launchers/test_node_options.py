"""A node's options as plain functions, without bash or a process: scripts/worker.sh's command line, its time spans,
the engines' variables (Kubeflow's PET_*, SkyPilot's SKYPILOT_*), the checks and their one-line errors, and the
torchrun command line the node builds (src/distqa/launch/node_options.py, engines.py, node.py).
worker.sh itself, the shim that runs them, keeps its end-to-end cases in tests/launchers/test_launchers.py and the
engines' files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from distqa.launch.engines import kubeflow_environment, skypilot_environment
from distqa.launch.node import entry_module_found, node_count, outcome, processes_here, read_node, torchrun_args
from distqa.launch.node_options import USAGE, Node, NodeError, NodeOptions, check, parse_command_line, seconds_of

from support.processes import clean_env, node_in_process
from support.repo import REPO_ROOT, WORKER


def node_of(*argv: str, **environ: str) -> Node:
    """The checked node for ``worker.sh ARGV`` under ``environ`` alone."""
    node = read_node(list(argv), dict(environ))
    assert node is not None
    return node


def refusal(*argv: str, **environ: str) -> str:
    """The one line ``worker.sh ARGV`` under ``environ`` stops with (exit 2)."""
    with pytest.raises(NodeError) as refused:
        read_node(list(argv), dict(environ))
    assert refused.value.status == 2 and "\n" not in str(refused.value)
    return str(refused.value)


# --- the command line ------------------------------------------------------------------------------------------------

def test_the_defaults_are_one_standalone_node_of_the_run_distqa() -> None:
    node = node_of()
    assert (node.nnodes, node.min_nodes, node.node_rank, node.master_port, node.run_id, node.max_restarts) == \
        (1, 1, 0, 29400, "distqa", 0)
    assert (node.nproc_per_node, node.join_timeout, node.stop_after_s, node.entry_module) == \
        (None, 900, 0, "distqa.train")
    assert not node.external_store and not node.dry_run and node.trainer_args == []


def test_flags_win_over_the_variables_that_give_their_defaults() -> None:
    environ = {"MIN_NODES": "1", "MAX_RESTARTS": "2", "NPROC_PER_NODE": "3", "RDZV_JOIN_TIMEOUT": "60"}
    from_environment = node_of("--nnodes", "2", "--master-addr", "h", **environ)
    assert (from_environment.min_nodes, from_environment.max_restarts, from_environment.nproc_per_node,
            from_environment.join_timeout) == (1, 2, 3, 60)
    flags = node_of("--nnodes", "2", "--min-nodes", "2", "--max-restarts", "0", "--nproc-per-node", "4",
                    "--join-timeout", "5", **environ)
    assert (flags.min_nodes, flags.max_restarts, flags.nproc_per_node, flags.join_timeout) == (2, 0, 4, 5)
    assert node_of("--nnodes=2", "--min-nodes=1", "--", "--lr=1").min_nodes == 1, "--flag=value, as argparse"


def test_what_follows_the_double_dash_is_the_trainers_and_help_ends_the_reading() -> None:
    node = node_of("--run-id", "r1", "--dry-run", "--", "--max-steps", "5", "--nnodes", "9")
    assert node.run_id == "r1" and node.dry_run and node.trainer_args == ["--max-steps", "5", "--nnodes", "9"]
    assert parse_command_line(["--nnodes", "2", "--help", "--no-such-option"], NodeOptions()).help
    assert read_node(["-h"], {}) is None


def test_the_doctor_runs_without_restarts() -> None:
    node = node_of("--doctor", "--max-restarts", "3")
    assert node.entry_module == "distqa.doctor" and node.max_restarts == 0


@pytest.mark.parametrize(("argv", "line"), [
    (["--no-such-option"], "unknown option '--no-such-option'; trainer flags go after -- (see --help)"),
    (["--nnodes"], "--nnodes needs a value (see --help)"),
    (["--nnodes", "two"], "--nnodes must be a whole number, got 'two'"),
    (["--nnodes", "0"], "--nnodes must be at least 1"),
    (["--nnodes", "2", "--min-nodes", "3"], "--min-nodes must be in 1..2 (--nnodes), got 3"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2 is outside 0..1 for --nnodes 2"),
    (["--master-port", "80"], "--master-port must be in 1024..65535, got 80"),
    (["--run-id", "a/b"], "--run-id may hold letters, digits, '.', '_' and '-' only, got 'a/b'"),
    (["--entry-module", "my-task"], "--entry-module must be a dotted Python module name such as mytask.train, got "
                                    "'my-task'"),
    (["--nnodes", "2", "--external-store"], "--external-store needs --master-addr: the address of the host running "
                                            "python -m distqa.launch.rendezvous_store"),
    (["--nnodes", "2", "--node-rank", "1"], "--master-addr is required on node 1: the address of node 0 (its internal "
                                            "hostname on the platform)"),
    (["--nproc-per-node", "0"], "--nproc-per-node must be a positive whole number, got '0'"),
    (["--join-timeout", "1m"], "--join-timeout must be a whole number, got '1m'"),
])
def test_a_wrong_option_is_one_line(argv: list[str], line: str) -> None:
    assert refusal(*argv) == line


@pytest.mark.parametrize("name", ["RDZV_LAST_CALL_TIMEOUT", "RDZV_KEEP_ALIVE_INTERVAL", "RDZV_KEEP_ALIVE_MAX_ATTEMPT"])
def test_a_rendezvous_setting_must_be_positive_seconds(name: str) -> None:
    assert refusal(**{name: "0"}) == f"{name} must be a positive whole number of seconds, got '0'"


# --- time spans ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("span", "seconds"), [
    ("0", 0), ("3600", 3600), ("90m", 5400), ("1d12h", 129600), ("23h30m", 84600), ("0m30s", 30), ("1d", 86400),
    ("08h", 28800), ("3600.5", 3600), ("3601.5", 3602), ("1e4", 10000), ("+.5", 0), ("1.5E+1", 15)])
def test_a_time_span_in_seconds(span: str, seconds: int) -> None:
    assert seconds_of(span) == seconds


@pytest.mark.parametrize("span", ["", "1x", "1h1d", "m", "-5", "1 h", "1e100", "1.2.3"])
def test_a_time_span_that_is_none_of_the_forms(span: str) -> None:
    assert seconds_of(span) is None


@pytest.mark.parametrize(("flags", "stop_after_s", "window_s"), [
    (["--life-span", "1d"], 86400 - 900, "900"),        # at most 15 min before the end
    (["--life-span", "1h"], 3600 - 360, "360"),         # a tenth of it
    (["--life-span", "3600.5"], 3600 - 360, "360"),     # neuro-flow's float seconds
    (["--life-span", "5"], 5, None),                   # a tenth of 5 s rounds to nothing: no window
    (["--life-span", "1"], 1, None),
    (["--life-span", "1h", "--stop-after", "30m"], 1800, "1800"),  # --stop-after wins; the window follows it
    (["--stop-after", "90m"], 5400, None),
    (["--life-span", "0"], 0, None),
])
def test_the_stop_comes_before_the_life_span_ends(flags: list[str], stop_after_s: int, window_s: str | None) -> None:
    environ: dict[str, str] = {}
    node = read_node(flags, environ)
    assert node is not None and node.stop_after_s == stop_after_s
    assert environ.get("WORKER_STOP_WINDOW_S") == window_s


def test_a_wrong_span_is_one_line() -> None:
    assert refusal("--stop-after", "1x") == \
        "--stop-after must be [Nd][Nh][Nm][Ns] (1d, 23h30m, 90m) or seconds, got '1x'"
    assert refusal("--life-span", "soon") == \
        "--life-span must be [Nd][Nh][Nm][Ns] (1d, 6h, 90m) or seconds, got 'soon'"


# --- Kubeflow's variables --------------------------------------------------------------------------------------------

def test_a_trainjobs_variables_are_the_defaults_and_leave_the_environment() -> None:
    environ = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job",
               "PET_MASTER_PORT": "29500", "PET_NPROC_PER_NODE": "auto", "OTHER": "kept"}
    node = read_node([], environ)
    assert node is not None and (node.nnodes, node.node_rank, node.master_addr, node.master_port) == \
        (2, 1, "job-node-0-0.job", 29500)
    assert node.nproc_per_node is None and environ == {"OTHER": "kept"}


def test_a_pytorchjobs_variables_and_its_counts_of_nodes_leave_the_environment() -> None:
    environ = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
               "WORLD_SIZE": "2", "RANK": "1"}
    node = read_node([], environ)
    assert node is not None and (node.node_rank, node.master_addr, node.master_port, node.nproc_per_node) == \
        (1, "job-master-0", 23456, 2)
    assert environ == {}


def test_node_0_hosts_at_its_own_address_whatever_the_engine_names_it() -> None:
    node = node_of(PET_NNODES="2", PET_NODE_RANK="0", PET_MASTER_ADDR="job-node-0-0.job")
    assert node.master_addr == ""


def test_an_elastic_pytorchjobs_variables() -> None:
    environ = {"PET_NNODES": "1:3", "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
               "PET_RDZV_ID": "job", "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "gpu",
               "PET_RDZV_CONF": "join_timeout=60,last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=4"}
    node = read_node(["--node-rank", "2"], environ)
    assert node is not None
    assert (node.min_nodes, node.nnodes, node.node_rank, node.master_addr, node.master_port, node.run_id,
            node.max_restarts, node.join_timeout) == (1, 3, 2, "job-worker-0", 23456, "job", 3, 60)
    assert environ == {"RDZV_LAST_CALL_TIMEOUT": "5", "RDZV_KEEP_ALIVE_INTERVAL": "2",
                       "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "4"}


def test_a_standalone_elastic_job_is_one_node() -> None:
    environ = {"PET_NNODES": "1:1", "PET_STANDALONE": ""}
    node = read_node([], environ)
    assert node is not None and node.nnodes == 1 and environ == {}


@pytest.mark.parametrize(("environ", "line"), [
    ({"PET_LOG_DIR": "/logs"}, "PET_LOG_DIR is a torchrun option that worker.sh does not read: give it as a "
                               "worker.sh flag (see --help) or remove it from the job's environment"),
    ({"PET_NNODES": "two"}, "PET_NNODES must be N or MIN:MAX (nodes), got 'two'"),
    ({"PET_NNODES": "2", "PET_RDZV_BACKEND": "etcd"},
     "PET_RDZV_BACKEND=etcd: worker.sh runs torchrun's c10d rendezvous; set rdzvBackend: c10d"),
    ({"PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": "job-worker-0:23456"},
     "--node-rank is required with an elastic PyTorchJob (PET_RDZV_ENDPOINT, no node rank): pass the pod's replica "
     "index, as deploy/kubernetes/pytorchjob-elastic.yaml does"),
    ({"PET_RDZV_ENDPOINT": "job-worker-0"}, "PET_RDZV_ENDPOINT must be HOST:PORT, got 'job-worker-0'"),
    ({"PET_RDZV_ENDPOINT": "a:1", "PET_MASTER_ADDR": "b", "PET_NODE_RANK": "0"},
     "PET_RDZV_ENDPOINT (a) and PET_MASTER_ADDR (b) name other hosts: an elastic PyTorchJob has Worker replicas only "
     "(deploy/kubernetes/pytorchjob-elastic.yaml)"),
    ({"PET_NPROC_PER_NODE": "cpu"}, "PET_NPROC_PER_NODE must be auto or a number of processes, got 'cpu' "
                                    "(nprocPerNode / numProcPerNode of the job)"),
    ({"PET_NNODES": "1:2", "PET_NODE_RANK": "0", "PET_RDZV_CONF": "is_host=1"},
     "PET_RDZV_CONF: worker.sh sets 'is_host' itself or does not know it; rdzvConf may hold join_timeout, "
     "last_call_timeout, keep_alive_interval and keep_alive_max_attempt"),
    ({"PET_NNODES": "2", "PET_STANDALONE": ""},
     "PET_STANDALONE (elasticPolicy standalone) runs one node, but PET_NNODES is 2"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "x"},
     "the job's environment gives node rank 'x' (PET_*), not a whole number"),
    ({"PET_MASTER_PORT": "p"}, "the job's environment gives master port 'p' (PET_*), not a whole number"),
])
def test_a_kubeflow_variable_the_node_cannot_follow_is_one_line(environ: dict[str, str], line: str) -> None:
    assert refusal(**environ) == line


def test_without_a_pet_variable_rank_and_master_addr_are_not_kubeflows() -> None:
    environ = {"RANK": "1", "MASTER_ADDR": "elsewhere"}
    assert kubeflow_environment(NodeOptions(), environ) == NodeOptions() and len(environ) == 2


# --- SkyPilot's variables --------------------------------------------------------------------------------------------

def skypilot(rank: int, gpus: int = 0, ips: str = "10.0.0.1\n10.0.0.2", nodes: str = "2") -> dict[str, str]:
    return {"SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NUM_NODES": nodes,
            "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus)}


def test_skypilots_variables_are_the_defaults_and_this_nodes_address_its_node_addr() -> None:
    environ = skypilot(1, gpus=8, ips=" 10.0.0.1 \n\n10.0.0.2\n")
    node = read_node([], environ)
    assert node is not None and (node.nnodes, node.node_rank, node.master_addr, node.nproc_per_node) == \
        (2, 1, "10.0.0.1", 8)
    assert environ["NODE_ADDR"] == "10.0.0.2"
    cpu_0 = {**skypilot(0), "NODE_ADDR": "given"}
    node = read_node(["--nproc-per-node", "2", "--master-port", "29555"], cpu_0)
    assert node is not None and (node.node_rank, node.master_addr, node.nproc_per_node, node.master_port) == \
        (0, "", 2, 29555)
    assert cpu_0["NODE_ADDR"] == "given"
    assert node_of(**{k: v for k, v in skypilot(1).items() if k != "SKYPILOT_NUM_NODES"}).nnodes == 2


@pytest.mark.parametrize(("environ", "line"), [
    (skypilot(1, ips="10.0.0.1"), "SKYPILOT_NODE_IPS holds 1 address(es) for SKYPILOT_NUM_NODES=2; SkyPilot sets "
                                  "both (one address a line): unset them to give --nnodes, --node-rank and "
                                  "--master-addr yourself"),
    (skypilot(0, ips=""), "SKYPILOT_NODE_RANK is set but SKYPILOT_NODE_IPS holds no address (SkyPilot sets both, one "
                          "address a line): unset SKYPILOT_NODE_RANK to give --nnodes, --node-rank and --master-addr "
                          "yourself"),
    (skypilot(2), "SKYPILOT_NODE_RANK 2 is outside 0..1 (SKYPILOT_NUM_NODES=2)"),
    ({**skypilot(0), "SKYPILOT_NODE_RANK": "one"}, "SKYPILOT_NODE_RANK must be a whole number, got 'one'"),
    (skypilot(0, nodes="0"), "SKYPILOT_NUM_NODES must be a positive whole number, got '0'"),
    ({**skypilot(0), "SKYPILOT_NUM_GPUS_PER_NODE": "a"}, "SKYPILOT_NUM_GPUS_PER_NODE must be a whole number, got 'a'"),
])
def test_inconsistent_skypilot_variables_are_one_line(environ: dict[str, str], line: str) -> None:
    assert refusal(**environ) == line


def test_without_skypilot_node_rank_nothing_is_skypilots() -> None:
    environ = {"SKYPILOT_NODE_IPS": "10.0.0.1"}
    assert skypilot_environment(NodeOptions(), environ) == NodeOptions() and "NODE_ADDR" not in environ


# --- the torchrun command line ---------------------------------------------------------------------------------------

def test_the_torchrun_arguments_of_a_standalone_node_and_of_an_elastic_one() -> None:
    one = node_of("--run-id", "r", "--", "--max-steps", "5")
    assert torchrun_args(one, 2, "", {}) == ["0", "--nproc-per-node", "2", "--max-restarts", "0", "--standalone",
                                              "-m", "distqa.train", "--run-name", "r", "--max-steps", "5"]
    elastic = node_of("--nnodes", "3", "--min-nodes", "2", "--node-rank", "1", "--master-addr", "h", "--max-restarts",
                      "2", "--entry-module", "my.entry", "--join-timeout", "60")
    assert node_count(elastic) == "2:3"
    args = torchrun_args(elastic, 1, "10.0.0.2", {"RDZV_LAST_CALL_TIMEOUT": "5"})
    assert args[:5] == ["1", "--nproc-per-node", "1", "--max-restarts", "2"]
    for flag, value in [("--nnodes", "2:3"), ("--rdzv-backend", "c10d"), ("--rdzv-endpoint", "h:29400"),
                        ("--rdzv-id", "distqa"), ("--rdzv-conf", "is_host=0,join_timeout=60,last_call_timeout=5"),
                        ("--local-addr", "10.0.0.2"), ("-m", "my.entry"), ("--run-name", "distqa")]:
        assert args[args.index(flag) + 1] == value, flag


def test_node_0_hosts_the_store_at_its_own_address_unless_it_is_external() -> None:
    hosting = torchrun_args(node_of("--nnodes", "2"), 1, "10.0.0.1", {})
    assert "10.0.0.1:29400" in hosting and "is_host=1,join_timeout=900" in hosting
    client = torchrun_args(node_of("--nnodes", "2", "--external-store", "--master-addr", "store"), 1, "10.0.0.1", {})
    assert "store:29400" in client and "is_host=0,join_timeout=900" in client


# --- the checks on this machine --------------------------------------------------------------------------------------

def test_a_machine_without_a_gpu_drivers_device_node_runs_one_process(tmp_path: Path) -> None:
    assert processes_here(device_nodes=(str(tmp_path / "nvidiactl"),)) == 1


def test_the_entry_module_is_found_without_running_it() -> None:
    assert entry_module_found("distqa.train") and entry_module_found("examples.text_classification.task")
    assert not entry_module_found("distqa.no_such_module") and not entry_module_found("no_such_package.train")


def test_the_nodes_end_from_its_workers_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = node_of("--run-id", "r")
    assert outcome(node, 0, tmp_path, None) == 0 and capsys.readouterr().err == ""
    assert outcome(node, 4, tmp_path, None) == 4 and capsys.readouterr().err == ""  # the agent said why
    assert outcome(node, 1, tmp_path, None) == 1
    assert capsys.readouterr().err == "worker.sh: run 'r' node 0: torchrun exited with status 1 (see above)\n"
    (tmp_path / "exit-2-rank-0").touch()
    assert outcome(node, 2, tmp_path, Path("/runs/r")) == 2
    assert capsys.readouterr().err == ("worker.sh: run 'r' node 0: the workers refused to run (exit 2); why is above "
                                       "and in /runs/r/logs/rank-*.log\n")
    (tmp_path / "rank-0").write_text("stopped by SIGTERM at step 7, checkpoint written; exit code 75\n")
    assert outcome(node, 1, tmp_path, None) == 75
    assert capsys.readouterr().err == ("worker.sh: run 'r' node 0: stopped by SIGTERM at step 7, checkpoint written; "
                                       "exit code 75\n")


# --- through worker.sh and the module --------------------------------------------------------------------------------

def test_worker_sh_help_prints_the_nodes_documentation() -> None:
    result = subprocess.run(["bash", WORKER, "--help"], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout == USAGE, result.stderr
    for documented in ("--stop-after SPAN", "--life-span SPAN", "--project-args", "Exit status:", "75 when",
                       "PET_NNODES", "SKYPILOT_NODE_IPS", "NODE_CORES", "TORCH_FR_BUFFER_SIZE"):
        assert documented in USAGE, documented


def test_an_interpreter_without_distqa_is_one_line(tmp_path: Path) -> None:
    bare = tmp_path / "python"
    bare.write_text(f'#!/usr/bin/env bash\nexec {os.path.realpath("/usr/bin/python3")} -I "$@"\n')
    bare.chmod(0o755)
    result = subprocess.run(["bash", WORKER, "--dry-run"], cwd=tmp_path, env=clean_env(PYTHON=str(bare)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"worker.sh: {bare} cannot import distqa; run inside the image, or 'make setup' and "
                             "PYTHON=.venv/bin/python\n")


def test_an_entry_module_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    result = node_in_process(["--entry-module", "no_such_module", "--dry-run"], clean_env())
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("worker.sh: --entry-module no_such_module: no such module for ")


def test_project_args_come_before_the_trainer_flags_given(tmp_path: Path) -> None:
    (tmp_path / "project.toml").write_text(
        '[run]\nargs = ""\n[jobs]\nargs = "--preset ${PRESET} --max-steps 3"\n[image]\npython = []\napt = []\n')
    node = read_node(["--project-args", "--", "--max-steps", "5"], {"PRESET": "none"}, repo_root=tmp_path)
    assert node is not None and node.trainer_args == ["--preset", "none", "--max-steps", "3", "--max-steps", "5"]
    with pytest.raises(NodeError) as refused:
        read_node(["--project-args"], {}, repo_root=tmp_path)
    assert "names ${PRESET}, which this environment does not set" in str(refused.value)


def test_the_checkout_worker_sh_names_gives_the_project_args_and_the_packages(tmp_path: Path) -> None:
    """worker.sh exports its own checkout (WORKER_CHECKOUT, its path as given, symlinks kept): a job's uploaded copy
    (SkyPilot's workdir) beside an environment installed from elsewhere keeps its own project.toml and packages."""
    (tmp_path / "project.toml").write_text(
        '[run]\nargs = ""\n[jobs]\nargs = "--preset none --max-steps 3"\n[image]\npython = []\napt = []\n')
    found: dict[str, str] = {}
    result = node_in_process(["--project-args"], clean_env(WORKER_CHECKOUT=str(tmp_path), NPROC_PER_NODE="1"),
                             agent_env=found)
    assert result.returncode == 0, result.stderr
    assert found["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
    dry_run = node_in_process(["--project-args", "--dry-run"], clean_env(WORKER_CHECKOUT=str(tmp_path)))
    assert dry_run.stdout.rstrip().endswith("--preset none --max-steps 3"), dry_run.stdout


def test_check_reads_options_given_as_text() -> None:
    options = NodeOptions(nnodes="2", node_rank="1", engine_master_addr="engine-0")
    assert check(options, {}).master_addr == "engine-0"
    assert check(NodeOptions(nnodes="2", node_rank="1", master_addr="given", engine_master_addr="engine-0"),
                 {}).master_addr == "given"
    with pytest.raises(NodeError):
        check(NodeOptions(nnodes="2", node_rank="1", external_store=True, engine_master_addr="engine-0"), {})
