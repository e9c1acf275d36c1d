"""A tiny run whose input stream holds poisoned batches, for the NaN/spike rollback tests."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch

import stoker
from helpers.tiny import make_data, make_estimator

BATCH = 4  # 96 examples: 24 batches in epoch 0, the only epoch these runs reach
POISONED = (9, 13)  # stream batches (counted from the start of training) whose examples are poisoned


def poisoned_data(
    poisoned: Collection[int] = POISONED,
    value: float = math.inf,
    batch: int = BATCH,
    num_shards: int = 1,
    n: int = 96,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` examples whose features in epoch 0's batches ``poisoned`` (of ``batch`` examples: the
    micro-batch; of replica 0 when ``num_shards`` replicas read the data) are ``value`` (inf:
    the loss is NaN)."""
    x, y = make_data(n)
    order = stoker.data.arrays(x, y, read=stoker.data.ReadOptions(batch_size=batch, seed=0, num_shards=num_shards))
    for k in poisoned:
        x[order.batch_indices(0, k)] = value
    return x, y


def _source(x: torch.Tensor, y: torch.Tensor, params: dict[str, Any]) -> stoker.data.ArraySource:
    return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(params))


def train_input(x: torch.Tensor, y: torch.Tensor) -> Callable[[dict[str, Any]], Any]:
    return lambda params: _source(x, y, params)


def omitting(x: torch.Tensor, y: torch.Tensor, omitted: Collection[int]) -> Callable[[dict[str, Any]], Iterator[Any]]:
    """The same stream with the batches ``omitted`` (stream positions, on every replica) taken out."""

    def input_fn(params: dict[str, Any]) -> Iterator[Any]:
        return (batch for i, batch in enumerate(_source(x, y, params)) if i not in omitted)

    return input_fn


def make(model_dir: str | os.PathLike[str], **config: object) -> stoker.Estimator:
    """Loops of 3 steps, a checkpoint at the first boundary past every 4 steps (6, 9, 12, ...)."""
    config = {"batch": BATCH, "iterations_per_loop": 3, "save_checkpoints_steps": 4, **config}
    return make_estimator(model_dir, **config)
