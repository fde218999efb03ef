#!/usr/bin/env bash
# Every GPU check of issue 13 in one command, ending with one table and the goals as PASS/MISS lines:
#
#   bench/gpu.sh                        # one GPU: BERT-base and the large encoders (random weights), 20+ minutes
#   bench/gpu.sh --quick                # the same parts, fewer steps (a smoke run on the GPU)
#   bench/gpu.sh --device cpu --quick   # a smoke run on CPU with the tiny model (tests/qa/test_gpu_bench.py)
#   bench/gpu.sh --out DIR              # keep each part's JSON and log in DIR (default: a temporary folder)
#   bench/gpu.sh --parts mfu,large      # only these parts (default: all), the report says what it lacks
#
# The parts, in order (each file's docstring says what it measures and how):
#   bench/gpu_bert.py       our trainer's step vs the HF Trainer, seq 384/512, bf16 ± torch.compile, fp16 +
#                           GradScaler: samples/s, tokens/s, MFU, peak memory
#   bench/gpu_startup.py    process-group start-up at world size 1 under torchrun (NCCL on the GPU)
#   bench/gpu_inference.py  `python -m distqa.evaluate` and `python -m distqa.predict` on a small NQ cache
#   bench/gpu_packing.py    useful tokens: SQuAD-format windows at seq 384 padded, trimmed (--trim-padding) and
#                           unpadded (--unpad), eager and compiled: samples/s, computed and useful tokens/s, MFU
#   bench/gpu_large.py      BERT-large, RoBERTa-large, DeBERTa-v3-large at seq 512, micro-batch 8 and 32, activation
#                           checkpointing off and on, compiled: samples/s, MFU, peak memory against the estimate
#                           (about 10 minutes alone: `bench/gpu_large.py --json DIR/large.json`, then gpu_report.py)
#   bench/gpu_sharding.py   BERT-large, DDP against full sharding (FSDP2) on the GPUs torch sees (torchrun, one
#                           process per GPU; on 1 GPU the fsdp row measures only the wrap's overhead): samples/s,
#                           MFU, peak memory
#   bench/gpu_settings.py   BERT-base under DDP on the GPUs torch sees: pinned memory off, batched_grad_copy, the bf16
#                           comm hook, each alone; checkpoint writes (blocking, background) under the real step
#   bench/gpu_flight_recorder.py  a real NCCL flight-recorder dump (a collective made to time out), read by fr_trace
#   bench/gpu_mfu.py        what limits the MFU of the BERT-base step at micro-batch 32: attempts (CUDA graphs, bf16
#                           weights, a larger micro-batch) side by side and a profile of where the step's time goes
#   bench/gpu_report.py     the table and the goals (>= 40 % MFU at seq 512 bf16; >= 1.3 x the HF Trainer)
# A part that fails does not stop the others; the script then exits 1. PYTHON picks the interpreter
# (default: the repository's .venv/bin/python, as scripts/common.sh finds it).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo/scripts/common.sh"
find_python "$repo"

device=cuda
quick=()
out=""
parts="training,startup,inference,packing,large,sharding,settings,flight_recorder,mfu"
usage() { sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) [[ $# -ge 2 && "$2" =~ ^(cuda|cpu)$ ]] || { echo "bench/gpu.sh: --device takes cuda or cpu" >&2; exit 2; }
                  device="$2"; shift 2 ;;
        --quick) quick=(--quick); shift ;;
        --parts) [[ $# -ge 2 ]] || { echo "bench/gpu.sh: --parts takes a comma-separated list of $parts" >&2; exit 2; }
                 for part in ${2//,/ }; do
                     [[ ",$parts," == *",$part,"* ]] || { echo "bench/gpu.sh: unknown part '$part' (parts: $parts)" >&2; exit 2; }
                 done
                 parts="$2"; shift 2 ;;
        --out) [[ $# -ge 2 ]] || { echo "bench/gpu.sh: --out takes a folder" >&2; exit 2; }
               out="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench/gpu.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
if [[ -z "$out" ]]; then
    out="$(mktemp -d -t gpu-bench.XXXXXX)"
    trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
cd "$repo"
# The bench scripts import their neighbours (harness.py, gpu_common.py) by the script's own folder.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

failed=0
# run_part NAME COMMAND...: run one part, its output into DIR/NAME.log (shown when it fails).
run_part() {
    local name="$1"
    shift
    [[ ",$parts," == *",$name,"* ]] || return 0
    echo "=== $name: $*"
    if ! "$@" >"$out/$name.log" 2>&1; then
        echo "$name FAILED; its output:"
        tail -n 40 "$out/$name.log"
        failed=1
    fi
}

run_part training "$PYTHON" bench/gpu_bert.py --device "$device" "${quick[@]}" --json "$out/training.json"
run_part startup env BENCH_LAUNCHED_AT="$(date +%s.%N)" "$PYTHON" -m torch.distributed.run --standalone \
    --nproc-per-node 1 bench/gpu_startup.py --device "$device" --json "$out/startup.json"
run_part inference "$PYTHON" bench/gpu_inference.py --device "$device" "${quick[@]}" --json "$out/inference.json"
run_part packing "$PYTHON" bench/gpu_packing.py --device "$device" "${quick[@]}" --json "$out/packing.json"
run_part large "$PYTHON" bench/gpu_large.py --device "$device" "${quick[@]}" --json "$out/large.json"
# One process per GPU torch sees (1 on CPU: the smoke run); each part above runs on one.
gpus=1
[[ "$device" == cuda ]] && gpus="$("$PYTHON" -c 'import torch; print(max(1, torch.cuda.device_count()))')"
run_part sharding "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$gpus" bench/gpu_sharding.py \
    --device "$device" "${quick[@]}" --json "$out/sharding.json"
run_part settings "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$gpus" bench/gpu_settings.py \
    --device "$device" "${quick[@]}" --json "$out/settings.json"
run_part flight_recorder "$PYTHON" bench/gpu_flight_recorder.py --device "$device" --json "$out/flight_recorder.json"
run_part mfu "$PYTHON" bench/gpu_mfu.py --device "$device" "${quick[@]}" --json "$out/mfu.json"

echo
"$PYTHON" bench/gpu_report.py "$out" || failed=1
exit "$failed"
