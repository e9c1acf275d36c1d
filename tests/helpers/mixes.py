"""A weighted mixture of two in-memory sources (``stoker.data.mix``), as an ``input_fn``: the
mixture tests and the crash script (scripts/train_script.py ``--mix``) train on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import stoker

WEIGHTS = {"a": 0.7, "b": 0.3}


def mixed_input(
    x: torch.Tensor, y: torch.Tensor, *, workers: int = 0, seed: int = 5, split: int = 60, per: str = "batch"
) -> Callable[[dict[str, Any]], Any]:
    """``input_fn``: examples ``[:split]`` as source ``a`` (weight 0.7, seed 1) and the rest as
    ``b`` (0.3, seed 2), each sharded for the replica, mixed from ``seed`` ``per`` batch or example."""

    def input_fn(params: dict[str, Any]) -> Any:
        read = stoker.data.ReadOptions(seed=1, num_workers=workers).for_replica(params)
        a = stoker.data.arrays(x[:split], y[:split], read=read)
        b = stoker.data.arrays(x[split:], y[split:], read=dataclasses.replace(read, seed=2))
        return stoker.data.mix({"a": (a, WEIGHTS["a"]), "b": (b, WEIGHTS["b"])}, seed=seed, per=per)

    return input_fn
