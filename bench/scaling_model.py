"""A scaling model for many nodes: the gradient bytes DDP all-reduces per step, the inter-node bandwidth that
hides them behind the backward pass, and what the 2020 recipe's 1.45 × on 4 nodes says about its network.

    .venv/bin/python bench/scaling_model.py                       # the tables of docs/PERFORMANCE.md
    .venv/bin/python bench/scaling_model.py --h100-samples-per-s 1097 --micro-batch 128   # another measurement

Arithmetic, not a measurement (no GPU and no network needed); its inputs are measured figures:

- **Bytes per step.** DDP all-reduces the gradient of every trainable parameter once per optimizer step
  (on the last micro-batch of the accumulation): 4 bytes each in fp32, 2 with the bf16 compression hook.
  The parameters are counted on the real QA model (``distqa.qa.model.build_model`` on the meta device) at
  bert-base-uncased's and bert-large-uncased's sizes (bench/gpu_common.py), embeddings included: their
  gradients are dense too.
- **Traffic per node.** NCCL's ring all-reduce over G GPUs sends 2 (G - 1) / G of the buffer out of every
  GPU. With the ranks of a node next to each other in the ring(s), what crosses the network is one ring
  edge per node and channel, so a node's NICs together send ≈ 2 (G - 1) / G × bytes per step, whatever the
  number of GPUs in it (NCCL's tree algorithm moves the same volume at large sizes).
- **Time to hide it in.** DDP starts all-reducing buckets while the backward pass still runs: the
  all-reduce is hidden when it takes no longer than the backward, ≈ 2/3 of the step's compute (backward
  FLOPs are twice the forward's). The compute time of a micro-step comes from a measured throughput
  (default: our compiled bf16 step on one H100 at seq 512, micro-batch 32, docs/PERFORMANCE.md "GPU"), and
  for BERT-large from the same MFU scaled by its FLOPs per token (``distqa.encoders.flops``).
- **Efficiency at a given bandwidth.** What is not hidden adds to the step: efficiency = compute /
  (compute + max(0, all-reduce - backward)). Gradient accumulation over k micro-batches does not give the
  all-reduce more time to hide in (DDP skips it, ``no_sync``, on all but the last micro-batch, whose
  backward alone overlaps it), but divides its uncovered part by k: it is paid once per k micro-steps.
- **The 2020 recipe.** 4 nodes of one V100 each reached 1.45 × one node's throughput at the same per-node
  batch (weak scaling): a step took 4 / 1.45 = 2.76 × the single-node step T1, so the all-reduce left
  1.76 T1 uncovered and lasted at most 1.76 T1 + the backward (2/3 T1). The ring over 4 GPUs sends
  1.5 × the fp32 gradients out of each node in between 1.76 T1 and 2.43 T1: the effective bandwidth
  that implies is printed for a range of T1 (the recipe's step time was not recorded).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from gpu_common import BERT_SIZES
from harness import bench_config
from transformers import BertConfig

from distqa.encoders.config import TINY_MODEL_DIR
from distqa.encoders.flops import model_flops_per_token
from distqa.qa.model import build_model

MEASURED_H100 = {"samples_per_s": 888.7, "micro_batch": 32, "seq_len": 512}
"""bench/gpu.sh on one H100 80GB HBM3 (2026-11-22): ours bf16 + torch.compile, BERT-base, seq 512."""
NODE_COUNTS = (2, 4, 8, 16, 64)
GPUS_PER_NODE = 8
BACKWARD_SHARE = 2 / 3
RECIPE_2020 = {"nodes": 4, "speedup": 1.45}
RECIPE_2020_STEP_S = (0.05, 0.1, 0.2, 0.4, 0.8)
NETWORKS_GBIT = (25, 100, 400, 3200)
"""Per node: cloud Ethernet, a 100 G NIC, one 400 G NIC, 8 × 400 G (a DGX H100's compute fabric)."""
EFFICIENCY_NODES = 16
ACCUMULATIONS = (1, 4)


def trainable_parameters(model: str) -> int:
    """Trainable parameters of our QA model (encoder + span and answer-type heads) at ``model``'s sizes."""
    with tempfile.TemporaryDirectory(prefix="scaling-model-") as directory, torch.device("meta"):
        BertConfig(**BERT_SIZES[model]).save_pretrained(directory)
        qa_model = build_model(bench_config("--model-name-or-path", directory, "--tokenizer-name-or-path",
                                            str(TINY_MODEL_DIR), "--from-scratch", "true"))
    return sum(p.numel() for p in qa_model.parameters() if p.requires_grad)


def gbit_per_s(bytes_: float, seconds: float) -> float:
    return bytes_ * 8 / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--h100-samples-per-s", type=float, default=MEASURED_H100["samples_per_s"],
                        help="measured BERT-base training samples/s of one GPU (default: ours, compiled, one H100)")
    parser.add_argument("--micro-batch", type=int, default=MEASURED_H100["micro_batch"],
                        help="the micro-batch that throughput was measured at")
    parser.add_argument("--seq-len", type=int, default=MEASURED_H100["seq_len"])
    args = parser.parse_args()

    base_flops = model_flops_per_token(BertConfig(**BERT_SIZES["bert-base"]), args.seq_len)
    micro_step_s = {"bert-base": args.micro_batch / args.h100_samples_per_s}
    large_flops = model_flops_per_token(BertConfig(**BERT_SIZES["bert-large"]), args.seq_len)
    micro_step_s["bert-large"] = micro_step_s["bert-base"] * large_flops / base_flops  # same MFU

    print(f"compute: BERT-base {args.h100_samples_per_s:g} samples/s per GPU at micro-batch {args.micro_batch}, "
          f"seq {args.seq_len} (BERT-large at the same MFU); "
          f"{GPUS_PER_NODE} GPUs per node; the backward is {BACKWARD_SHARE:.2f} of a step's compute\n")
    print("inter-node bandwidth per node (all NICs together) that hides the all-reduce behind the backward:")
    header = f"  {'model':<21}{'params':>8}{'grads fp32':>12}{'step':>9}{'backward':>10}  " + \
        "".join(f"{f'{n} nodes':>16}" for n in NODE_COUNTS)
    print(header)
    parameters = {model: trainable_parameters(model) for model in micro_step_s}
    for model in ("bert-base", "bert-large"):
        step_s = micro_step_s[model]
        backward_s = BACKWARD_SHARE * step_s
        for precision, bytes_per in (("fp32", 4), ("bf16 hook", 2)):
            needed = []
            for nodes in NODE_COUNTS:
                gpus = nodes * GPUS_PER_NODE
                sent = 2 * (gpus - 1) / gpus * parameters[model] * bytes_per
                needed.append(f"{gbit_per_s(sent, backward_s):7.0f} Gbit/s")
            label = f"{model} {precision}" if precision != "fp32" else model
            count = parameters[model]
            print(f"  {label:<21}{count / 1e6:7.1f}M{count * 4 / 1e6:9.0f} MB{step_s * 1e3:7.1f}ms"
                  f"{backward_s * 1e3:8.1f}ms  " + "".join(f"{cell:>16}" for cell in needed))

    gpus = EFFICIENCY_NODES * GPUS_PER_NODE
    print(f"\nscaling efficiency at {EFFICIENCY_NODES} nodes × {GPUS_PER_NODE} GPUs by the nodes' bandwidth, with "
          f"{' or '.join(map(str, ACCUMULATIONS))} micro-batches per optimizer step:")
    print(f"  {'model':<21}{'k':>3}  " + "".join(f"{f'{gbit} Gbit/s':>14}" for gbit in NETWORKS_GBIT))
    for model in ("bert-base", "bert-large"):
        for precision, bytes_per in (("fp32", 4), ("bf16 hook", 2)):
            sent = 2 * (gpus - 1) / gpus * parameters[model] * bytes_per
            for k in ACCUMULATIONS:
                compute_s = k * micro_step_s[model]
                cells = []
                for gbit in NETWORKS_GBIT:
                    uncovered = max(0.0, sent * 8 / (gbit * 1e9) - BACKWARD_SHARE * micro_step_s[model])
                    cells.append(f"{compute_s / (compute_s + uncovered):14.0%}")
                label = f"{model} {precision}" if precision != "fp32" else model
                print(f"  {label:<21}{k:>3}  " + "".join(cells))

    nodes, speedup = RECIPE_2020["nodes"], RECIPE_2020["speedup"]
    base_bytes = parameters["bert-base"] * 4
    sent = 2 * (nodes - 1) / nodes * base_bytes
    uncovered = nodes / speedup - 1
    print(f"\nthe 2020 recipe: {nodes} nodes × 1 V100, {speedup} × one node ({speedup / nodes:.0%} efficiency): "
          f"a step took {nodes / speedup:.2f} × T1, the all-reduce of {base_bytes / 1e6:.0f} MB (fp32 BERT-base) left "
          f"{uncovered:.2f} × T1 uncovered; each node sent {sent / 1e6:.0f} MB per step in at most "
          f"{uncovered + BACKWARD_SHARE:.2f} × T1:")
    print(f"  {'T1 (one node step)':<20}effective inter-node bandwidth")
    for step_s in RECIPE_2020_STEP_S:
        slowest, fastest = (gbit_per_s(sent, share * step_s) for share in (uncovered + BACKWARD_SHARE, uncovered))
        print(f"  {step_s * 1e3:>6.0f} ms{'':11}{slowest:5.1f} to {fastest:5.1f} Gbit/s")


if __name__ == "__main__":
    main()
