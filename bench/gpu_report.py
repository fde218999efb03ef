"""The one table of bench/gpu.sh: every part's JSON (gpu_bert, gpu_startup, gpu_inference, gpu_packing, gpu_large,
gpu_sharding, gpu_settings, gpu_flight_recorder, gpu_mfu) and the goals.

    .venv/bin/python bench/gpu_report.py DIR   # DIR: each part's .json (training, startup, …, settings, mfu)

Goals (issue 13), each a PASS/MISS line (harness.Target):

- MFU of our bf16 step on BERT-base at seq 512 (the better of eager and compiled) >= 40 % on one H100;
  "n/a (CPU)" on CPU, and "n/a" on a GPU whose bf16 peak ``distqa.record.throughput`` does not know;
- our samples/s at seq 512 bf16 (the better of eager and compiled) >= 1.3 × the Hugging Face Trainer's
  as run_qa.py configures it (with bf16).

A part that failed has no JSON file, or rows marked FAILED; the report says so, and exits 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from targets import Target  # not harness: it imports torch, which a report of JSON files does not need

MFU_GOAL, HF_GOAL, GOAL_SEQ_LEN = 0.40, 1.3, 512
PARTS = ("training", "startup", "inference", "packing", "large")
OPTIONAL_PARTS = ("sharding", "settings", "flight_recorder", "mfu")
"""Parts that ``bench/gpu.sh --parts`` may leave out without the report counting them as failed."""
MFU_ATTEMPT_GOAL = 0.45


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where bench/gpu.sh's parts wrote their JSON")
    args = parser.parse_args()
    paths = {name: args.directory / f"{name}.json" for name in PARTS + OPTIONAL_PARTS}
    parts = {name: json.loads(path.read_text()) for name, path in paths.items() if path.is_file()}
    if not parts:
        raise SystemExit(f"no results in {args.directory}: every part of bench/gpu.sh failed (see its output above)")
    first = next(iter(parts.values()))
    training = parts.get("training")
    peak = next((part["peak_flops"] for part in parts.values() if part.get("peak_flops")), None)
    print(f"device: {first['device']}; torch {first['torch']}, CUDA {first['cuda'] or 'none'}; "
          + (f"dense bf16 peak {peak / 1e12:.0f} TFLOP/s (distqa.record.throughput)" if peak else "no bf16 peak known"))
    # A part bench/gpu.sh ran has its log beside its JSON: a log without JSON is a failed part; neither, a part
    # that --parts left out (or a report of JSON files written by the parts' scripts alone).
    ran = {name for name in PARTS + OPTIONAL_PARTS if (args.directory / f"{name}.log").is_file()}
    missing = [name for name in PARTS + OPTIONAL_PARTS if name not in parts and (name in ran or (
        not ran and name in PARTS))]
    failed = bool(missing)
    if training:
        failed |= print_training(training)
    if "startup" in parts:
        print_startup(parts["startup"])
    if "inference" in parts:
        print_inference(parts["inference"])
    if "packing" in parts:
        failed |= print_packing(parts["packing"])
    if "large" in parts:
        failed |= print_large(parts["large"])
    if "sharding" in parts:
        failed |= print_sharding(parts["sharding"])
    if "settings" in parts:
        failed |= print_settings(parts["settings"])
    if "flight_recorder" in parts:
        failed |= print_flight_recorder(parts["flight_recorder"])
    if "mfu" in parts:
        failed |= print_mfu(parts["mfu"])
    for name in missing:
        print(f"\n{name}: FAILED, no figures (its error is in bench/gpu.sh's output above)")
    print()
    if training is not None or "training" in missing:
        print_goals(training)
    if failed:
        raise SystemExit(1)


def print_training(part: dict[str, Any]) -> bool:
    """The training table; True when a contender failed."""
    print(f"\ntraining: {part['model']} ({part['parameters'] / 1e6:.1f}M parameters, random weights), "
          f"{part['batch_size']} windows per optimizer step (DummyDataset, padded to the sequence length); median of "
          f"{part['repeats']} × {part['steps']} steps after {part['warmup']} warm-up steps; ours compiles with "
          f"inductor (--compile true), the HF Trainer with {part['compile_backend']}")
    _print_table(("contender", "seq", "samples/s", "tokens/s", "MFU", "peak mem", "warm-up"), [(
        row["name"], str(row["seq_len"]), _figure(row["samples_per_s"], ".1f"), _figure(row["tokens_per_s"], ".0f"),
        _mfu(row["mfu"], part["device_type"]), _figure(row["peak_memory_gib"], ".1f", " GiB"),
        _figure(row["warmup_s"], ".1f", " s")) for row in part["rows"]], part["rows"], header_note="note")
    for seq_len in sorted({row["seq_len"] for row in part["rows"]}):
        ratios = [f"{label} {ours / hf:.3f}" for label, compiled in (("eager", False), ("compile", True))
                  if (ours := _rate(part, "ours", seq_len, compiled)) and (hf := _rate(part, "hf", seq_len, compiled))]
        if ratios:
            print(f"  ours / hf at seq {seq_len}, like for like: {', '.join(ratios)}")
    return any(row["note"].startswith("FAILED") for row in part["rows"])


def print_startup(part: dict[str, Any]) -> None:
    print(f"\nprocess-group start-up, world size 1 (torchrun --standalone --nproc-per-node 1, {part['backend']}):")
    print(f"  launch → distqa runtime ready      {part['launch_to_runtime_s']:8.2f} s   (torchrun agent, imports, "
          "device; no group at world size 1)")
    print(f"  init_process_group, group of one   {part['init_process_group_s']:8.3f} s   "
          "(distqa.distributed.runtime.join_process_group)")
    print(f"  first all-reduce                   {part['first_all_reduce_s']:8.3f} s")


def print_inference(part: dict[str, Any]) -> None:
    print(f"\nevaluation and prediction ({part['model']}, random weights; data/nq-sample at 512 tokens; batch "
          f"{part['batch_size']}; median of {len(part['rows'][0]['repeats'])} calls of the entry point's main):")
    for row in part["rows"]:
        print(f"  {row['name']:<9} {row['windows']:5d} windows  {row['seconds']:7.2f} s  "
              f"{row['windows_per_s']:8.1f} windows/s")


def print_packing(part: dict[str, Any]) -> bool:
    """Padded, trimmed and unpadded batches side by side, and the loss check; True when a row failed."""
    print(f"\nuseful tokens: {part['model']}, bf16, {part['windows']} SQuAD-format windows of {part['seq_len']} "
          f"({part['mean_window_tokens']:.0f} real tokens on average), micro-batch {part['batch_size']}; median of "
          f"{part['repeats']} × {part['steps']} steps after {part['warmup']} warm-up steps; computed = the positions "
          "the model runs on, useful = attention mask 1; MFU of the computed tokens:")
    _print_table(("contender", "samples/s", "computed tokens/s", "useful tokens/s", "MFU", "peak mem", "warm-up"), [(
        row["name"], _figure(row["samples_per_s"], ".1f"), _figure(row["tokens_per_s"], ".0f"),
        _figure(row["useful_tokens_per_s"], ".0f"), _mfu(row["mfu"], part["device_type"]),
        _figure(row["peak_memory_gib"], ".1f", " GiB"), _figure(row["warmup_s"], ".1f", " s")) for row in part["rows"]],
        part["rows"])
    check = part["loss_check"]
    print(Target(f"loss, unpad vs padded, bf16, {check['batches']} batches (relative)",
                 check["max_relative_difference"], check["tolerance"], at_most=True).line()
          + f"; largest absolute difference {check['max_abs_difference']:.2e}")
    return any(row["note"].startswith("FAILED") for row in part["rows"])


def print_large(part: dict[str, Any]) -> bool:
    """The large encoders' rows, the measured peak next to distqa.encoders.memory's estimate; True when a row failed."""
    how = "compiled" if part["compiled"] else "not compiled"
    print(f"\nlarge encoders at seq {part['seq_len']}, bf16, {how} (random weights, DummyDataset windows padded to "
          f"the sequence length); median of {part['repeats']} × {part['steps']} steps after {part['warmup']} warm-up "
          "steps; the estimate is distqa.encoders.memory's for the eager step in one process:")
    header = ("model", "micro-batch", "checkpointing", "samples/s", "MFU", "peak mem", "estimate", "peak/estimate")
    _print_table(header, [(
        row["model"], str(row["micro_batch"]), "on" if row["activation_checkpointing"] else "off",
        _figure(row["samples_per_s"], ".1f"), _mfu(row["mfu"], part["device_type"]),
        _figure(row["peak_memory_gib"], ".2f", " GiB"), _figure(row["estimated_peak_gib"], ".2f", " GiB"),
        _figure(row["peak_memory_gib"] and row["peak_memory_gib"] / row["estimated_peak_gib"], ".2f"),
        ) for row in part["rows"]], part["rows"])
    return any(row["note"].startswith("FAILED") for row in part["rows"])


def print_sharding(part: dict[str, Any]) -> bool:
    """DDP against full sharding on the part's GPUs; True when a row failed."""
    print(f"\nsharding: {part['model']} on {part['world_size']} process(es), seq {part['seq_len']}, micro-batch "
          f"{part['micro_batch']} per process, bf16, not compiled; median of {part['repeats']} × {part['steps']} steps "
          f"after {part['warmup']} warm-up steps (samples/s of the job, MFU per GPU, peak memory of the fullest GPU):")
    _print_table(("data parallel", "samples/s", "MFU", "peak mem"), [(
        row["strategy"], _figure(row["samples_per_s"], ".1f"), _mfu(row["mfu"], part["device_type"]),
        _figure(row["peak_memory_gib"], ".2f", " GiB")) for row in part["rows"]], part["rows"])
    rates = {row["strategy"]: row["samples_per_s"] for row in part["rows"]}
    if rates.get("ddp") and rates.get("fsdp"):
        print(f"  fsdp / ddp samples/s: {rates['fsdp'] / rates['ddp']:.3f}")
    return any(row["note"].startswith("FAILED") for row in part["rows"])


