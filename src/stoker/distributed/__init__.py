"""Distribution strategies: the ``Strategy`` interface and its implementations.

=============  ==========================================================================
strategy       what it is for
=============  ==========================================================================
single         one process, one device (what ``auto`` picks without torchrun)
replicated     data parallel with DDP: the whole model on every replica, gradients
               averaged; what ``auto`` picks under torchrun
independent    replicas train without syncing gradients: to benchmark the step alone
=============  ==========================================================================
"""

from __future__ import annotations

import atexit
import os

from .base import SingleDevice, Strategy, resolve_device
from .process_group import Independent, ProcessGroupStrategy, ReplicaLostError, Replicated

__all__ = [
    "Independent",
    "ProcessGroupStrategy",
    "ReplicaLostError",
    "Replicated",
    "SingleDevice",
    "Strategy",
    "make_strategy",
    "resolve_device",
]


def make_strategy(name: str, device: str, timeout: float = 1800.0) -> Strategy:
    """The strategy ``RunConfig.strategy`` names; ``auto`` reads the torchrun environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SingleDevice(device)  # every strategy is the identity with one replica
    if name == "single":
        raise ValueError(
            f"RunConfig.strategy='single' but WORLD_SIZE={world}: use 'auto' or 'replicated' under torchrun"
        )
    if name == "sharded":
        raise ValueError(
            "RunConfig.strategy='sharded' (FSDP2) is not available in this version; use 'replicated'"
        )
    strategy: Strategy = Independent(device, timeout) if name == "independent" else Replicated(device, timeout)
    atexit.register(strategy.teardown)
    return strategy
