"""The benchmarks of `make bench` run (``--quick``) and print a complete report, so they cannot rot.

Their figures are not judged here (``--quick`` runs are too short to mean anything, and this machine
is shared): only that each script ends cleanly, pins its threads, and prints every target it promises
with a finite ratio. The speed targets themselves are checked by running ``make bench``.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from support.processes import clean_env
from support.repo import REPO_ROOT

TARGET_LINE = re.compile(r"^(PASS|MISS)  (?P<name>.+?) +(?P<value>-?[0-9.]+|inf|nan)  \(target (<=|>=) [0-9.]+\)$",
                         re.MULTILINE)
# Every script's targets, by the start of their names: a script that stops reporting one fails here.
EXPECTED_TARGETS = {
    "bench/step_overhead.py": ["ours / hand-written loop"],
    "bench/hf_trainer.py": ["ours / hf-run_qa", "ours / hf-best"],
    "bench/optimizations.py": ["padded / trimmed time per step, short documents"],
    "bench/ddp_overhead.py": ["ddp (2 gloo ranks) / 1 process"],
    "bench/comm_hook.py": ["none / bf16 at the slowest link", "none / bf16 on the unthrottled veth", "loss after"],
    "bench/loader_vs_step.py": ["loader / step"],
    "bench/nq_pipeline.py": ["(a) / (b)", "(c) / (a)", "peak RSS", "reading"],
    "bench/tracking_overhead.py": ["with MLflow / TensorBoard alone"],
    "bench/checkpoint_io.py": ["background / no saves", "blocking / background", "background / blocking"],
    "bench/squad_pipeline.py": ["ours / run_qa questions/s, 1 process"],
    "bench/sharding.py": ["fsdp / ddp state per rank at 2 ranks", "fsdp / ddp state per rank at 4 ranks",
                          "fsdp / ddp (2 gloo ranks), time per step"],
}
MULTI_PROCESS = {"bench/ddp_overhead.py", "bench/comm_hook.py", "bench/sharding.py"}
# A script that cannot run on this machine says so in one line (bench/comm_hook.py: no root, no `ip`/`tc`).
SKIP_LINE = re.compile(r"^SKIP  (?P<reason>.+)$", re.MULTILINE)


def bench_scripts() -> list[str]:
    """BENCH_SCRIPTS of make/qa.mk (the QA part's targets, which the Makefile includes): what `make bench` runs."""
    makefile = (REPO_ROOT / "make" / "qa.mk").read_text().replace("\\\n", " ")
    match = re.search(r"^BENCH_SCRIPTS :=(.*)$", makefile, re.MULTILINE)
    assert match, "make/qa.mk has no BENCH_SCRIPTS variable"
    return match.group(1).split()


def test_make_bench_runs_every_benchmark_this_file_checks() -> None:
    scripts = bench_scripts()
    assert sorted(scripts) == sorted(EXPECTED_TARGETS), "BENCH_SCRIPTS and EXPECTED_TARGETS disagree"
    for script in scripts:
        assert (REPO_ROOT / script).is_file(), f"{script} is listed in BENCH_SCRIPTS but does not exist"


@pytest.mark.slow
@pytest.mark.parametrize("script", [
    pytest.param(script, marks=[pytest.mark.distributed] if script in MULTI_PROCESS else [])
    for script in EXPECTED_TARGETS])
def test_quick_run_prints_every_target(script: str) -> None:
    result = subprocess.run([sys.executable, script, "--quick"], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{script} --quick failed:\n{result.stdout}\n{result.stderr}"
    if skipped := SKIP_LINE.search(result.stdout):
        pytest.skip(skipped.group("reason"))
    assert "1 torch thread(s) per process" in result.stdout, result.stdout
    targets = {m.group("name"): float(m.group("value")) for m in TARGET_LINE.finditer(result.stdout)}
    for expected in EXPECTED_TARGETS[script]:
        found = [name for name in targets if name.startswith(expected)]
        assert len(found) == 1, f"{script}: no single target line for {expected!r} in:\n{result.stdout}"
        value = targets[found[0]]
        assert math.isfinite(value) and value > 0, f"{script}: {found[0]} = {value}"
    assert len(targets) == len(EXPECTED_TARGETS[script]), result.stdout
