"""bench/gpu.sh runs end to end on CPU (``--device cpu --quick``: the tiny model, gloo), so that the GPU
script is not first run on a rented GPU. Its figures are meaningless here; what is checked is that every
part (training contenders, process-group start-up, evaluate and predict) ran and reached the report, and
that asking for CUDA on a machine without it gives one line that says what to do.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, clean_env

GPU_SH = REPO_ROOT / "bench" / "gpu.sh"


@pytest.mark.distributed  # the start-up part runs under torchrun
def test_gpu_sh_smoke_run_on_cpu_reaches_every_part_of_the_report(tmp_path) -> None:
    out = tmp_path / "gpu"
    result = subprocess.run(["bash", str(GPU_SH), "--device", "cpu", "--quick", "--out", str(out)], cwd=REPO_ROOT,
                            env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"bench/gpu.sh failed:\n{result.stdout}\n{result.stderr}"

    training = json.loads((out / "training.json").read_text())
    rows = {row["name"]: row for row in training["rows"]}
    assert set(rows) == {"ours bf16", "ours bf16 compile", "ours fp16", "hf bf16", "hf bf16 compile"}
    for name, row in rows.items():
        if name == "ours fp16":  # needs a CUDA GPU: the row says so instead of a figure
            assert row["samples_per_s"] is None and "CUDA" in row["note"]
        else:
            assert row["samples_per_s"] > 0 and "FAILED" not in row["note"], row
    startup = json.loads((out / "startup.json").read_text())
    assert startup["backend"] == "gloo" and startup["init_process_group_s"] >= 0
    inference = json.loads((out / "inference.json").read_text())
    assert {row["name"] for row in inference["rows"]} == {"evaluate", "predict"}
    assert all(row["windows"] > 0 and row["seconds"] > 0 for row in inference["rows"])

    report = result.stdout
    for heading in ("training: tiny", "process-group start-up", "evaluation and prediction"):
        assert heading in report, report
    assert re.search(r"^(PASS|MISS)  ours / hf \(run_qa \+ bf16\), seq 512, samples/s +[0-9.]+", report, re.MULTILINE)
    assert re.search(r"^n/a   MFU, ours bf16 seq 512", report, re.MULTILINE), report


def test_gpu_bench_without_cuda_says_so_in_one_line() -> None:
    result = subprocess.run([sys.executable, "bench/gpu_bert.py", "--device", "cuda", "--quick"], cwd=REPO_ROOT,
                            env=clean_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "--device cuda but torch sees no CUDA GPU" in result.stderr and "--device cpu" in result.stderr
