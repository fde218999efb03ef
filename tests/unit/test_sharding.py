"""Sharded data parallelism (``--data-parallel fsdp | hsdp``, distqa.distributed.fsdp) in this process: the sharding
units (the default ones, compiled ones giving the eager gradients, bf16 computing in bf16 over fp32 shards), hsdp
refusing nodes of unequal process counts, and what sharding divides and adds in the memory estimate the doctor checks,
on a bare encoder. The real multi-rank runs: tests/distributed/test_sharding.py."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.distributed.fsdp import device_mesh, shard_model
from distqa.distributed.runtime import local_runtime
from distqa.encoders.memory import EncoderMemory, count_on_meta
from distqa.tasks import make_task
from distqa.tasks.step_memory import Step, shards_of

from support.repo import MACHINERY_ARGS


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.tanh(self.linear(x)))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.blocks, self.head = nn.Linear(4, 8), nn.ModuleList([Block(), Block()]), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_compiled_sharding_units_give_the_eager_gradients(group_of_one: None) -> None:
    """A model sharded with --compile true (each unit compiled in place: the parameter names stay) gives the
    gradients of the same model sharded eagerly; dynamo did capture the units (so the comparison is not eager
    against eager)."""
    from torch._dynamo.utils import counters  # dynamo's own counters: how many graphs it captured

    config = load_config([*MACHINERY_ARGS, "--data-parallel", "fsdp"], environ={}, dotenv_path=os.devnull)
    counters.clear()
    gradients = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = Stack()
        shard_model(model, make_task(config).sharding_units(model), local_runtime("cpu"),
                    dataclasses.replace(config, compile=compiled), None)
        model(torch.randn(5, 4, generator=torch.Generator().manual_seed(1))).square().mean().backward()
        gradients.append({name: p.grad.full_tensor() for name, p in model.named_parameters()})
    assert counters["stats"]["unique_graphs"] >= 1
    assert list(gradients[0]) == [name for name, _ in Stack().named_parameters()]  # names unchanged by compile
    torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-5, atol=1e-6)


def test_bf16_sharding_computes_in_bf16_and_keeps_fp32_shards_and_gradients(group_of_one: None) -> None:
    """precision bf16 with sharding: the policy casts the gathered weights to bf16 for forward and backward (the
    output is bf16, as under autocast) while the shards, their gradients (reduced in fp32) and so AdamW's state stay
    fp32; the gradients are those of the fp32 model within bf16 rounding."""
    config = load_config([*MACHINERY_ARGS, "--data-parallel", "fsdp"], environ={}, dotenv_path=os.devnull)
    inputs = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    gradients, outputs = [], []
    for param_dtype in (None, torch.bfloat16):
        torch.manual_seed(0)
        model = Stack()
        shard_model(model, make_task(config).sharding_units(model), local_runtime("cpu"), config, param_dtype)
        output = model(inputs)
        output.float().square().mean().backward()
        outputs.append(output)
        gradients.append({name: p.grad for name, p in model.named_parameters()})
    assert outputs[0].dtype == torch.float32 and outputs[1].dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(grad.dtype == torch.float32 for grad in gradients[1].values())
    for name, grad in gradients[0].items():
        torch.testing.assert_close(gradients[1][name].full_tensor(), grad.full_tensor(), rtol=0.05, atol=2e-3,
                                   msg=lambda m, name=name: f"{name}: {m}")
        assert not torch.equal(gradients[1][name].full_tensor(), grad.full_tensor()), f"{name}: bf16 changed nothing"


def test_the_default_sharding_units_are_the_repeated_blocks_else_the_children_with_parameters() -> None:
    config = load_config(MACHINERY_ARGS, environ={}, dotenv_path=os.devnull)
    task = make_task(config)
    stack = Stack()
    assert task.sharding_units(stack) == list(stack.blocks)
    bag = task.build_model()  # the machinery task's bag of words: an embedding, a dropout, a classifier
    assert task.sharding_units(bag) == [bag.embedding, bag.classifier]


def test_hsdp_refuses_nodes_with_unequal_process_counts() -> None:
    """A world that is not nodes × processes per node (here node 1 runs one process beside node 0's two) cannot be
    a 2-D mesh: one line naming the setting and the fix, before any collective."""
    runtime = dataclasses.replace(local_runtime("cpu"), rank=2, world_size=3, local_world_size=1, node_rank=1)
    with pytest.raises(ConfigError, match=r"^data_parallel=hsdp needs the same number of processes on every node: "
                                          r"world size 3 .* use data_parallel=fsdp\.$"):
        device_mesh(runtime, "hsdp")


def bert_large_memory() -> EncoderMemory:
    """The estimate's view of bert-large-uncased's encoder (its hub config's sizes), counted on the meta device."""
    config = BertConfig(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
                        vocab_size=30522, max_position_embeddings=512)
    model = count_on_meta(lambda: BertModel(config, add_pooling_layer=False))
    return EncoderMemory.of_model(model, config, 512)


def test_the_memory_estimate_divides_the_state_by_the_shards_adds_the_gathered_units_and_keeps_the_activations(
) -> None:
    """What the doctor's memory check expects of a sharded step (distqa.tasks.step_memory's ShardingUnits, on a bare
    encoder): fsdp: weights, gradients and AdamW state each 1/W; the root (what lies outside the layers: here the
    embeddings) and two layers gathered whole in bf16 in place of autocast's weight copies; activations and transients
    as under ddp. hsdp divides by a node's processes, not the world."""
    memory = bert_large_memory()
    layer = 4 * (1024 * 1024 + 1024) + 2 * 1024 * 4096 + 4096 + 1024 + 2 * 2 * 1024  # q, k, v, o; FFN; 2 LayerNorms
    assert memory.largest_layer == layer and memory.outside_layers == memory.parameters - 24 * layer
    ddp = memory.estimate(Step(32, "bf16", "cuda"))
    parameters, root = memory.parameters, memory.outside_layers
    for world_size in (2, 8, 64):
        fsdp = memory.estimate(Step(32, "bf16", "cuda", data_parallel="fsdp", shards=world_size))
        assert fsdp.moment == ddp.moment == "forward end"
        assert fsdp.parts == {**ddp.parts, "weights": 4 * parameters // world_size,
                              "AdamW moments": 8 * parameters // world_size,
                              "gradients": 4 * parameters // world_size, "weight copies": 0,
                              "gathered": 2 * root + 2 * 2 * layer}
    # Accumulating without gradient sync, FSDP2 keeps every unsharded gradient until the last micro-batch.
    accumulating = memory.estimate(Step(32, "bf16", "cuda", data_parallel="fsdp", shards=8, accumulation_steps=2))
    assert accumulating.parts["gradients"] == 4 * parameters
    # In the backward two layers' gradients are in flight too, in bf16 and their fp32 copies for the reduce-scatter
    # (checkpointing makes the backward the peak); fp32 gathers 4 bytes per weight.
    checkpointed = memory.estimate(Step(32, "bf16", "cuda", True, data_parallel="fsdp", shards=8))
    assert checkpointed.moment == "backward"
    assert checkpointed.parts["gathered"] == 2 * root + 2 * 2 * layer + 2 * (2 + 4) * layer
    full = memory.estimate(Step(32, "fp32", "cuda", data_parallel="fsdp", shards=8))
    assert full.moment == "backward start" and full.parts["gathered"] == 4 * root + 2 * 4 * layer + 2 * 8 * layer
    hybrid = Step(32, "bf16", "cuda", data_parallel="hsdp", shards=shards_of("hsdp", world_size=16,
                                                                             processes_per_node=4))
    assert memory.estimate(hybrid) == memory.estimate(dataclasses.replace(hybrid, data_parallel="fsdp", shards=4))
    assert (shards_of("ddp", 16, 4), shards_of("fsdp", 16, 4), shards_of("hsdp", 16, 4)) == (1, 16, 4)
    # ddp ignores the sharding fields: a whole replica whatever the accumulation.
    assert memory.estimate(Step(32, "bf16", "cuda", accumulation_steps=4, shards=8)) == ddp
