"""fp16 loss scaling: ``LossScale`` (the setting, as ``RunConfig.loss_scale`` holds it) and
``LossScaler`` (the running state built from it, part of every fp16 checkpoint).

fp16 gradients underflow without loss scaling, so the loss is multiplied by a scale before
``backward`` and the gradients divided by it before the update:

- **static** (``loss_scale=128``, or ``LossScale(dynamic=False, init=128)``): a fixed scale,
  no checks, no host sync.
- **dynamic** (``loss_scale="dynamic"``, or ``LossScale(init=..., growth_interval=...)``,
  tf_cnn_benchmarks' auto loss scale): on inf/NaN gradients the update is skipped and the scale
  halved; after ``growth_interval`` good steps in a row it doubles. Deciding to skip needs one
  host read of an "any inf" flag per step, the same cost as ``torch.amp.GradScaler``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class LossScale:
    """fp16 loss scaling as ``RunConfig(loss_scale=...)`` takes it (other precisions ignore it).

    Attributes:
        dynamic: ``True``: start at ``init``, halve the scale (and skip the update) on inf/NaN
            gradients, double it after ``growth_interval`` good steps in a row. ``False``: a
            fixed scale of ``init``, no checks and no host sync.
        init: the scale (static) or the scale to start from (dynamic); a positive number.
        growth_interval: good steps in a row before a dynamic scale doubles; a positive integer.

    ``RunConfig`` also takes the short forms ``loss_scale="dynamic"`` (``LossScale()``) and
    ``loss_scale=128`` (``LossScale(dynamic=False, init=128.0)``) and stores them as a
    ``LossScale``. A bad value raises ``ConfigError`` (a ``ValueError``) naming the field and what it accepts.
    """

    dynamic: bool = True
    init: float = 2.0**15
    growth_interval: int = 1000

    def __post_init__(self) -> None:
        if not isinstance(self.dynamic, bool):
            raise ConfigError(f"LossScale.dynamic must be True or False; got {self.dynamic!r}")
        init = self.init
        if isinstance(init, bool) or not isinstance(init, (int, float)) or not (init > 0 and math.isfinite(init)):
            raise ConfigError(f"LossScale.init must be a positive finite number; got {init!r}")
        object.__setattr__(self, "init", float(init))
        interval = self.growth_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f"LossScale.growth_interval must be a positive integer; got {interval!r}")

    @classmethod
    def of(cls, value: LossScale | float | str) -> LossScale:
        """``value`` as a ``LossScale``: itself, ``"dynamic"`` (the defaults) or a positive number (a static scale)."""
        if isinstance(value, LossScale):
            return value
        if value == "dynamic":
            return cls()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
            raise ConfigError(
                "RunConfig.loss_scale must be a positive number or 'dynamic' (or a stoker.precision.LossScale); "
                f"got {value!r}"
            )
        return cls(dynamic=False, init=float(value))

    def describe(self) -> str:
        """The short form: ``'dynamic'`` or the static scale (``128``)."""
        return "'dynamic'" if self.dynamic else f"{self.init:g}"


class LossScaler:
    """Loss scaling for fp16, static or dynamic; its state is part of every checkpoint."""

    def __init__(
        self,
        *,
        dynamic: bool,
        init_scale: float,
        growth_interval: int = 1000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
    ) -> None:
        self.dynamic = dynamic
        self.scale = float(init_scale)
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.good_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor | None:
        """Divide gradients by the scale in place; return a 0-dim "found inf" flag (dynamic only)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return None
        inv = 1.0 / self.scale
        if not self.dynamic:
            torch._foreach_mul_(grads, inv)
            return None
        found_inf = torch.zeros((), dtype=torch.float32, device=grads[0].device)
        inv_t = torch.full((), inv, dtype=torch.float32, device=grads[0].device)
        by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), group in by_device.items():
            flag = found_inf if device == found_inf.device else torch.zeros((), device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, flag, inv_t.to(device))
            if flag is not found_inf:
                found_inf += flag.to(found_inf.device)
        return found_inf

    def step_ok(self, found_inf: torch.Tensor | None) -> bool:
        """Whether to apply this step's update; adjusts the scale (one host read when dynamic)."""
        if not self.dynamic or found_inf is None:
            return True
        if found_inf.item() > 0:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped_steps += 1
            return False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "dynamic": self.dynamic,
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped_steps": self.skipped_steps,
            "growth_interval": self.growth_interval,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A dynamic scale goes on from the checkpoint's running value (its init is where a new run
        # starts); a static scale is a setting, used as given (the same value when unchanged).
        if self.dynamic:
            self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])
