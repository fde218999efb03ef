"""The memory estimate (distqa.tasks.step_memory) against the peak measured on CPU, the doctor's fixes, and the large
presets' comments; the doctor's smallest sharded layout (what sharding divides and adds in the estimate, on a bare
encoder: tests/unit/test_sharding.py).

The measurement: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of the CPU
allocator (c10's ProfiledCPUMemoryReporter: the bytes and address of each); the live bytes, summed in order,
peak where the step's tensors peak. Everything of the step (model, DDP, optimizer, batches) is allocated inside
the profiled block, so the sum starts from nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import BertConfig, DebertaV2Config, PretrainedConfig, XLMRobertaXLConfig

from distqa.config.sources import load_config
from distqa.distributed.ddp import wrap_ddp
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import local_runtime
from distqa.doctor import check_memory
from distqa.encoders.config import TINY_MODEL_DIR
from distqa.encoders.memory import EncoderMemory, count_on_meta
from distqa.qa.config import QAConfig
from distqa.qa.model import build_model, qa_loss
from distqa.tasks import make_task
from distqa.tasks.step_memory import GPU_MEMORY_BYTES, GiB, Step, fixes, needed_bytes, smallest_gpu
from distqa.training.optim import build_optimizer
from distqa.training.preflight import rank_report

from support.processes import clean_env
from support.repo import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
from gpu_common import encoder_config  # the published sizes bench/gpu.sh builds the large encoders from

TOLERANCE = 0.10
"""The estimate must lie within 10 % of the measured peak (docs/FAULT_TOLERANCE.md states the error)."""
PADDING = 8
"""Padding positions at the end of every window: NQ batches hold padding, and the estimate counts its mask."""


def tiny_encoder(kind: str, dropout: float) -> PretrainedConfig:
    """A BERT or a DeBERTa-v3-shaped encoder small enough to run a few steps on CPU in a second."""
    sizes = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512,
             "vocab_size": 1268, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    if kind == "bert":
        return BertConfig(**sizes)
    return DebertaV2Config(**sizes, relative_attention=True, position_buckets=32, norm_rel_ebd="layer_norm",
                           share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                           type_vocab_size=0, max_position_embeddings=512)


def qa_config(model_dir: Path, micro_batch: int, seq_len: int, *flags: str) -> QAConfig:
    return load_config(["--preset", "none", "--model-name-or-path", str(model_dir), "--tokenizer-name-or-path",
                        str(TINY_MODEL_DIR), "--from-scratch", "true", "--max-seq-len", str(seq_len),
                        "--max-question-len", "16", "--per-rank-batch-size", str(micro_batch), "--global-batch-size",
                        str(micro_batch), *flags], environ={}, dotenv_path=os.devnull)


def estimated(config: QAConfig, step: Step) -> int:
    model = count_on_meta(lambda: build_model(config))
    memory = EncoderMemory.of_model(model, model.encoder.config, config.max_seq_len, config.attn_implementation)
    return memory.estimate(step).peak


def measured_peak(config: QAConfig, ddp: bool, trace: Path, steps: int = 2) -> int:
    """Peak bytes of live CPU tensors over ``steps`` training steps as distqa.training.trainer runs them (autocast
    forward, loss, backward, clipping, fused AdamW, gradients set to None), everything allocated inside the profiler."""
    gc.collect()
    batch, seq = config.per_rank_batch_size, config.max_seq_len
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the sizes do not depend on it; the time does, on a machine shared by test runs
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        torch.manual_seed(0)
        model = build_model(config)
        runtime = dataclasses.replace(local_runtime("cpu"), world_size=2) if ddp else local_runtime("cpu")
        trained = wrap_ddp(model, runtime, config)  # DDP over the group of one: its buckets hold the gradients
        optimizer = build_optimizer(model, config, runtime.device)
        precision = Precision.choose(config.precision, runtime.device)
        for _ in range(steps):
            mask = torch.ones(batch, seq, dtype=torch.long)
            mask[:, seq - PADDING:] = 0
            ids = torch.randint(5, 1000, (batch, seq))
            targets = {name: torch.randint(0, seq - PADDING, (batch,)) for name in ("start_positions", "end_positions")}
            inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), **targets,
                      "answer_type": torch.randint(0, 5, (batch,))}
            with precision.autocast():
                loss = qa_loss(trained(ids, mask, inputs["token_type_ids"]), inputs)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, inputs
        del trained, model, optimizer
    torch.set_num_threads(threads)
    profiler.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    live: dict[int, int] = {}
    total = peak = 0
    for event in sorted(events, key=lambda e: (e["ts"], e["args"]["Ev Idx"])):
        size, address = event["args"]["Bytes"], event["args"]["Addr"]
        if size > 0:
            live[address] = size
            total += size
            peak = max(peak, total)
        elif address in live:  # a free of a block allocated in the block (others are not ours)
            total -= live.pop(address)
    return peak


# (encoder, dropout, micro-batch, seq, precision, attention, activation checkpointing, DDP)
SHAPES = [
    ("bert", 0.1, 8, 128, "fp32", "eager", False, True),  # fp32, seq x seq probabilities, CPU dropout noise
    ("bert", 0.0, 8, 128, "bf16", "sdpa", False, True),  # bf16 autocast, SDPA's fused CPU kernel
    ("bert", 0.1, 4, 256, "bf16", "sdpa", False, False),  # SDPA's math path (fp32); gradients made in the backward
    ("bert", 0.1, 16, 128, "bf16", "eager", True, True),  # activation checkpointing
    ("deberta", 0.1, 4, 128, "bf16", "eager", False, True),  # disentangled attention
    ("deberta", 0.1, 4, 128, "bf16", "eager", True, True),
]


@pytest.mark.parametrize(("kind", "dropout", "micro_batch", "seq_len", "precision", "attention", "checkpointing",
                          "ddp"), SHAPES, ids=["-".join(map(str, shape)) for shape in SHAPES])
def test_the_estimate_is_within_10_percent_of_the_peak_measured_on_cpu(
        kind: str, dropout: float, micro_batch: int, seq_len: int, precision: str, attention: str,
        checkpointing: bool, ddp: bool, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if ddp:
        request.getfixturevalue("group_of_one")
    tiny_encoder(kind, dropout).save_pretrained(tmp_path / "model")
    config = qa_config(tmp_path / "model", micro_batch, seq_len, "--precision", precision, "--attn-implementation",
                       attention, "--activation-checkpointing", str(checkpointing).lower())
    measured = measured_peak(config, ddp, tmp_path / "trace.json")
    estimate = estimated(config, Step(micro_batch, precision, "cpu", checkpointing, gradients_persist=ddp))
    assert abs(estimate / measured - 1) <= TOLERANCE, \
        f"estimated {estimate / 2**20:.2f} MiB, measured {measured / 2**20:.2f} MiB ({estimate / measured:.3f})"


def large(name: str, tmp_path: Path, *flags: str) -> QAConfig:
    encoder_config(name).save_pretrained(tmp_path / name)
    attention = "eager" if name.startswith("deberta") else "sdpa"
    return qa_config(tmp_path / name, 32, 512, "--attn-implementation", attention, *flags)


def test_parameters_are_counted_on_the_meta_device_as_built(tmp_path: Path) -> None:
    """The meta model has the real one's parameters, and BERT-base's count is the one bench/gpu.sh logged on a GPU."""
    tiny_encoder("deberta", 0.1).save_pretrained(tmp_path / "model")
    config = qa_config(tmp_path / "model", 8, 128, "--attn-implementation", "eager")
    counted = count_on_meta(lambda: build_model(config))
    assert all(p.is_meta for p in counted.parameters())
    assert sum(p.numel() for p in counted.parameters()) == sum(p.numel() for p in build_model(config).parameters())
    encoder_config("bert-base").save_pretrained(tmp_path / "bert-base")
    base = count_on_meta(lambda: build_model(qa_config(tmp_path / "bert-base", 32, 512)))
    assert round(sum(p.numel() for p in base.parameters()) / 1e5) == 1089  # 108.9 M (docs/PERFORMANCE.md, "GPU")


def test_the_estimate_of_bert_base_on_an_h100_is_within_10_percent_of_its_measured_peak(tmp_path: Path) -> None:
    """The one GPU measurement there is (docs/PERFORMANCE.md, "GPU": eager bf16, one process, micro-batch 32):
    7.9 GiB at seq 512 and 6.2 GiB at seq 384 (torch.cuda.max_memory_allocated)."""
    encoder_config("bert-base").save_pretrained(tmp_path / "bert-base")
    for seq_len, measured_gib in ((512, 7.9), (384, 6.2)):
        config = qa_config(tmp_path / "bert-base", 32, seq_len)
        estimate = estimated(config, Step(32, "bf16", "cuda", gradients_persist=False)) / GiB
        assert abs(estimate / measured_gib - 1) <= TOLERANCE, (seq_len, estimate)


def test_the_fixes_name_the_largest_micro_batch_that_fits_checkpointing_and_the_smallest_gpu(tmp_path: Path) -> None:
    config = large("bert-large", tmp_path)
    model = count_on_meta(lambda: build_model(config))
    memory = EncoderMemory.of_model(model, model.encoder.config, 512)
    step = Step(32, "bf16", "cuda")
    l4 = 24.1e9
    peak = memory.estimate(step).peak
    assert needed_bytes(peak) > l4 and smallest_gpu(peak) == "A100 40GB"
    found = fixes(memory, step, int(l4), allowed_micro_batch=lambda n: 64 % n == 0, can_checkpoint=True)
    micro_batch = int(re.search(r"--per-rank-batch-size (\d+)", found[0])[1])
    assert micro_batch == 16  # of the divisors of 64: 16 fits, 32 does not
    assert needed_bytes(memory.estimate(dataclasses.replace(step, micro_batch=16)).peak) <= l4
    assert found[1].startswith("--activation-checkpointing true")
    assert needed_bytes(memory.estimate(dataclasses.replace(step, activation_checkpointing=True)).peak) <= l4
    assert found[2] == "a GPU with more memory (A100 40GB or larger)"
    assert fixes(memory, dataclasses.replace(step, activation_checkpointing=True), int(l4), lambda n: True,
                 can_checkpoint=True)[-1] == "a GPU with more memory (L4 or A10G (24 GB) or larger)"


PRESET_ENCODERS = {"bert-large-nq": "bert-large", "roberta-large-nq": "roberta-large",
                   "deberta-v3-large-nq": "deberta-v3-large"}


@pytest.mark.parametrize("preset", PRESET_ENCODERS)
def test_the_large_presets_state_their_estimated_memory_and_smallest_gpu(preset: str, tmp_path: Path) -> None:
    """The comment's figures are what distqa.tasks.step_memory estimates for the preset (its micro-batch, checkpointing
    and precision, with DDP) on the encoder's published sizes, with and without activation checkpointing."""
    text = (REPO_ROOT / "configs" / f"{preset}.toml").read_text()
    given = load_config(["--preset", preset, "--model-name-or-path", str(TINY_MODEL_DIR)],
                        environ={"DISTQA_NQ_TRAIN_FILE": "data/nq-sample/simplified-nq-train.jsonl"},
                        dotenv_path=os.devnull)
    encoder_config(PRESET_ENCODERS[preset]).save_pretrained(tmp_path / "encoder")
    config = dataclasses.replace(given, model_name_or_path=str(tmp_path / "encoder"), from_scratch=True)
    model = count_on_meta(lambda: build_model(config))
    memory = EncoderMemory.of_model(model, model.encoder.config, config.max_seq_len, config.attn_implementation)
    precision = "bf16" if config.precision == "auto" else config.precision
    step = Step(config.per_rank_batch_size, precision, "cuda", config.activation_checkpointing)
    peak = memory.estimate(step).peak
    stated = re.search(r"# Memory per GPU, estimated: ([0-9.]+) GiB \(micro-batch (\d+) x (\d+) tokens", text)
    assert stated, f"configs/{preset}.toml states no estimated memory per GPU"
    assert (float(stated[1]), int(stated[2]), int(stated[3])) == (round(peak / GiB, 1), config.per_rank_batch_size,
                                                                  config.max_seq_len)
    assert f"Smallest GPU: {smallest_gpu(peak)}." in text
    other = memory.estimate(dataclasses.replace(step, activation_checkpointing=not step.activation_checkpointing))
    flag = f"--activation-checkpointing {str(not step.activation_checkpointing).lower()}"
    assert re.search(rf"{flag}[^:]*: {round(other.peak / GiB, 1)} GiB", text), f"no line for {flag} in {preset}"


