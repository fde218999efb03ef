"""bench/gpu.sh runs end to end on CPU (``--device cpu --quick``: the tiny model, gloo), so that the GPU
script is not first run on a rented GPU. Its figures are meaningless here; what is checked is that every
part (training contenders, process-group start-up, evaluate and predict, padded vs unpadded batches, ddp vs
fsdp, DDP's settings and checkpoint writes, the flight recorder's part) ran and reached the report, and that
asking for CUDA on a machine without it gives one line that says what to do.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from support.processes import clean_env
from support.repo import REPO_ROOT

GPU_SH = REPO_ROOT / "bench" / "gpu.sh"


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.distributed  # the start-up part runs under torchrun
@pytest.mark.timeout(1100)  # above the run's own guard: the suite's 600 s would cut it first on a slow machine
def test_gpu_sh_smoke_run_on_cpu_reaches_every_part_of_the_report(tmp_path) -> None:
    out = tmp_path / "gpu"
    # A hang guard: 2-4 minutes alone; beside the suite and two CPU hogs, a slow machine took over 7 (nine parts,
    # three of them under torchrun).
    result = subprocess.run(["bash", str(GPU_SH), "--device", "cpu", "--quick", "--out", str(out)], cwd=REPO_ROOT,
                            env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=1000)
    assert result.returncode == 0, f"bench/gpu.sh failed:\n{result.stdout}\n{result.stderr}"

    training = json.loads((out / "training.json").read_text())
    rows = {row["name"]: row for row in training["rows"]}
    assert set(rows) == {"ours bf16", "ours bf16 compile", "ours fp16", "hf bf16", "hf bf16 compile"}
    for name, row in rows.items():
        if name == "ours fp16":  # needs a CUDA GPU: the row says so instead of a figure
            assert row["samples_per_s"] is None and "CUDA" in row["note"]
        elif name == "ours bf16 compile":  # no cold inductor compile in a smoke run on CPU: the row says so
            assert row["samples_per_s"] is None and "--quick on CPU" in row["note"]
        else:
            assert row["samples_per_s"] > 0 and "FAILED" not in row["note"], row
    startup = json.loads((out / "startup.json").read_text())
    assert startup["backend"] == "gloo" and startup["init_process_group_s"] >= 0
    inference = json.loads((out / "inference.json").read_text())
    assert {row["name"] for row in inference["rows"]} == {"evaluate", "predict"}
    assert all(row["windows"] > 0 and row["seconds"] > 0 for row in inference["rows"])
    packing = json.loads((out / "packing.json").read_text())  # padded vs trimmed vs unpadded SQuAD windows
    rows = {row["name"]: row for row in packing["rows"]}
    assert set(rows) == {f"{layout}{suffix}" for layout in ("padded", "trim", "unpad") for suffix in ("", " compile")}
    for layout in ("padded", "trim", "unpad"):
        assert rows[layout]["samples_per_s"] > 0 and "FAILED" not in rows[layout]["note"], rows[layout]
        assert rows[f"{layout} compile"]["samples_per_s"] is None  # no cold inductor compile on CPU
    assert rows["unpad"]["tokens_per_s"] == rows["unpad"]["useful_tokens_per_s"]  # it computes the real tokens only
    assert rows["padded"]["tokens_per_s"] > rows["padded"]["useful_tokens_per_s"]
    assert packing["loss_check"]["max_relative_difference"] <= packing["loss_check"]["tolerance"]
    large = json.loads((out / "large.json").read_text())  # the large encoders' families at tiny sizes
    rows = {(row["model"], row["micro_batch"], row["activation_checkpointing"]): row for row in large["rows"]}
    assert {model for model, _, _ in rows} == {f"{name} (tiny sizes)" for name in ("bert-large", "roberta-large",
                                                                                  "deberta-v3-large")}
    assert len(rows) == 12 and not large["compiled"]
    assert all(row["samples_per_s"] > 0 and row["estimated_peak_gib"] > 0 and "FAILED" not in row["note"]
               for row in rows.values()), large["rows"]

    sharding = json.loads((out / "sharding.json").read_text())  # ddp against fsdp, one process under torchrun
    assert sharding["world_size"] == 1 and [row["strategy"] for row in sharding["rows"]] == ["ddp", "fsdp"]
    assert all(row["samples_per_s"] > 0 and "FAILED" not in row["note"] for row in sharding["rows"]), sharding
    assert "only the wrap's overhead" in sharding["rows"][1]["note"]

    settings = json.loads((out / "settings.json").read_text())  # DDP's settings alone, checkpoints under the step
    assert [row["setting"] for row in settings["rows"]] == ["ddp", "pin_memory off", "batched_grad_copy",
                                                             "bf16 comm hook", "save_on_peer_loss off"]
    assert settings["peer_loss"] == {"error_handling": "2", "reported_error": None, "backend": "gloo"}
    assert all(row["samples_per_s"] > 0 and "FAILED" not in row["note"] for row in settings["rows"]), settings
    checkpoints = settings["checkpoints"]
    assert checkpoints["note"] == "" and checkpoints["checkpoint_mb"] > 0, checkpoints
    assert set(checkpoints["seconds_per_step"]) == {"no saves", "blocking", "background"}
    flight_recorder = json.loads((out / "flight_recorder.json").read_text())  # NCCL only: the part says so on CPU
    assert flight_recorder["attempts"] == [] and "gloo" in flight_recorder["note"]

    mfu = json.loads((out / "mfu.json").read_text())  # the attempts' code paths that run without a compile
    attempts = {row["name"]: row for row in mfu["rows"]}
    assert attempts["eager"]["samples_per_s"] > 0 and attempts["eager, bf16 weights"]["samples_per_s"] > 0
    assert all("--quick on CPU" in row["note"] for row in mfu["rows"] if row["compile"]), mfu["rows"]
    [profile] = mfu["profiles"]
    assert profile["attempt"] == "eager" and profile["wall_ms_per_step"] > 0

    report = result.stdout
    headings = ("training: tiny", "process-group start-up", "evaluation and prediction", "useful tokens: tiny",
                "large encoders at seq 64", "sharding: bert-large (tiny sizes) on 1 process(es)",
                "DDP settings: tiny on 1 process(es)", "flight recorder: a one-rank NCCL all-reduce",
                "MFU attempts: tiny at seq 64", "a lost peer's survivors (gloo): NCCL error handling 2",
                "the wait for the collectives before each update: ddp / save_on_peer_loss off")
    for heading in headings:
        assert heading in report, report
    assert re.search(r"^(PASS|MISS)  ours / hf \(run_qa \+ bf16\), seq 512, samples/s +[0-9.]+", report, re.MULTILINE)
    assert re.search(r"^n/a   MFU, ours bf16 seq 512", report, re.MULTILINE), report
    assert re.search(r"^PASS  loss, unpad vs padded, bf16", report, re.MULTILINE), report


def test_gpu_sh_parts_runs_only_those_and_the_report_names_none_missing(tmp_path) -> None:
    out = tmp_path / "gpu"
    # The cheapest part on CPU (one line on why gloo has no flight recorder): the smoke run above runs every part.
    result = subprocess.run(["bash", str(GPU_SH), "--device", "cpu", "--quick", "--parts", "flight_recorder", "--out",
                             str(out)], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"bench/gpu.sh failed:\n{result.stdout}\n{result.stderr}"
    assert sorted(path.name for path in out.iterdir()) == ["flight_recorder.json", "flight_recorder.log"]
    assert "flight recorder:" in result.stdout and "FAILED" not in result.stdout, result.stdout
    assert "MFU attempts" not in result.stdout, result.stdout
    refused = subprocess.run(["bash", str(GPU_SH), "--parts", "mfu,warp"], cwd=REPO_ROOT, env=clean_env(),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown part 'warp'" in refused.stderr


def test_gpu_bench_without_cuda_says_so_in_one_line() -> None:
    result = subprocess.run([sys.executable, "bench/gpu_bert.py", "--device", "cuda", "--quick"], cwd=REPO_ROOT,
                            env=clean_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "--device cuda but torch sees no CUDA GPU" in result.stderr and "--device cpu" in result.stderr


def test_scaling_model_is_consistent_arithmetic() -> None:
    """bench/scaling_model.py: the bf16 hook halves the bandwidth needed, accumulation never lowers the
    efficiency, and the 2020 recipe's implied bandwidth halves when its assumed step time doubles."""
    result = subprocess.run([sys.executable, "bench/scaling_model.py", "--h100-samples-per-s", "800"], cwd=REPO_ROOT,
                            env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    bandwidth_row = re.compile(r"^  (?P<model>bert-\S+(?: bf16 hook)?) +[0-9.]+M +[0-9]+ MB.*?ms.*?ms(?P<cells>.*)$",
                               re.MULTILINE)
    needed = {m["model"].strip(): [float(x) for x in re.findall(r"([0-9.]+) Gbit/s", m["cells"])]
              for m in bandwidth_row.finditer(result.stdout)}
    assert set(needed) == {"bert-base", "bert-base bf16 hook", "bert-large", "bert-large bf16 hook"}, result.stdout
    for model in ("bert-base", "bert-large"):
        for fp32, bf16 in zip(needed[model], needed[f"{model} bf16 hook"], strict=True):
            assert abs(fp32 / bf16 - 2) < 0.05, (model, fp32, bf16)
    efficiency = re.findall(r"^  (bert-\S+(?: bf16 hook)?) +([14])  ((?: +[0-9]+%)+)$", result.stdout, re.MULTILINE)
    by_k = {(model, k): [int(x) for x in re.findall(r"([0-9]+)%", cells)] for model, k, cells in efficiency}
    assert len(by_k) == 8, result.stdout
    for (model, k), values in by_k.items():
        assert values == sorted(values) and all(0 < v <= 100 for v in values), (model, k, values)
        if k == "4":
            assert all(four >= one for four, one in zip(values, by_k[(model, "1")], strict=True))
    recipe = [(float(step), float(low)) for step, low in
              re.findall(r"^ +([0-9]+) ms +([0-9.]+) to +[0-9.]+ Gbit/s$", result.stdout, re.MULTILINE)]
    assert len(recipe) >= 3, result.stdout
    assert abs(recipe[0][0] * recipe[0][1] - recipe[-1][0] * recipe[-1][1]) / (recipe[0][0] * recipe[0][1]) < 0.05


def test_an_mfu_attempt_whose_process_dies_is_a_failed_row_and_the_part_goes_on(tmp_path) -> None:
    """Each attempt of bench/gpu_mfu.py runs in a process of its own; one that dies without figures (killed, a crash
    in a kernel) becomes a FAILED row and a FAILED profile, the part still writes its JSON, and it exits 1."""
    killer = tmp_path / "site"
    killer.mkdir()
    # Python imports sitecustomize at start-up: this one ends every attempt's process at once, exit code 9.
    (killer / "sitecustomize.py").write_text('import os, sys\nif "--attempt" in sys.argv:\n    os._exit(9)\n')
    figures = tmp_path / "mfu.json"
    result = subprocess.run([sys.executable, "bench/gpu_mfu.py", "--device", "cpu", "--quick", "--only", "eager",
                             "compiled", "--json", str(figures)], cwd=REPO_ROOT,
                            env=clean_env(OMP_NUM_THREADS="1", PYTHONPATH=f"{killer}:{REPO_ROOT / 'src'}"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    part = json.loads(figures.read_text())
    eager, compiled = part["rows"]
    assert eager["name"] == "eager" and eager["samples_per_s"] is None
    assert eager["note"] == "FAILED: its process ended with exit code 9 and no figures (its log is above)"
    assert compiled["note"] == "n/a (--quick on CPU: no inductor compile)"  # no process needed, none started
    assert part["profiles"] == [{"attempt": "eager", "note": eager["note"]}]
