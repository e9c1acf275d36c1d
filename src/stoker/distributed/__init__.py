"""Distribution strategies: the ``Strategy`` interface and its implementations.

=============  ==========================================================================
strategy       what it is for
=============  ==========================================================================
single         one process, one device (what ``auto`` picks without torchrun)
replicated     data parallel with DDP: the whole model on every replica, gradients
               averaged; what ``auto`` picks under torchrun
sharded        FSDP2 (``fully_shard``): parameters, gradients and optimizer state sliced
               over replicas, for models whose training state does not fit one device;
               checkpoints go to ``ckpt-<step>/dcp/`` (torch.distributed.checkpoint)
independent    replicas train without syncing gradients: to benchmark the step alone
pipeline       replicas x pipeline stages (``RunConfig.pipeline``): the model cut into
               stages run by ``torch.distributed.pipelining`` schedules, gradients averaged
               over the replicas of each stage; checkpoints as ``sharded``
=============  ==========================================================================

Strategies may import storage, memory, resolve (the device rule's ``Choice``) and errors; never
the engine or the Estimator, which ask a strategy what to do and never which strategy they hold.
"""

from __future__ import annotations

import os

from ..errors import ConfigError
from .base import SingleDevice, Strategy, device_choice, resolve_device
from .config import STRATEGIES, DistributionConfig
from .pipeline import PipelineConfig, PipelineStrategy
from .process_group import Independent, ProcessGroupStrategy, ReplicaLostError, Replicated
from .sharded import Sharded
from .watchdog import StuckReplica

__all__ = [
    "STRATEGIES",
    "DistributionConfig",
    "Independent",
    "PipelineConfig",
    "PipelineStrategy",
    "ProcessGroupStrategy",
    "ReplicaLostError",
    "Replicated",
    "Sharded",
    "SingleDevice",
    "Strategy",
    "StuckReplica",
    "device_choice",
    "make_strategy",
    "resolve_device",
    "torchrun_rank",
    "torchrun_world_size",
]


def torchrun_rank() -> int:
    """This process's rank as torchrun sets it (``RANK``; 0 without torchrun)."""
    return int(os.environ.get("RANK", "0") or 0)


def torchrun_world_size() -> int:
    """The number of processes torchrun started (``WORLD_SIZE``; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def make_strategy(
    name: str,
    device: str,
    timeout: float = 1800.0,
    pipeline: PipelineConfig | None = None,
    *,
    bucket_cap_mb: float | None = None,
) -> Strategy:
    """The strategy ``RunConfig.strategy`` names; ``auto`` reads the torchrun environment
    (and picks ``pipeline`` when ``pipeline`` is given).
    ``bucket_cap_mb``: DDP's gradient bucket size for ``replicated`` (``None``: DDP's default)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SingleDevice(device)  # every strategy is the identity with one replica (a pipeline runs unsplit)
    if pipeline is not None:
        return PipelineStrategy(device, timeout, pipeline)
    if name == "single":
        raise ConfigError(
            f"RunConfig.strategy='single' but WORLD_SIZE={world}: use 'auto' or 'replicated' under torchrun"
        )
    kinds = {"independent": Independent, "sharded": Sharded}
    strategy: Strategy = kinds.get(name, Replicated)(device, timeout)
    if isinstance(strategy, Replicated):
        strategy.bucket_cap_mb = bucket_cap_mb
    return strategy  # it tears itself down at exit (ProcessGroupStrategy registers that)
