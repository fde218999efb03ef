"""Process-group start-up at world size 1: from torchrun's launch to distqa's runtime, to a NCCL group, to
its first all-reduce.

    BENCH_LAUNCHED_AT=$(date +%s.%N) .venv/bin/python -m torch.distributed.run --standalone \\
        --nproc-per-node 1 bench/gpu_startup.py --json startup.json      # bench/gpu.sh runs it so
    (the same with --device cpu: gloo instead of NCCL, the smoke run)

Three intervals, one process (the clock of the launch is the wall clock, since the launch is in the shell):

  launch → runtime ready    ``BENCH_LAUNCHED_AT`` (set by bench/gpu.sh just before torchrun) to the entry of
                            ``distqa.distributed.runtime.distributed_runtime``'s block: the torchrun agent, Python,
                            torch and distqa imports, the CUDA context. At world size 1 the runtime forms no
                            process group (by design: nothing to all-reduce), so this is distqa's start-up.
  init_process_group        ``distqa.distributed.runtime.join_process_group`` for a group of one, as every rank of a
                            multi-GPU job calls it (NCCL bound to the GPU: the communicator connects here)
  first all-reduce          one float, synchronised: what remains of NCCL's set-up before the first step
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from gpu_common import add_device_arguments, check_device, synchronize, write_part

from distqa.distributed.runtime import distributed_runtime, join_process_group, read_torchrun_env, setup_logging

LAUNCHED_AT = "BENCH_LAUNCHED_AT"
TIMEOUT_S = 120


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_arguments(parser)
    args = parser.parse_args()
    launched = os.environ.get(LAUNCHED_AT)
    if launched is None or "LOCAL_RANK" not in os.environ:
        raise SystemExit(f"run under torchrun with {LAUNCHED_AT} set to the launch time (date +%s.%N), as "
                         "bench/gpu.sh does; see this file's docstring")
    rank = read_torchrun_env()["RANK"]
    setup_logging(rank)
    check_device(args.device)
    with distributed_runtime(args.device, TIMEOUT_S) as runtime:  # world size 1: no group yet
        ready = time.time()
        started = time.perf_counter()
        join_process_group(runtime, TIMEOUT_S)  # destroyed by distributed_runtime's finally
        joined = time.perf_counter()
        value = torch.ones(1, device=runtime.device)
        dist.all_reduce(value)
        synchronize(runtime.device)
        reduced = time.perf_counter()
        if value.item() != 1.0:
            raise SystemExit(f"an all-reduce over a group of one gave {value.item()}, not 1.0")
        if runtime.is_main_process:
            write_part(args.json, "startup", runtime.device, backend=runtime.backend,
                       launch_to_runtime_s=ready - float(launched), init_process_group_s=joined - started,
                       first_all_reduce_s=reduced - joined)


if __name__ == "__main__":
    main()