def print_settings(part: dict[str, Any]) -> bool:
    """The DDP settings each changed alone, and the checkpoint writes under the step; True when a row failed."""
    print(f"\nDDP settings: {part['model']} on {part['world_size']} process(es), seq {part['seq_len']}, micro-batch "
          f"{part['micro_batch']} per process, bf16, not compiled; median of {part['repeats']} × {part['steps']} steps "
          f"after {part['warmup']} warm-up steps:")
    rates = {row["setting"]: row["samples_per_s"] for row in part["rows"]}
    _print_table(("setting", "samples/s", "MFU", "this / ddp", "peak mem"), [(
        row["setting"], _figure(row["samples_per_s"], ".1f"), _mfu(row["mfu"], part["device_type"]),
        _figure(row["samples_per_s"] / rates["ddp"] if row["samples_per_s"] and rates.get("ddp") else None, ".3f"),
        _figure(row["peak_memory_gib"], ".2f", " GiB")) for row in part["rows"]], part["rows"])
    checkpoints = part["checkpoints"]
    per_step = checkpoints["seconds_per_step"]
    size = checkpoints["checkpoint_mb"]
    times = ", ".join(f"{name} {1000 * value:.1f} ms" for name, value in per_step.items())
    print(f"  checkpoint every {checkpoints['every']} steps ({_figure(size, '.0f', ' MB')}), seconds per step up to "
          f"the end of the last write: {times}" + (f"  {checkpoints['note']}" if checkpoints["note"] else ""))
    if "no saves" in per_step and len(per_step) > 1:
        print("  " + ", ".join(f"{name} / no saves {value / per_step['no saves']:.3f}" for name, value in
                               per_step.items() if name != "no saves"))
    handler = part.get("peer_loss")
    if handler is not None:
        print(f"  a lost peer's survivors ({handler['backend']}): NCCL error handling {handler['error_handling']} "
              "(2 = CleanUpOnly: the watchdog aborts the collective, the process lives on), NCCL's reported error "
              + (f"{handler['reported_error'] or 'not available'}" if handler["backend"] == "nccl" else "n/a"))
        if rates.get("ddp") and rates.get("save_on_peer_loss off"):
            print(f"  the wait for the collectives before each update: ddp / save_on_peer_loss off "
                  f"{rates['ddp'] / rates['save_on_peer_loss off']:.3f} (goal: >= 0.99)")
    return any(row["note"].startswith("FAILED") for row in part["rows"]) or "FAILED" in checkpoints["note"]


