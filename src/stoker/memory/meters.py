"""Measuring what a training step keeps in memory, exactly and on any device.

Two quantities decide whether a model fits, and both are counted here from the tensors
themselves rather than from an allocator (CPU has no ``max_memory_allocated``, and process
memory mixes tensors with everything else):

- **saved activations** (:class:`SavedActivations`): the tensors autograd keeps from the
  forward pass for the backward pass. Every tensor an operation saves goes through
  ``torch.autograd.graph.saved_tensors_hooks``; the meter records the storage behind it,
  counts each storage once (views share one), and leaves out the model's parameters and
  buffers (they are alive anyway). What is left is exactly the activation memory held between
  forward and backward, the figure activation recompute lowers. It is deterministic: the
  same model and batch give the same bytes on every run and machine.
- **state** (:func:`state_bytes`): parameters, gradients and optimizer state, the figure that
  bf16 weights with stochastic rounding halve.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch


class SavedActivations:
    """Counts the distinct bytes autograd saves for backward while the context is open.

    Args:
        exclude: tensors whose storages are not counted (give ``model.parameters()`` and
            ``model.buffers()``: weights are alive whether or not autograd saves them).

    Use::

        with SavedActivations(exclude=[*model.parameters(), *model.buffers()]) as saved:
            loss = loss_fn(model(x), y)
        saved.bytes  # held until loss.backward()
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {_storage_key(t) for t in exclude}
        self.storages: dict[tuple[str, int], int] = {}
        self.tensors = 0  # how many times a tensor was saved (a storage may be saved many times)
        self._hooks: Any = None

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages saved (parameters and buffers excluded)."""
        return sum(self.storages.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key not in self._excluded:
            self.storages[key] = tensor.untyped_storage().nbytes()
            self.tensors += 1
        return tensor

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._hooks.__exit__(kind, error, tb)
        self._hooks = None


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors``."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        seen[_storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer's per-parameter state (moments, step counts ...)."""
    found: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif hasattr(value, "__tensor_flatten__"):  # a tensor subclass (e.g. a quantized state)
                names, _ = value.__tensor_flatten__()
                found.extend(getattr(value, n) for n in names)
    return found


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """``{"parameters", "gradients", "optimizer", "total"}`` bytes of a model and its optimizer
    (after at least one step, so the optimizer's state exists)."""
    params = list(model.parameters())
    out = {
        "parameters": tensor_bytes(params),
        "gradients": tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": tensor_bytes(optimizer_state_tensors(optimizer)) if optimizer is not None else 0,
    }
    out["total"] = sum(out.values())
    return out


__all__ = ["SavedActivations", "optimizer_state_tensors", "state_bytes", "tensor_bytes"]
