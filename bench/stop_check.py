"""What the graceful-stop agreement costs: one one-element all-reduce (MAX) per check, timed against a
training step of the tiny model, on CPU with gloo between two ranks on loopback.

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 bench/stop_check.py

Prints the time of one check, of one training step (forward, backward, DDP all-reduce, AdamW) and
their ratio: the fraction of a step that checking every step would add (``stop_check_every`` 1). On
GPUs a check is also a host synchronisation, which this CPU bench cannot show; see docs/FAULT_TOLERANCE.md,
"What the stop check costs". Ratios matter, not absolute numbers: the machine may be busy.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from distqa.distributed.rng import seed_everything
from distqa.distributed.runtime import all_reduce_max
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.config import DummyConfig
from distqa.qa.dummy import DummyDataset
from distqa.qa.model import build_model, forward, qa_loss


def main() -> None:
    dist.init_process_group("gloo")
    try:
        checks = 2000
        for _ in range(50):  # connections warm
            all_reduce_max(0, torch.device("cpu"))
        started = time.perf_counter()
        for _ in range(checks):
            all_reduce_max(0, torch.device("cpu"))
        check_s = (time.perf_counter() - started) / checks

        config = DummyConfig(max_seq_len=64, max_question_len=16)
        seed_everything(0)
        model = torch.nn.parallel.DistributedDataParallel(build_model(config))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        dataset = DummyDataset.for_tokenizer(load_tokenizer(config), size=8, max_seq_len=64, max_question_len=16,
                                             seed=0)
        batch = next(iter(DataLoader(dataset, batch_size=4)))
        steps = 30
        for step in range(steps + 5):
            if step == 5:
                started = time.perf_counter()
            loss = qa_loss(forward(model, batch), batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        step_s = (time.perf_counter() - started) / steps
        if dist.get_rank() == 0:
            print(f"stop check (1-element all-reduce, gloo, 2 ranks): {check_s * 1e6:.0f} us; tiny-model step: "
                  f"{step_s * 1e3:.0f} ms; a check every step adds {100 * check_s / step_s:.2f} % per step")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