def print_flight_recorder(part: dict[str, Any]) -> bool:
    """Whether a collective that timed out left a flight-recorder dump that fr_trace read; True when it did not."""
    print("\nflight recorder: a one-rank NCCL all-reduce made to time out, its dump read by fr_trace:")
    if not part["attempts"]:
        print(f"  {part['note']}")
        return False
    for attempt in part["attempts"]:
        print(f"  {attempt['names']} variables: child exit {attempt['child_exit']}, dump files "
              f"{attempt['dump_files'] or 'none'} ({attempt['dump_bytes']} bytes), fr_trace exit "
              f"{attempt['fr_trace_exit']}")
        for entry in attempt.get("last_entries", []):
            print(f"    recorded: {entry}")
    last = part["attempts"][-1]
    return not last["dump_files"] or last["fr_trace_exit"] != 0


def print_mfu(part: dict[str, Any]) -> bool:
    """bench/gpu_mfu.py's attempts and the profile of where the step's time goes; True when an attempt failed."""
    print(f"\nMFU attempts: {part['model']} at seq {part['seq_len']}, bf16, micro-batch {part['batch_size']} unless "
          f"named; median of {part['repeats']} × {part['steps']} steps after {part['warmup']} warm-up steps:")
    for row in part["rows"]:
        print(f"  {row['name']:<38} mb {row['micro_batch']:>3}  {_figure(row['samples_per_s'], '8.1f')} samples/s  "
              f"MFU {_mfu(row['mfu'], part['device_type']):>9}  peak {_figure(row['peak_memory_gib'], '.1f', ' GiB')}"
              f"  warm-up {_figure(row['warmup_s'], '.1f', ' s')}  {row['note']}")
    for profile in part["profiles"]:
        if "note" in profile:
            print(f"  profile of '{profile['attempt']}': {profile['note']}")
            continue
        print(f"  profile of '{profile['attempt']}' ({profile['steps']} steps): {profile['wall_ms_per_step']:.1f} ms "
              f"a step, the GPU busy {profile['gpu_busy_ms_per_step']:.1f} ms of it, "
              f"{profile['kernels_per_step']:.0f} kernels a step, {profile['graphs_compiled']} graphs compiled, "
              f"{profile['graph_breaks']} graph breaks")
        for kind, ms in profile["ms_per_step_by_kind"].items():
            print(f"    {kind:<36} {ms:8.2f} ms  {100 * ms / profile['gpu_busy_ms_per_step']:5.1f} % of GPU time")
        if profile["tflops_in_matmul_and_attention"]:
            print(f"    the model's FLOPs over the matrix-product and attention kernels' time: "
                  f"{profile['tflops_in_matmul_and_attention']:.0f} TFLOP/s")
        for kernel in profile["top_kernels"][:8]:
            print(f"    {kernel['ms_per_step']:7.2f} ms  {kernel['calls_per_step']:5.1f}×  [{kernel['kind']}] "
                  f"{kernel['name'][:90]}")
    best = max((row for row in part["rows"] if row["mfu"] is not None and row["micro_batch"] == part["batch_size"]),
               key=lambda row: row["mfu"], default=None)
    name = f"MFU, best attempt at micro-batch {part['batch_size']}"
    if best is not None:
        print(Target(f"{name} ({best['name']})", best["mfu"], MFU_ATTEMPT_GOAL, at_most=False).line())
    return any(row["note"].startswith("FAILED") for row in part["rows"]) or any(
        "note" in profile for profile in part["profiles"])


