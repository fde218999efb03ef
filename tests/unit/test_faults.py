"""Fault injection (distqa.training.faults, INJECT_FAULT): a kill, a lost node or a hang on exactly the rank and after
exactly the step named, nowhere else and once per run directory (the 2-rank run: tests/distributed/test_faults.py)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.config import ConfigError
from distqa.training.faults import ArmedFault, Fault

from support.processes import clean_env, wait_for
from support.repo import REPO_ROOT

STEPS = """
import logging, sys
from pathlib import Path
from distqa.training.faults import ArmedFault
logging.basicConfig(level=logging.INFO)
fault = ArmedFault.from_environment(int(sys.argv[1]), Path(sys.argv[2]))
for step in range(1, 7):  # as the trainer does: the step is done, then the fault may act
    print(f"step {step} done", flush=True)
    fault.at(step)
print("finished", flush=True)
"""


def steps(tmp_path: Path, rank: int, spec: str, *prefix: str, **env: str) -> subprocess.Popen[str]:
    """A process that 'trains' steps 1..6 as rank ``rank`` with INJECT_FAULT=``spec`` (run directory tmp_path/run)."""
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    return subprocess.Popen([*prefix, sys.executable, str(script), str(rank), str(tmp_path / "run")], cwd=REPO_ROOT,
                            env=clean_env(INJECT_FAULT=spec, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def done_steps(output: str) -> list[int]:
    return [int(line.split()[1]) for line in output.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize(("spec", "fault"), [("kill:rank=1:step=7", Fault("kill", 1, 7)),
                                             ("hang:step=30:rank=0", Fault("hang", 0, 30)),
                                             (" kill-node:rank=3:step=1 ", Fault("kill-node", 3, 1))])
def test_a_fault_is_read_from_its_variable(spec: str, fault: Fault) -> None:
    assert Fault.parse(spec) == fault


@pytest.mark.parametrize("spec", ["kill", "explode:rank=1:step=7", "kill:rank=1", "kill:rank=1:step=0",
                                  "kill:rank=one:step=7", "kill:rank=1:step=7:step=8", "kill:rank=1:when=7"])
def test_a_malformed_fault_is_one_line_naming_the_variable_and_the_form(spec: str) -> None:
    with pytest.raises(ConfigError) as error:
        ArmedFault.from_environment(0, Path("unused"), {"INJECT_FAULT": spec})
    assert str(error.value).startswith(f"INJECT_FAULT={spec!r} is not a fault: write ACTION:rank=R:step=N with ")
    assert "\n" not in str(error.value)


def test_without_the_variable_nothing_is_armed_or_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        fault = ArmedFault.from_environment(0, tmp_path, {})
        for step in range(1, 100):
            fault.at(step)
    assert fault.fault is None and not caplog.records and not (tmp_path / "logs").exists()


def test_kill_ends_the_named_rank_right_after_the_named_step_and_once_per_run_directory(tmp_path: Path) -> None:
    killed = steps(tmp_path, 1, "kill:rank=1:step=3")
    output, errors = killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert done_steps(output) == [1, 2, 3], "it acted after step 3, not before, not later"
    assert "armed (INJECT_FAULT=kill:rank=1:step=3): this rank (1) will be SIGKILLed after step 3" in errors
    assert "fault injection (INJECT_FAULT): kill rank 1 after step 3 now" in errors
    assert (tmp_path / "run" / "logs" / "rank-1.fault").read_text() == f"kill rank 1 after step 3 (pid {killed.pid})\n"

    again = steps(tmp_path, 1, "kill:rank=1:step=3")  # the restart, or a relaunch with the variable still set
    output, errors = again.communicate(timeout=60)
    assert again.returncode == 0 and done_steps(output) == [1, 2, 3, 4, 5, 6], errors
    assert "done already in this run directory" in errors


def test_other_ranks_are_untouched_and_rank_0_says_what_will_happen(tmp_path: Path) -> None:
    for rank in (0, 2):
        other = steps(tmp_path, rank, "kill:rank=1:step=3")
        output, errors = other.communicate(timeout=60)
        assert other.returncode == 0 and done_steps(output) == [1, 2, 3, 4, 5, 6], errors
        said = "fault injection armed (INJECT_FAULT=kill:rank=1:step=3): rank 1 will be SIGKILLed after step 3"
        assert (said in errors) == (rank == 0), errors
    assert not (tmp_path / "run" / "logs").exists()


def test_hang_freezes_the_named_rank_right_after_the_named_step(tmp_path: Path) -> None:
    hung = steps(tmp_path, 0, "hang:rank=0:step=4")
    try:
        wait_for(lambda: process_state(hung.pid) == "T", timeout=60)  # stopped (SIGSTOP), not ended
        assert hung.poll() is None
    finally:
        hung.kill()
    output, errors = hung.communicate(timeout=60)
    assert done_steps(output) == [1, 2, 3, 4] and "finished" not in output
    assert "fault injection (INJECT_FAULT): hang rank 0 after step 4 now" in errors


def test_kill_node_ends_the_workers_parent_the_agent_too(tmp_path: Path) -> None:
    # The parent stands for the node's torchrun agent: a shell that would say so if it outlived its worker.
    node = steps(tmp_path, 0, "kill-node:rank=0:step=2", "bash", "-c", '"$@"; echo "the agent survived"', "agent",
                 TORCHELASTIC_RUN_ID="faults")
    output, errors = node.communicate(timeout=60)
    assert node.returncode == -signal.SIGKILL, output + errors
    assert done_steps(output) == [1, 2] and "the agent survived" not in output


def test_kill_node_outside_torchrun_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kill-node ends this process's torchrun agent"):
        ArmedFault.from_environment(0, tmp_path, {"INJECT_FAULT": "kill-node:rank=0:step=2"})


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_several_faults_on_different_ranks_are_read_and_one_rank_twice_is_refused() -> None:
    assert Fault.parse_all("kill-node:rank=2:step=6,pause:rank=0:step=10") == [Fault("kill-node", 2, 6),
                                                                               Fault("pause", 0, 10)]
    with pytest.raises(ConfigError, match="names one rank twice: one fault per rank"):
        Fault.parse_all("kill:rank=1:step=3,hang:rank=1:step=5")


ELASTIC_1_TO_2 = {"WORKER_NODE_RANGE": "1:2", "LOCAL_WORLD_SIZE": "1"}
"""What worker.sh --min-nodes 1 --nnodes 2 gives each worker (one process a node), without WORLD_SIZE."""


@pytest.mark.parametrize("elastic", [{}, {**ELASTIC_1_TO_2, "WORLD_SIZE": "1"}], ids=["no-range", "a-node-missing"])
def test_pause_holds_the_named_rank_after_the_named_step_until_a_sigterm(tmp_path: Path,
                                                                         elastic: dict[str, str]) -> None:
    """The SIGTERM is handled as distqa.distributed.stop handles it (recorded, not fatal): the pause ends, the handler
    runs, and the steps go on. It waits outside worker.sh, and in an elastic run short of a node (world size 1 of
    1:2)."""
    handled = "import signal\nsignal.signal(signal.SIGTERM, lambda *_: print('handled', flush=True))\n"
    paused = subprocess.Popen([sys.executable, "-c", handled + STEPS, "0", str(tmp_path / "run")], cwd=REPO_ROOT,
                              env=clean_env(INJECT_FAULT="pause:rank=0:step=3", **elastic), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for((tmp_path / "run" / "logs" / "rank-0.fault").exists, timeout=60)
        wait_for(lambda: process_state(paused.pid) == "S", timeout=60)
        assert paused.poll() is None, "it waits"
        paused.send_signal(signal.SIGTERM)
        output, errors = paused.communicate(timeout=60)
    finally:
        paused.kill()
    assert paused.returncode == 0, errors
    assert done_steps(output) == [1, 2, 3, 4, 5, 6]
    assert output.index("step 3 done") < output.index("handled") < output.index("step 4 done")
    assert "not waiting" not in (tmp_path / "run" / "logs" / "rank-0.fault").read_text()


def test_an_elastic_runs_pause_with_all_its_nodes_is_spent_without_waiting(tmp_path: Path) -> None:
    """At world size 2 of 1:2 the node the pause would wait for is already back (it returned before the step), so the
    pause is spent at once, with its marker and a line, and the steps go on."""
    paused = steps(tmp_path, 0, "pause:rank=0:step=3", **ELASTIC_1_TO_2, WORLD_SIZE="2")
    try:
        output, errors = paused.communicate(timeout=60)
    finally:
        paused.kill()
    assert paused.returncode == 0 and done_steps(output) == [1, 2, 3, 4, 5, 6], errors
    assert "pause rank 0 after step 3: the run has all its nodes, none to wait for; going on" in errors, errors
    marker = (tmp_path / "run" / "logs" / "rank-0.fault").read_text()
    assert "not waiting, the run has all its nodes" in marker, marker
