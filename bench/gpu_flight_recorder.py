"""A real NCCL flight-recorder dump, left by a collective that times out, read back by torchfrtrace.

    python3 bench/gpu_flight_recorder.py --json DIR/flight_recorder.json   # one GPU, about 30 s
    bench/gpu.sh --parts flight_recorder
    bench/gpu.sh --device cpu --quick --parts flight_recorder          # CPU: says why there is nothing to read

A child process joins a one-rank NCCL group with the variables scripts/worker.sh exports (TORCH_FR_BUFFER_SIZE,
TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_NCCL_ASYNC_ERROR_HANDLING=3) and a 5 s timeout, runs
three all-reduces, then queues a fourth behind a GPU kernel that spins for a minute (``torch.cuda._sleep``): the
collective cannot finish, NCCL's watchdog times it out, dumps the recorder to ``<dir>/rank_0`` and tears the
process down, as on a hung node. Then ``python -m torch.distributed.flight_recorder.fr_trace`` (the
``torchfrtrace`` console script) reads the folder as docs/FAULT_TOLERANCE.md ("Reading the flight recorder") says.
If torch writes nothing under 2.13's variable names, the child runs once more with the older names
(TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE), and the figures say which names worked.
On CPU there is nothing to read: gloo keeps no watchdog that writes the recorder out (docs/FAULT_TOLERANCE.md).
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from gpu_common import check_device, write_part

TIMEOUT_S = 5
NAMES = {
    "torch 2.13 (worker.sh)": {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "{dir}/rank_"},
    "older": {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "{dir}/rank_"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="the same check (it is short already)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here for bench/gpu_report.py")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        hang_in_a_collective(args.child)
        return
    device = check_device(args.device)
    if device.type != "cuda":
        write_part(args.json, "flight_recorder", device, attempts=[],
                   note="n/a on CPU: gloo keeps no watchdog that writes the flight recorder out")
        return
    attempts = []
    with tempfile.TemporaryDirectory(prefix="bench-flight-recorder-") as work:
        for names, variables in NAMES.items():
            folder = Path(work) / names.split()[0]
            folder.mkdir()
            attempt = dump_and_read(folder, {name: value.format(dir=folder) for name, value in variables.items()})
            attempts.append({"names": names, **attempt})
            if attempt["dump_files"]:
                break
    write_part(args.json, "flight_recorder", device, attempts=attempts, note="")
    if not attempts[-1]["dump_files"] or attempts[-1]["fr_trace_exit"] != 0:
        raise SystemExit(1)


def dump_and_read(folder: Path, variables: dict[str, str]) -> dict[str, Any]:
    """Run the hanging child with ``variables``; what it left in ``folder`` and what fr_trace made of it."""
    env = os.environ | variables | {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    try:
        child = subprocess.run([sys.executable, __file__, "--child", str(folder)], env=env, capture_output=True,
                               text=True, timeout=150)
        child_exit, child_log = child.returncode, child.stdout + child.stderr
    except subprocess.TimeoutExpired as err:
        child_exit, child_log = None, f"hang guard: the child ran past {err.timeout} s"
    dumps = sorted(path for path in folder.iterdir() if path.name.startswith("rank_"))
    result: dict[str, Any] = {"child_exit": child_exit, "child_log_tail": child_log.strip().splitlines()[-8:],
                              "dump_files": [path.name for path in dumps],
                              "dump_bytes": sum(path.stat().st_size for path in dumps)}
    if not dumps:
        return result | {"fr_trace_exit": None}
    try:  # the default dump format is a pickled dict (torch's FlightRecorder.hpp, dump_entries)
        with dumps[0].open("rb") as file:
            entries = pickle.load(file).get("entries", [])
        result["entries"] = len(entries)
        result["last_entries"] = [{key: entry.get(key) for key in ("profiling_name", "collective_seq_id", "state")}
                                  for entry in entries[-2:]]
    except Exception as err:  # fr_trace below still says what it reads
        result["entries"] = f"unreadable here: {err!r}"[:200]
    reads = {}
    for flags in ((), ("-j",)):
        read = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                               *flags], capture_output=True, text=True, timeout=120)
        reads[" ".join(("fr_trace", *flags))] = {"exit": read.returncode,
                                                 "output": (read.stdout + read.stderr).strip().splitlines()[-25:]}
    result["fr_trace"] = reads
    result["fr_trace_exit"] = max(read["exit"] for read in reads.values())
    return result


def hang_in_a_collective(folder: Path) -> None:
    """The child: a one-rank NCCL group whose fourth all-reduce waits behind a minute-long kernel."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timedelta(seconds=TIMEOUT_S), device_id=device)
    values = torch.ones(1 << 20, device=device)
    for _ in range(3):
        dist.all_reduce(values)
    torch.cuda.synchronize()
    print(f"three all-reduces done; the fourth waits behind a minute-long kernel (timeout {TIMEOUT_S} s)", flush=True)
    torch.cuda._sleep(int(60 * 2e9))  # cycles: about a minute at the 2 GHz of an H100's boost clock
    dist.all_reduce(values)
    torch.cuda.synchronize()  # NCCL's watchdog ends the process before this returns
    print("the collective finished: no timeout", flush=True)


if __name__ == "__main__":
    main()
