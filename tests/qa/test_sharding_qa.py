"""The QA model sharded (``--data-parallel fsdp``, distqa.distributed.fsdp): the QA tasks shard their encoder's
transformer layers, and an encoder checkpointed and sharded by layer gives the gradients of the bare model (sharding
itself, on the machinery task: tests/distributed/test_sharding.py)."""

from __future__ import annotations

import os

import torch

from distqa.config.sources import load_config
from distqa.distributed.fsdp import shard_model
from distqa.distributed.runtime import local_runtime
from distqa.qa.model import build_model as build_qa_model
from distqa.tasks import make_task

from support.qa import TinyEncoder


def test_a_checkpointed_encoder_sharded_by_layer_gives_the_gradients_of_the_bare_model(group_of_one: None) -> None:
    """The QA model with --activation-checkpointing (the encoder's own, applied when it is built), sharded per
    transformer layer: the loss and gradients of the same model unsharded, and its layers still checkpointed."""
    config = load_config(["--preset", "none", "--dropout", "0", "--activation-checkpointing", "true",
                          "--data-parallel", "fsdp"], environ={}, dotenv_path=os.devnull)
    inputs = {"input_ids": torch.randint(5, 200, (4, 48), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(4, 48, dtype=torch.long)}
    results = []
    for sharded in (False, True):
        torch.manual_seed(0)
        model = build_qa_model(config)
        if sharded:
            shard_model(model, make_task(config).sharding_units(model), local_runtime("cpu"), config, None)
        output = model(**inputs)
        loss = output.start_logits.logsumexp(-1).mean() + output.answer_type_logits.square().mean()
        loss.backward()
        results.append((loss.detach(), {name: p.grad.full_tensor() if sharded else p.grad
                                        for name, p in model.named_parameters()}))
    assert model.encoder.is_activation_checkpointing
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_the_qa_tasks_shard_their_encoders_transformer_layers(tiny_encoder: TinyEncoder) -> None:
    config = load_config(["--preset", "none", "--model-name-or-path", str(tiny_encoder.directory), "--from-scratch",
                          "true"], environ={}, dotenv_path=os.devnull)
    model = build_qa_model(config)
    units = make_task(config).sharding_units(model)
    assert len(units) == model.encoder.config.num_hidden_layers >= 2
    assert all(type(unit).__name__.endswith(("Layer", "Block", "EncoderLayer")) for unit in units), units
