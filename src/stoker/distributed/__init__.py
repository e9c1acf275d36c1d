"""Distribution strategies: the ``Strategy`` interface and its implementations."""

from __future__ import annotations

import os

from .base import SingleDevice, Strategy, resolve_device

__all__ = ["SingleDevice", "Strategy", "make_strategy", "resolve_device"]


def make_strategy(name: str, device: str) -> Strategy:
    """The strategy ``RunConfig.strategy`` names; ``auto`` reads the torchrun environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if name in ("auto", "single") and world == 1:
        return SingleDevice(device)
    raise ValueError(
        f"RunConfig.strategy={name!r} with WORLD_SIZE={world}: this version of stoker trains in one "
        "process only (strategy 'single'); multi-replica strategies are not available yet"
    )
