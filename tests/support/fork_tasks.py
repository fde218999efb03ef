"""Tasks as a fork writes them outside the package, for tests/*/test_fork_traps.py: run with ``PYTHONPATH=tests``
and ``--task support.fork_tasks:Regression`` (no preset, no tokenizer, a metric where lower is better, a
setting of its own).

- :class:`Regression`: a small MLP with BatchNorm on generated samples whose scale varies from sample to sample,
  so each rank's share gives other running statistics; its evaluation keeps every rank's statistics in its state.
- :class:`UnsyncedRegression`: the same with ``sync_buffers = False`` (what the QA tasks declare).
- :class:`BuiltRegression`: reads samples that ``build_data`` writes before training, and declares no
  ``prepare_sections``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from distqa.tasks import (
    Batch,
    BestMetric,
    Config,
    DataError,
    Evaluation,
    Precision,
    Runtime,
    Section,
    Task,
    all_gather_tensor,
    resolve_path,
)

TESTS = str(Path(__file__).resolve().parents[1])
# How tests/*/test_fork_traps.py runs these tasks: this folder on PYTHONPATH, one thread, a short run.
FORK_ENV = {"PYTHONPATH": TESTS, "OMP_NUM_THREADS": "1"}
RUN_ARGS = ["--global-batch-size", "16", "--per-rank-batch-size", "8", "--lr", "1e-2", "--max-steps", "6",
            "--eval-every", "3", "--progress-bar", "false", "--tensorboard", "false"]

FORK = Section("fork", "a fork's regression task (tests/support/fork_tasks.py)")
WEIGHTS = torch.tensor([1.0, -2.0, 0.5, 3.0])


@dataclass
class RegressionConfig(Config):
    samples: int = FORK(512, "Training samples.", defines_run=True)
    data_dir: str = FORK("results/fork-data", "Where BuiltRegression's build_data writes its samples.")


def generate(count: int, seed: int) -> dict[str, torch.Tensor]:
    """Samples ``x`` (4 features, scaled by 0.5 to 4 along the set) and their target ``y``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 4, generator=generator) * torch.linspace(0.5, 4.0, count).unsqueeze(1)
    return {"x": x, "y": x @ WEIGHTS}


class Samples(Dataset):
    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["y"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


class BatchNormMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.norm = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.hidden(x)))).squeeze(-1)


def running_statistics(model: nn.Module) -> torch.Tensor:
    """The BatchNorm's running mean and variance, as one vector."""
    return torch.cat([buffer.detach().flatten().float() for name, buffer in model.named_buffers()
                      if name.endswith(("running_mean", "running_var"))])


class MeanSquaredError:
    """The validation error, each rank a share; its state holds every rank's running statistics as they were."""

    best_metric = BestMetric("mse", "min")

    def __init__(self, runtime: Runtime, columns: dict[str, torch.Tensor]) -> None:
        self.runtime = runtime
        self.columns = {name: column[runtime.rank::runtime.world_size] for name, column in columns.items()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, precision: Precision) -> Evaluation:
        model.eval()
        try:
            error = F.mse_loss(model(self.columns["x"]), self.columns["y"], reduction="sum")
        finally:
            model.train()
        total, count = all_gather_tensor(torch.stack([error, torch.tensor(float(len(self.columns["y"])))])).sum(0)
        every_rank = all_gather_tensor(running_statistics(model))
        return Evaluation(metrics={"mse": float(total / count)},
                          state={"running_statistics": [row.clone() for row in every_rank]})


class Regression(Task):
    name = "regression"
    config_class = RegressionConfig
    input_names = ("x",)
    config: RegressionConfig

    def samples(self) -> dict[str, torch.Tensor]:
        return generate(self.config.samples, self.config.seed)

    def train_dataset(self) -> Dataset:
        return Samples(self.samples())

    def build_model(self) -> nn.Module:
        return BatchNormMLP()

    def loss(self, output: torch.Tensor, batch: Batch) -> torch.Tensor:
        return F.mse_loss(output.float(), batch["y"])

    def evaluator(self, runtime: Runtime) -> MeanSquaredError:
        return MeanSquaredError(runtime, generate(64, self.config.seed + 1))


class UnsyncedRegression(Regression):
    sync_buffers = False


class BuiltRegression(Regression):
    """Its samples are built once before training, into ``data_dir``; no ``prepare_sections``."""

    @property
    def data_file(self) -> Path:
        return resolve_path(self.config.data_dir) / "samples.pt"

    def check_inputs(self, may_build: bool) -> None:
        if may_build and not self.data_file.is_file():
            self.build_data()
        if not self.data_file.is_file():
            raise DataError(f"{self.data_file} does not exist; build it with python -m distqa.prepare --task "
                            "support.fork_tasks:BuiltRegression.")

    def build_data(self) -> Path:
        self.data_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(generate(self.config.samples, self.config.seed), self.data_file)
        return self.data_file.parent

    def samples(self) -> dict[str, torch.Tensor]:
        return torch.load(self.data_file, weights_only=True)
