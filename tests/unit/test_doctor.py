"""The preflight doctor in one process: each failed check saying what to fix with a non-zero exit, its help, and
worker.sh running it without restarts (two nodes that disagree: tests/distributed/test_doctor.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.training.preflight import PackageCode, RankReport, disagreements

from support.doctor import failures
from support.processes import clean_env, node_in_process
from support.repo import MACHINERY_ARGS, MACHINERY_TASK, REPO_ROOT

DOCTOR = [sys.executable, "-m", "distqa.doctor", *MACHINERY_ARGS]
"""The doctor of a run of the machinery task (the QA tasks' memory estimate and feature cache:
tests/qa/test_doctor_qa.py)."""


def doctor(*args: str, prefix: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *DOCTOR, *args], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1", **env),
                          capture_output=True, text=True, timeout=120)


def test_one_process_reports_itself_and_passes(tmp_path: Path) -> None:
    # Network settings that are right: a prefix of an interface that is up (NCCL's rule), gloo's exact name.
    result = doctor("--output-dir", str(tmp_path / "results"), NCCL_SOCKET_IFNAME="l", GLOO_SOCKET_IFNAME="lo",
                    MASTER_ADDR="localhost", MASTER_PORT="29500")
    assert result.returncode == 0, result.stdout + result.stderr
    header, row = result.stdout.splitlines()[:2]
    assert header.split()[:6] == ["rank", "node", "host", "device", "GPUs", "torch"]
    assert row.split()[:2] == ["0", "0"] and " cpu " in row
    assert "all-reduce: not run (world size 1)" in result.stdout
    assert "memory: not estimated (task 'text_classification' defines no training_memory)" in result.stdout
    assert result.stdout.rstrip().endswith("doctor: all checks passed on 1 rank(s)")
    assert not list((tmp_path / "results" / "local").iterdir()), "the writability probe leaves nothing behind"


def test_an_unwritable_results_directory_fails_naming_it(unwritable_mount: tuple[Path, list[str]]) -> None:
    mount, prefix = unwritable_mount
    result = doctor("--output-dir", str(mount), prefix=tuple(prefix))
    assert result.returncode == 1, result.stdout + result.stderr
    [failure] = failures(result)
    assert f"results directory {mount / 'local'} is not writable (Permission denied)" in failure
    assert "DISTQA_OUTPUT_DIR" in failure


def test_interfaces_that_do_not_exist_and_an_unresolvable_master_fail_each_in_a_line(tmp_path: Path) -> None:
    result = doctor("--output-dir", str(tmp_path / "results"), GLOO_SOCKET_IFNAME="nosuch0",
                    NCCL_SOCKET_IFNAME="=nosuch1,nosuch2", MASTER_ADDR="no-such-host.invalid")
    assert result.returncode == 1, result.stdout + result.stderr
    master, nccl, gloo = failures(result)
    assert "MASTER_ADDR=no-such-host.invalid does not resolve on this host" in master
    for failure, setting in ((nccl, "NCCL_SOCKET_IFNAME==nosuch1,nosuch2"), (gloo, "GLOO_SOCKET_IFNAME=nosuch0")):
        assert f"{setting} names no interface of this host (it has " in failure and "lo (up)" in failure


def test_a_docker_sized_dev_shm_fails(tmp_path: Path) -> None:
    """A real 64 MiB tmpfs (Docker's default /dev/shm), mounted in a private mount namespace."""
    shm = tmp_path / "shm"
    shm.mkdir()
    namespace = ["unshare", "--mount", "--map-root-user"] if os.geteuid() else ["unshare", "--mount"]
    probe = subprocess.run([*namespace, "mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)],
                           capture_output=True, text=True, timeout=30)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")
    script = f'mount -t tmpfs -o size=64m tmpfs {shm} && exec "$@"'
    run = ("--output-dir", str(tmp_path / "results"), "--shm-path", str(shm))
    result = doctor(*run, "--num-workers", "2", prefix=(*namespace, "sh", "-c", script, "sh"))
    assert result.returncode == 1, result.stdout + result.stderr
    [failure] = failures(result)
    assert f"shared memory {shm} holds 64 MiB (Docker's default), less than 1 GB; DataLoader workers" in failure
    assert "--shm-size" in failure
    # Without loader workers (and without GPUs) nothing uses it: its size is shown, and no check fails.
    unused = doctor(*run, "--num-workers", "0", prefix=(*namespace, "sh", "-c", script, "sh"))
    assert unused.returncode == 0 and unused.stdout.splitlines()[1].split()[10] == "0.1", unused.stdout


def test_help_shows_the_runs_settings_and_the_doctors_own(capsys: pytest.CaptureFixture[str]) -> None:
    from distqa.doctor import main

    assert main(["--task", MACHINERY_TASK, "--help"]) == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: python -m distqa.doctor")
    assert "\ndoctor:\n" in help_text and "--expect-world-size N" in help_text and "--shm-path PATH" in help_text
    assert "--global-batch-size" in help_text and "--peak-tflops" in help_text  # the run's settings, checked as the run


def test_other_code_names_the_first_differing_file_and_advice_for_the_hosts() -> None:
    def report(rank: int, host: str, files: dict[str, str], location: str) -> RankReport:
        code = {"distqa": PackageCode(location, files)}
        return RankReport(rank=rank, node_rank=rank, local_rank=0, local_world_size=1, world_size=2, host=host,
                          device="cpu", device_name="cpu", gpu_count=0, versions={}, code_hash=str(files),
                          config_hash="same", config={}, code=code)

    ours = {"distqa/a.py": "1", "distqa/b.py": "2"}
    theirs = {"distqa/a.py": "1", "distqa/b.py": "2", "distqa/new.py": "3"}
    [line] = disagreements([report(0, "node-a", ours, "/app/distqa"), report(1, "node-b", theirs, "/app/distqa")])
    assert line.startswith("rank 1 (node-b) runs other code than rank 0 (node-a): package distqa differs in "
                           "distqa/new.py (only on rank 1), imported from /app/distqa on both; give every node the "
                           "same version of that code: the same commit, the same image"), line
    [line] = disagreements([report(0, "vm", ours, "/a/distqa"), report(1, "vm", {"distqa/b.py": "9"}, "/b/distqa")])
    assert "package distqa differs in distqa/a.py (only on rank 0) and 1 more file, imported from /b/distqa on " \
        "rank 1, /a/distqa on rank 0; both run on this host" in line, line


def test_worker_sh_runs_the_doctor_without_restarts() -> None:
    """A failed check is the doctor's finding: with MAX_RESTARTS or --max-restarts (a platform job's or a pod's
    restarts) torchrun would run it again and print its table again, as often as the restarts allow."""
    result = node_in_process(["--doctor", "--max-restarts", "3", "--nproc-per-node", "1", "--dry-run", "--",
                              *MACHINERY_ARGS], clean_env(PYTHON=sys.executable, MAX_RESTARTS="2"))
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[words.index("--max-restarts") + 1] == "0" and "distqa.doctor" in words, result.stdout
    assert "max restarts 0" in result.stderr
