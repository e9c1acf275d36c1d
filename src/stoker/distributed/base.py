"""The ``Strategy`` interface: how replicas are formed and talk to each other.

The Estimator asks its strategy for the device, the replica's rank and the number of
replicas, wraps the model with it, and reduces values through it. It never asks which
strategy it has: everything that differs between one process and many lives here.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..resolve import Choice, Reason
from .watchdog import Progress


def device_choice(name: str, *, indices: Sequence[int] = ()) -> Choice[torch.device]:
    """Where this replica runs, the one rule for every device name: ``auto`` is CUDA where torch
    sees it, else the CPU; ``cuda`` (and ``auto`` on CUDA) is the device of this replica,
    ``LOCAL_RANK`` modulo the devices, or entry ``LOCAL_RANK`` of ``indices`` (``stoker bench
    --gpu_indices``); ``cpu`` and ``cuda:N`` are what they say. A device torch cannot use is a
    ``ConfigError`` whose message is a :class:`~stoker.resolve.Reason` (it names the settings)."""
    given = name
    asked = Reason(lambda n: n("device", given))
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            Reason(lambda n: f"{n('device', given)}, but torch sees no CUDA device; use {n('device', 'cpu')}")
        )
    if device.type != "cuda":
        if indices:
            raise ConfigError(
                Reason(
                    lambda n: (
                        f"{n('gpu_indices', tuple(indices))} names CUDA devices, but the device is the CPU "
                        f"({n('device', name)})"
                    )
                )
            )
        return Choice(device, "auto: torch sees no CUDA device" if given == "auto" else asked)
    if device.index is not None:
        return Choice(device, asked)
    local_rank, count = int(os.environ.get("LOCAL_RANK", "0") or 0), torch.cuda.device_count()  # torchrun
    if indices:
        if local_rank >= len(indices) or max(indices) >= count:
            raise ConfigError(
                Reason(
                    lambda n: (
                        f"{n('gpu_indices', tuple(indices))}: replica {local_rank} needs an entry, and "
                        f"torch sees {count} CUDA device(s)"
                    )
                )
            )
        entry = Reason(lambda n: f"{n('gpu_indices', tuple(indices))}, replica {local_rank}")
        return Choice(torch.device("cuda", indices[local_rank]), entry)
    return Choice(torch.device("cuda", local_rank % count), "auto: torch sees CUDA" if given == "auto" else asked)


def resolve_device(name: str) -> torch.device:
    """The device :func:`device_choice` chooses for ``name``."""
    return device_choice(name).value


class Strategy(ABC):
    """Where a replica runs and how replicas combine their work."""

    device: torch.device
    #: how ``device`` was chosen (:func:`device_choice`); ``None`` where the strategy places itself
    device_choice: Choice[torch.device] | None = None
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
        self.device_choice = device_choice(device)
        self.device = self.device_choice.value

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
