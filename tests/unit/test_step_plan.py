"""Uneven shares of the global batch (distqa.training.step_plan): each micro-batch's loss over its real rows, weighed
by its share of the global batch, gives the gradient of the mean over the global batch that one process computes,
whatever the world size; padding counts for nothing, in the gradient and in the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distqa.config import Config, ConfigError
from distqa.config.sources import load_config
from distqa.distributed.sampler import ResumableDistributedSampler
from distqa.record.metrics import MetricsWindow
from distqa.training.step_plan import StepPlan, micro_batch_loss, real_rows_of

from support.repo import MACHINERY_TASK


def config_of(global_batch: int, micro_batch: int) -> Config:
    return load_config(["--task", MACHINERY_TASK, "--global-batch-size", str(global_batch), "--per-rank-batch-size",
                        str(micro_batch)], environ={}, dotenv_path=Path("/nonexistent/.env"))


def sampler_for(config: Config, size: int, world_size: int, rank: int) -> ResumableDistributedSampler:
    rows = config.accumulation_steps(world_size) * config.per_rank_batch_size
    return ResumableDistributedSampler(range(size), num_replicas=world_size, rank=rank, seed=3,
                                       global_batch_size=config.global_batch_size, rows_per_step=rows)


def classification_loss(output: dict[str, Any], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A task's loss: the mean over the rows it is given (output as a dict, so the cut walks into it)."""
    return F.cross_entropy(output["logits"], batch["label"])


def gradient_of_one_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, config: Config,
                         world_size: int) -> dict[str, torch.Tensor]:
    """The step's gradient as DDP leaves it: every rank's accumulated gradient over its micro-batches (padding
    included), averaged over the ranks."""
    total: dict[str, torch.Tensor] = {}
    for rank in range(world_size):
        sampler = sampler_for(config, len(inputs), world_size, rank)
        plan = StepPlan.of(config, sampler, world_size)
        indices, micro = list(sampler)[:sampler.rows_per_step], config.per_rank_batch_size
        model.zero_grad()
        for micro_step in range(plan.accumulation):
            rows = indices[micro_step * micro:(micro_step + 1) * micro]
            batch = {"features": inputs[rows], "label": labels[rows]}
            output = {"logits": model(batch["features"]), "note": "not a tensor"}
            micro_batch_loss(classification_loss, output, batch, plan, micro_step, micro).backward()
        for name, parameter in model.named_parameters():
            total[name] = total.get(name, 0) + parameter.grad / world_size
    return total


@pytest.mark.parametrize(("world_size", "micro_batch"), [(3, 5), (3, 4), (5, 2), (7, 5), (2, 16), (4, 8)])
def test_uneven_shares_give_the_gradient_of_the_mean_over_the_global_batch(world_size: int, micro_batch: int) -> None:
    """32 examples per step: (3, 5) is 11/11/10 in 3 micro-batches of 5 (a short one, and one of padding alone on
    rank 2); (2, 16) and (4, 8) split evenly."""
    torch.manual_seed(0)
    inputs, labels = torch.randn(40, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    model = nn.Linear(6, 3).double()
    config = config_of(32, micro_batch)
    order = list(sampler_for(config, 40, 1, 0))[:32]  # the step's global batch, as one process takes it
    model.zero_grad()
    classification_loss({"logits": model(inputs[order])}, {"label": labels[order]}).backward()
    one_process = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    ranks = gradient_of_one_step(model, inputs, labels, config, world_size)
    for name, gradient in one_process.items():
        torch.testing.assert_close(ranks[name], gradient, rtol=1e-12, atol=1e-12)


def test_an_even_split_divides_each_micro_batch_by_the_accumulation_as_before() -> None:
    """Bit for bit the weighting before uneven shares: the loss / accumulation, and no row cut."""
    config = config_of(32, 4)
    plan = StepPlan.of(config, sampler_for(config, 100, 4, 1), 4)
    assert (plan.accumulation, plan.real_rows, plan.loss_scale) == (2, (4, 4), (2.0, 2.0))
    assert plan.steps_per_epoch == 100 // 32 == (100 // 4) // 4 // 2  # the formula before uneven shares
    loss = torch.tensor(0.7123456789)
    assert torch.equal(micro_batch_loss(lambda output, batch: loss, None, {}, plan, 0, 4), loss / 2)
    assert plan.split == "global batch 32 = shares of 8 per rank × 4 ranks, 2 micro-batches of 4"


def test_a_micro_batch_of_padding_alone_keeps_every_parameter_in_the_graph_with_a_zero_gradient() -> None:
    config = config_of(32, 5)
    plan = StepPlan.of(config, sampler_for(config, 40, 3, 2), 3)
    assert plan.real_rows == (5, 5, 0)
    assert plan.split == "global batch 32 = shares of 11/10 per rank × 3 ranks, 3 micro-batches of 5"
    model = nn.Linear(2, 3)
    batch = {"label": torch.zeros(5, dtype=torch.long)}
    micro_batch_loss(classification_loss, {"logits": model(torch.randn(5, 2))}, batch, plan, 2, 5).backward()
    assert all(parameter.grad is not None and not parameter.grad.any() for parameter in model.parameters())


def test_the_cut_keeps_the_real_rows_of_every_per_example_tensor_and_refuses_what_it_cannot_see_into() -> None:
    output = (torch.arange(8).reshape(4, 2), {"pooled": torch.ones(4), "scalar": torch.tensor(1.0),
                                              "table": torch.zeros(3, 4), "name": "x"})
    cut = real_rows_of(output, 3, 4)
    assert cut[0].tolist() == [[0, 1], [2, 3], [4, 5]] and cut[1]["pooled"].shape == (3,)
    assert cut[1]["scalar"].ndim == 0 and cut[1]["table"].shape == (3, 4) and cut[1]["name"] == "x"

    class Opaque:
        logits = torch.ones(4, 2)

    with pytest.raises(TypeError, match="a Opaque in the model's output or the batch: a micro-batch padded to 4 rows "
                                        r"\(3 real\)"):
        real_rows_of({"out": Opaque()}, 3, 4)


def test_the_metrics_count_the_tokens_of_real_rows_only() -> None:
    window = MetricsWindow(torch.device("cpu"))
    window.start_step()
    window.count_batch({"attention_mask": torch.ones(4, 8, dtype=torch.long)}, rows=3)
    window.count_batch({"attention_mask": torch.ones(4, 8, dtype=torch.long)}, rows=0)
    window.count_batch({"attention_mask": torch.ones(4, 8, dtype=torch.long)})
    window.local_work_done()
    window.add(torch.tensor(1.0), torch.tensor(1.0))
    [mine] = window.flush()
    assert (mine.tokens, mine.padded_tokens) == (3 * 8 + 4 * 8, 3 * 8 + 4 * 8)


def test_any_world_size_up_to_the_global_batch_trains_it_and_a_larger_one_is_refused() -> None:
    config = config_of(32, 4)
    assert [config.accumulation_steps(size) for size in (1, 2, 3, 5, 6, 12, 32)] == [8, 4, 3, 2, 2, 1, 1]
    with pytest.raises(ConfigError) as refused:
        config.accumulation_steps(40)
    assert str(refused.value) == (
        "global_batch_size (32) is smaller than world_size (40): 8 rank(s) would have no example to train on. Use a "
        "global_batch_size of at least 40, fewer ranks, or --grow-global-batch true to let it grow.")