def test_the_doctor_fails_a_preset_that_does_not_fit_naming_the_fixes(tmp_path: Path) -> None:
    """`python -m distqa.doctor --preset bert-large-nq --gpu-memory-gb 24` on this CPU machine: the check as
    if each rank had a 24 GB GPU, with BERT-large's published config in a local folder (no hub here)."""
    encoder_config("bert-large").save_pretrained(tmp_path / "bert-large")
    command = [sys.executable, "-m", "distqa.doctor", "--preset", "bert-large-nq", "--task", "dummy",
               "--model-name-or-path", str(tmp_path / "bert-large"), "--tokenizer-name-or-path", str(TINY_MODEL_DIR),
               "--from-scratch", "true", "--output-dir", str(tmp_path / "results")]
    result = subprocess.run([*command, "--gpu-memory-gb", "24"], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "memory per rank: 22.1 GiB at the forward end" in result.stdout
    [failure] = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert failure.startswith("FAIL rank 0 (") and "memory: a training step needs about 25.4 GiB" in failure
    assert "a GPU of 24 GB (--gpu-memory-gb) has 22.4 GiB" in failure
    assert "fix: --per-rank-batch-size 16 (the largest that fits: 13.8 GiB" in failure
    assert "or --activation-checkpointing true (7.6 GiB" in failure and "(A100 40GB or larger)" in failure


def test_each_rank_is_checked_against_its_own_gpu(tmp_path: Path) -> None:
    """Two ranks on different GPUs (their reports as CUDA would fill them): only the small one fails."""
    config = large("bert-large", tmp_path, "--global-batch-size", "64", "--output-dir", str(tmp_path))
    runtime = dataclasses.replace(local_runtime("cpu"), world_size=2)
    reports = [dataclasses.replace(rank_report(config, runtime), rank=rank, device_memory_bytes=int(total))
               for rank, total in enumerate((85.0e9, 24.1e9))]
    line = check_memory(config, runtime, reports, make_task(config), gpu_memory_gb=0)
    assert line.startswith("memory per rank: 22.1 GiB") and "on CUDA" in line
    assert reports[0].problems == []
    [problem] = reports[1].problems
    assert "this GPU has 22.4 GiB" in problem and "--per-rank-batch-size 16" in problem


def bert_large_memory(tmp_path: Path) -> EncoderMemory:
    config = large("bert-large", tmp_path)
    model = count_on_meta(lambda: build_model(config))
    return EncoderMemory.of_model(model, model.encoder.config, 512)


def doctor_line(config: QAConfig, world_size: int, gpu_memory_gb: float) -> tuple[str, list[str]]:
    """check_memory's output and rank 0's problems at ``world_size`` ranks of one node, on GPUs of this size."""
    runtime = dataclasses.replace(local_runtime("cpu"), world_size=world_size, local_world_size=world_size)
    reports = [rank_report(config, runtime)]
    return check_memory(config, runtime, reports, make_task(config), gpu_memory_gb), reports[0].problems


def test_the_doctor_names_the_layout_and_the_smallest_sharded_one_that_fits(tmp_path: Path) -> None:
    """BERT-large does not fit ddp on a GPU of 22.5 GB; full sharding on 4 GPUs does (on 2 it does not), which the
    line says, with hybrid sharding on nodes of 4; with fsdp on 2 GPUs the estimate is fsdp's, and still names 4."""
    config = large("bert-large", tmp_path, "--global-batch-size", "64", "--grow-global-batch", "true",
                   "--output-dir", str(tmp_path))
    memory = bert_large_memory(tmp_path)
    total = int(22.5e9)
    needed = {gpus: needed_bytes(memory.estimate(Step(32, "bf16", "cuda", data_parallel="fsdp", shards=gpus,
                                                      accumulation_steps=max(1, 64 // (32 * gpus)))).peak)
              for gpus in (2, 4)}
    assert needed[2] > total >= needed[4]
    text, problems = doctor_line(config, 1, 22.5)
    line, advice = text.splitlines()
    assert "estimated for ddp (a whole replica on every rank)" in line
    assert advice == ("memory: does not fit with ddp on a GPU of 22.5 GB (needs 25.4 GiB per GPU); fits with full "
                      f"sharding (--data-parallel fsdp) on ≥ 4 GPUs ({needed[4] / GiB:.1f} GiB per GPU), or with "
                      "hybrid sharding (--data-parallel hsdp) on nodes of ≥ 4 GPUs")
    [problem] = problems
    assert "or --data-parallel fsdp on ≥ 4 GPUs" in problem and problem.endswith("(A100 40GB or larger)")
    sharded = dataclasses.replace(config, data_parallel="fsdp")
    text, _ = doctor_line(sharded, 2, 22.5)
    assert "estimated for fsdp (weights, gradients and AdamW state sharded over 2 rank(s))" in text
    assert f"does not fit with fsdp over 2 GPU(s) on a GPU of 22.5 GB (needs {needed[2] / GiB:.1f} GiB" in text
    assert "fits with full sharding (--data-parallel fsdp) on ≥ 4 GPUs" in text
    text, _ = doctor_line(config, 1, 80)
    assert len(text.splitlines()) == 1  # it fits: no advice


def test_the_doctor_says_what_to_change_when_no_sharding_fits(tmp_path: Path) -> None:
    """On a 12 GB GPU BERT-large's 16 GiB of activations (micro-batch 32 × 512) fit no layout: sharding does not
    divide them. Without grow_global_batch the global batch of 64 splits over 2 GPUs at most, and the line says so."""
    grown = large("bert-large", tmp_path, "--global-batch-size", "64", "--grow-global-batch", "true",
                  "--output-dir", str(tmp_path))
    for config, gpus in ((grown, 512), (dataclasses.replace(grown, grow_global_batch=False), 2)):
        text, _ = doctor_line(config, 1, 12)
        advice = text.splitlines()[1]
        assert advice.startswith("memory: does not fit with ddp on a GPU of 12 GB (needs 25.4 GiB per GPU); nor "
                                 f"with full sharding on up to {gpus} GPUs (still ")
        assert ("--grow-global-batch true lets it grow" in advice) == (gpus == 2)
        assert advice.endswith("not the activations; use a smaller --per-rank-batch-size, "
                               "--activation-checkpointing true, or a GPU with more memory")


def test_the_xlm_roberta_xl_preset_states_its_estimate_per_gpu_count(tmp_path: Path) -> None:
    """configs/xlm-roberta-xl-squad.toml: the fsdp row, the smallest GPUs, the ddp figure and the doctor's line in
    its comment are what distqa.tasks.step_memory estimates on XLM-RoBERTa-XL's published sizes (XLMRobertaXLConfig's
    defaults
    are facebook/xlm-roberta-xl's), at the preset's global batch and micro-batch on 1 to 64 GPUs."""
    text = (REPO_ROOT / "configs" / "xlm-roberta-xl-squad.toml").read_text()
    XLMRobertaXLConfig().save_pretrained(tmp_path / "encoder")
    config = load_config(["--preset", "xlm-roberta-xl-squad", "--model-name-or-path", str(tmp_path / "encoder"),
                          "--tokenizer-name-or-path", str(TINY_MODEL_DIR), "--from-scratch", "true",
                          "--output-dir", str(tmp_path)], environ={}, dotenv_path=os.devnull)
    assert config.data_parallel == "fsdp" and config.activation_checkpointing
    model = count_on_meta(lambda: build_model(config))
    memory = EncoderMemory.of_model(model, model.encoder.config, config.max_seq_len, config.attn_implementation)
    assert round(memory.parameters / 1e8) == 35  # 3.5 B, as the model card says

    def peak(data_parallel: str, gpus: int) -> int:
        steps = config.for_world_size(gpus).accumulation_steps(gpus)
        return memory.estimate(Step(32, "bf16", "cuda", True, data_parallel=data_parallel,
                                    shards=gpus if data_parallel == "fsdp" else 1, accumulation_steps=steps)).peak

    gpus = [int(n) for n in re.search(r"#   GPUs((?:\s+\d+)+)", text)[1].split()]
    row = [float(n) for n in re.search(r"#   fsdp GiB((?:\s+[0-9.]+)+)", text)[1].split()]
    assert gpus == [1, 2, 4, 8, 16, 32, 64] and row == [round(peak("fsdp", n) / GiB, 1) for n in gpus]
    ddp = {round(peak("ddp", n) / GiB, 1) for n in gpus}
    assert len(ddp) == 1 and f"With --data-parallel ddp: {ddp.pop()} GiB on any number of GPUs" in text
    a100_40, a100_80 = GPU_MEMORY_BYTES[1][1], GPU_MEMORY_BYTES[2][1]
    assert needed_bytes(peak("ddp", 1)) > GPU_MEMORY_BYTES[1][0] and smallest_gpu(peak("ddp", 1)) == a100_80
    smallest = [smallest_gpu(peak("fsdp", n)) for n in gpus]
    assert smallest == [a100_80] + [a100_40] * 2 + [GPU_MEMORY_BYTES[0][1]] * 4
    prose = " ".join(line.lstrip("# ") for line in text.splitlines())
    assert f"Smallest GPU: {a100_80} on 1 GPU, {a100_40} on 2 or 4, {GPU_MEMORY_BYTES[0][1]} from 8 on." in prose
    gb, quoted = re.search(r'The doctor with --data-parallel ddp --gpu-memory-gb ([0-9.]+) [^"]*"([^"]+)"',
                           prose).groups()
    assert float(gb) * 1e9 == GPU_MEMORY_BYTES[1][0]  # an A100 40GB
    advice = doctor_line(dataclasses.replace(config, data_parallel="ddp"), 1, float(gb))[0].splitlines()[1]
    assert advice.startswith(f"memory: {quoted}")