def print_goals(training: dict[str, Any] | None) -> None:
    """The two goals, PASS/MISS (or n/a with the reason)."""
    mfu_name = f"MFU, ours bf16 seq {GOAL_SEQ_LEN} (best of eager, compile)"
    hf_name = f"ours / hf (run_qa + bf16), seq {GOAL_SEQ_LEN}, samples/s"
    if training is None:
        print(f"n/a   {mfu_name}: the training part failed")
        print(f"n/a   {hf_name}: the training part failed")
        return
    best = max((row for row in training["rows"] if row["framework"] == "ours" and row["precision"] == "bf16"
                and row["seq_len"] == GOAL_SEQ_LEN and row["samples_per_s"]),
               key=lambda row: row["samples_per_s"], default=None)
    if best is None:
        print(f"n/a   {mfu_name}: no figure")
    elif best["mfu"] is None:
        reason = "CPU" if training["device_type"] == "cpu" else \
            "this GPU's bf16 peak is unknown: distqa.record.throughput"
        print(f"n/a   {mfu_name:<52} n/a ({reason})")
    else:
        print(Target(mfu_name, best["mfu"], MFU_GOAL, at_most=False).line())
    hf = _rate(training, "hf", GOAL_SEQ_LEN, compiled=False)
    if best is None or not hf:
        print(f"n/a   {hf_name}: no figure")
    else:
        print(Target(hf_name, best["samples_per_s"] / hf, HF_GOAL, at_most=False).line())


def _rate(part: dict[str, Any], framework: str, seq_len: int, compiled: bool) -> float | None:
    """samples/s of the bf16 contender of ``framework`` at ``seq_len``, eager or compiled; None if it failed."""
    return next((row["samples_per_s"] for row in part["rows"] if row["framework"] == framework
                 and row["precision"] == "bf16" and row["seq_len"] == seq_len and row["compile"] == compiled), None)


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]], sources: list[dict[str, Any]],
                 header_note: str = "") -> None:
    """``rows`` of cells under ``header``, aligned (the first column to the left, the figures to the right), each
    followed by its source row's note."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row, note in zip(table, [header_note, *(source["note"] for source in sources)], strict=True):
        cells = (cell.ljust(width) if i == 0 else cell.rjust(width)
                 for i, (cell, width) in enumerate(zip(row, widths, strict=True)))
        print("  " + "  ".join(cells) + (f"  {note}" if note else ""))


def _figure(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _mfu(value: float | None, device_type: str) -> str:
    if value is not None:
        return f"{100 * value:.1f} %"
    return "n/a (CPU)" if device_type == "cpu" else "n/a"


if __name__ == "__main__":
    main()
