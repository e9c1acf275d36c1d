"""The ``Strategy`` interface: how replicas are formed and talk to each other.

The Estimator asks its strategy for the device, the replica's rank and the number of
replicas, wraps the model with it, and reduces values through it. It never asks which
strategy it has: everything that differs between one process and many lives here.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .watchdog import Progress


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the local CUDA device when there is one, else the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"RunConfig.device={name!r}, but torch sees no CUDA device; use 'cpu' or 'auto'")
    return device


class Strategy(ABC):
    """Where a replica runs and how replicas combine their work."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    # Whether each replica holds only a slice of the model (checkpoints are then written by
    # every replica with torch.distributed.checkpoint).
    shards_state: bool = False
    # Where this replica is (step, phase, collectives entered), for naming a stuck replica;
    # None alone (nobody waits for it). The training run marks it; see watchdog.py.
    progress: Progress | None = None
    # Where this process's optimizer state goes in a torch.distributed.checkpoint (shards_state).
    optimizer_checkpoint_key: str = "optimizer"

    @property
    def num_replicas(self) -> int:
        """Data-parallel replicas (each reads its own share of the data); the processes of a
        pipelined replica count once."""
        return self.world_size

    @property
    def replica_index(self) -> int:
        """This process's replica (what ``params['replica_index']`` says)."""
        return self.rank

    @property
    def is_chief(self) -> bool:
        """The replica that writes checkpoints, summaries and logs."""
        return self.rank == 0

    @abstractmethod
    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The module the training step calls (e.g. a DDP wrapper); ``model`` stays the owner of the weights."""

    @abstractmethod
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over replicas (the same on every replica; the processes of a
        pipelined replica hold the same value and count once)."""

    @abstractmethod
    def any_replica(self, flag: bool) -> bool:
        """Whether ``flag`` is true on at least one replica (so all replicas decide alike)."""

    @abstractmethod
    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every replica's ``obj``, in rank order, on every replica."""

    def gather_over_replicas(self, obj: Any) -> list[Any]:
        """Every replica's ``obj``, in replica order (processes of one pipelined replica count once)."""
        return self.all_gather_object(obj)

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every replica gets here."""

    @abstractmethod
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` from replica ``src``, on every replica."""

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's complete weights as CPU tensors (collective when the state is sharded)."""
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    def explain_failure(self, error: BaseException) -> BaseException:
        """A clearer error for a failure seen during training (e.g. naming a lost replica)."""
        return error

    def teardown(self) -> None:
        """Release process-group resources."""


class SingleDevice(Strategy):
    """One process on one device: every collective is the identity."""

    def __init__(self, device: str = "auto") -> None:
        self.device = resolve_device(device)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def any_replica(self, flag: bool) -> bool:
        return flag

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj
