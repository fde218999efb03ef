"""The bare floor of bench/scale.py: what torch alone costs for the same run, with no distqa.

    python -m torch.distributed.run --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT ... bench/scale_floor.py \
        --steps 12 --per-rank-batch 2 --checkpoint-at 10 --output DIR

One torchrun agent per node, c10d rendezvous, ``init_process_group`` (gloo), a model of the shape the machinery task
trains (the example's bag of words: an embedding of ``--vocabulary`` words of ``--dim`` and a linear classifier),
wrapped in DDP, AdamW, the same number of optimizer steps on random word ids, and rank 0's ``torch.save`` of the model
and optimizer at ``--checkpoint-at``. So each rank makes the same gradient all-reduce per step as ours, and
nothing else: no settings, preflight, logging, metrics, stop checks or resume.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class BagOfWords(nn.Module):
    def __init__(self, vocabulary: int, dim: int, labels: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, dim, padding_idx=0)
        self.classifier = nn.Linear(dim, labels)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embedding(ids).mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--per-rank-batch", type=int, default=2)
    parser.add_argument("--checkpoint-at", type=int, default=10)
    parser.add_argument("--vocabulary", type=int, default=3000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--words", type=int, default=32)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DistributedDataParallel(BagOfWords(args.vocabulary, args.dim, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(rank)
        for step in range(1, args.steps + 1):
            ids = torch.randint(1, args.vocabulary, (args.per_rank_batch, args.words), generator=generator)
            labels = torch.randint(0, 2, (args.per_rank_batch,), generator=generator)
            loss = nn.functional.cross_entropy(model(ids), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step == args.checkpoint_at and rank == 0:
                args.output.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           args.output / f"step-{step}.pt")
        if rank == 0:
            print(f"floor: {args.steps} steps on {dist.get_world_size()} ranks", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
