"""Random generators: seeding, and every generator's state as plain containers for exact resumption."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from distqa.distributed.runtime import gather_objects_to_main


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_for_step(seed: int, step: int, rank: int) -> None:
    """Seed every generator from (seed, step, rank), at the start of each optimizer step: the dropout masks of a step
    depend on nothing else, so a rank's random state never has to be carried (a survivor of a lost peer saves the
    others' without knowing it; a node that returns draws what it would have). NumPy's SeedSequence mixes the three
    into one well-spread seed."""
    seed_everything(int(np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0] >> 1))


def rng_states_to_save(seeds_per_step: bool, world_size: int) -> list[dict[str, Any] | None]:
    """What a step checkpoint keeps of the ranks' random generators: none for a run whose steps seed them from (seed,
    step, rank) (:func:`seed_for_step`), as a survivor's save keeps none (:mod:`distqa.training.peer_loss`), so its
    saves gather nothing (docs/SCALING.md, "The checkpoint's random states"). A run begun before (its progress without
    ``seeds_per_step``) still gathers them on rank 0, which writes them: collective then, every rank calls it."""
    if seeds_per_step:
        return [None] * world_size
    name, keys, position, has_gauss, cached = np.random.get_state()
    mine = {  # this rank's generators, as plain containers (loadable with weights_only=True)
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return gather_objects_to_main(mine) or []


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuples(state["python"]))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value: Any) -> Any:
    """random.setstate wants the nested tuples that a round trip through a checkpoint may turn to lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list | tuple) else value
