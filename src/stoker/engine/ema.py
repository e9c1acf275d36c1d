"""``EmaWeights``: an exponential moving average of the model's weights, kept beside them.

``RunConfig(ema=stoker.EMA(decay=..., start_step=..., every_n_steps=...))`` asks for it. The
average covers, by name, the parameters that train when it starts and every floating-point
buffer (a batch norm's running statistics: the average's statistics go with its weights); it
is held in fp32 where the weights are in half precision (``bf16-sr``), where an update of
``1 - decay`` would otherwise round away. It is updated after every global step
``EMA.updates_at`` names, by the device loop, with no host sync: the first update copies the
weights, each later one moves the average ``1 - decay`` of the way to them (torch's
``get_ema_multi_avg_fn``: one ``_foreach_lerp_`` over the list). Which steps update it depends
on the global step alone, and the average and its count are in every checkpoint
(``ema.safetensors`` beside ``model.safetensors``; sharded runs: the ``ema`` entry of
``dcp/``), so a run resumed anywhere continues it bitwise.

Under FSDP2 the average of a sharded parameter is a DTensor sharded like it: each replica
averages its own slices (the update works on the local tensors) and writes them into ``dcp/``.
Elsewhere each replica holds the whole average, the same on all.

For inference (``EMA.use_for_inference``, the default) :meth:`EmaWeights.applied` puts the
average in the model for the time evaluation, prediction or an export's copy runs, with the
weights copied aside and put back bitwise after; training never sees it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from ..config.slices import EMA
from ..errors import CheckpointError

_HALF = (torch.float16, torch.bfloat16)


class EmaWeights:
    """The average ``config`` asks for, of the model given to :meth:`attach`.

    ``updates`` counts the updates made (0: not started; inference then uses the weights);
    ``tensors`` holds the average by name once started.
    """

    def __init__(self, config: EMA) -> None:
        self.config = config
        self.updates = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self._model: nn.Module | None = None
        self._lerp = get_ema_multi_avg_fn(config.decay)

    def attach(self, model: nn.Module) -> None:
        """Average ``model``'s weights (the plain module: DDP's inner one, FSDP2's sharded one)."""
        self._model = model

    @property
    def started(self) -> bool:
        return self.updates > 0

    @property
    def model(self) -> nn.Module:
        assert self._model is not None, "EmaWeights.attach(model) first"
        return self._model

    # ---------------------------------------------------------------- updating
    def after_step(self, step: int) -> None:
        """Update the average if global step ``step`` (just finished) is one of its steps."""
        if self.config.updates_at(step):
            self.update()

    @torch.no_grad()
    def update(self) -> None:
        """One update: the first copies the weights, the others move the average toward them."""
        weights = _named(self.model)
        if not self.updates:
            self.tensors = {name: _held(w) for name, w in _averaged(self.model).items()}
        else:
            ema, now = [], []
            for name, e in self.tensors.items():
                local, w = _local(e), _local(weights[name])
                ema.append(local)
                now.append(w if w.dtype == local.dtype else w.to(local.dtype))
            self._lerp(ema, now, self.updates)
        self.updates += 1

    # ---------------------------------------------------------------- inference
    @contextlib.contextmanager
    def applied(self) -> Iterator[bool]:
        """Within the block the model holds the average (if ``use_for_inference`` and started);
        after it, its own weights again, bitwise. Yields whether the average is in use."""
        if not (self.config.use_for_inference and self.started):
            yield False
            return
        weights = _named(self.model)
        saved = {name: _local(weights[name]).clone() for name in self.tensors}
        try:
            with torch.no_grad():
                for name, e in self.tensors.items():
                    _local(weights[name]).copy_(_local(e))
            yield True
        finally:
            with torch.no_grad():
                for name, w in saved.items():
                    _local(weights[name]).copy_(w)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What ``train_state.pt`` records of it: the updates made and the names averaged (the
        tensors go in ``ema.safetensors``, or ``dcp/``)."""
        return {"updates": self.updates, "names": list(self.tensors)}

    def checkpoint_tensors(self) -> dict[str, torch.Tensor] | None:
        """The average to write (``None`` before it started)."""
        return self.tensors if self.started else None

    def placeholders(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Tensors shaped (and sharded) as the average of ``names`` will be, to load into."""
        weights = _named(self.model)
        missing = [n for n in names if n not in weights]
        if missing:
            raise CheckpointError(
                f"the checkpoint's EMA average does not fit the model: {', '.join(missing[:3])} not in the model"
            )
        return {name: _held(weights[name]) for name in names}

    def load(self, meta: Mapping[str, Any] | None, tensors: Mapping[str, torch.Tensor] | None) -> None:
        """Take a checkpoint's average: its ``train_state.pt`` entry and ``ema.safetensors``
        (``None``: it has none; the average then starts afresh at its next step)."""
        slots = self.slots(meta if tensors is not None else None)
        if slots is not None and tensors is not None:
            if set(tensors) != set(slots):
                raise CheckpointError(
                    "the checkpoint's ema.safetensors does not hold the names its train_state.pt lists"
                )
            with torch.no_grad():
                for name, t in tensors.items():
                    _fill(slots[name], t)

    def slots(self, meta: Mapping[str, Any] | None) -> dict[str, torch.Tensor] | None:
        """Take a checkpoint's average by its ``train_state.pt`` entry: the tensors it is to be
        loaded into (they are the average from now on; a sharded checkpoint's ``dcp/`` fills
        them), or ``None`` when it has none."""
        updates = int((meta or {}).get("updates", 0))
        if meta is None or not updates:
            self.updates, self.tensors = 0, {}
            return None
        self.tensors = self.placeholders(list(meta["names"]))
        self.updates = updates
        return self.tensors


def _named(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` by name."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _averaged(model: nn.Module) -> dict[str, torch.Tensor]:
    """What the average covers: the parameters that train and the floating-point buffers."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad and p.is_floating_point()}
    return {**params, **{n: b for n, b in model.named_buffers() if b.is_floating_point()}}


def _held(w: torch.Tensor) -> torch.Tensor:
    """A copy of ``w`` as the average holds it: fp32 for half-precision weights (sharded as ``w``)."""
    w = w.detach()
    return w.float() if w.dtype in _HALF else w.clone()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This replica's part of ``t``: a DTensor's local shard (a view), else ``t``."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _fill(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy the full tensor ``src`` into ``dst``, into this replica's slices where ``dst`` is sharded."""
    if src.shape != dst.shape:
        raise CheckpointError(
            f"the checkpoint's EMA average does not fit the model: {list(src.shape)} where the model has "
            f"{list(dst.shape)}"
        )
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(dst, DTensor):
        dst.copy_(distribute_tensor(src.to(dst.device), dst.device_mesh, dst.placements))
    else:
        dst.copy_(src)


__all__ = ["EmaWeights"]
