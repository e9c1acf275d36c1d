"""One class per precision mode behind one interface (Lightning Fabric's precision plugins).

A ``Precision`` is what the engine asks about numerics, so no component branches on a
precision's name: it converts the module and the optimizer when they are built, gives the
context the forward pass runs in, scales the loss before ``backward``, wraps the optimizer step
(unscale, and skip it on inf/NaN gradients for fp16 with a dynamic scale), and carries the
state a checkpoint keeps (fp16's loss scaler; the others have none).

``RunConfig(precision="bf16")`` names a mode; ``RunConfig(precision=BF16Precision())`` gives
one. Either way the run works on its own fresh copy (``fresh()``): a config shared by two
Estimators never shares a loss scale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ConfigError
from ..memory.stochastic_rounding import StochasticRounding, to_bf16
from .loss_scale import LossScale, LossScaler


class Precision:
    """The interface every precision mode implements; the defaults are fp32's (do nothing).

    Attributes:
        name: the name ``RunConfig(precision=...)`` takes for this mode (:data:`PRECISIONS`
            lists them, from the classes).
        autocast_dtype: the dtype the forward pass autocasts to (``None``: no autocast).
        master_weights: the dtype the weights (and the update) are kept in, as a precision name.
        scaler: the loss scaler whose state checkpoints keep (``None``: no loss scaling).
        pipeline_ok: whether a pipelined run (``RunConfig.pipeline``) supports this mode.
    """

    name: ClassVar[str]
    autocast_dtype: ClassVar[torch.dtype | None] = None
    master_weights: ClassVar[str] = "fp32"
    pipeline_ok: ClassVar[bool] = True
    scaler: LossScaler | None = None

    # ------------------------------------------------------------ building
    def convert_module(self, module: nn.Module, *, sharded: bool = False) -> nn.Module:
        """The module as this mode trains it (before warm start and wrapping); may convert in place."""
        return module

    def convert_optimizer(self, optimizer: torch.optim.Optimizer, *, seed: int) -> torch.optim.Optimizer:
        """The optimizer as this mode steps it (``seed``: the run's, the same on every replica)."""
        return optimizer

    def check_run(self, *, loss_scale: LossScale, compile_mode: str, cuda_graph: bool) -> None:
        """Refuse, with a ``ConfigError``, run settings this mode does not support."""

    # ------------------------------------------------------------ stepping
    @property
    def autocasts(self) -> bool:
        """Whether the forward pass runs under autocast (fp32: no context at all)."""
        return self.autocast_dtype is not None

    def forward_context(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The context the forward pass (and the loss) runs in."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The tensor to call ``backward`` on."""
        return loss

    def optimizer_step(self, parameters: Sequence[torch.Tensor], step: Callable[[], None]) -> bool:
        """Prepare the gradients of ``parameters`` and call ``step`` (clipping and the update)
        unless this step must be skipped; return whether it ran."""
        step()
        return True

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of this mode (its ``"scaler"`` entry); ``None``: nothing."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`'s value (a mode without state ignores it)."""

    def fresh(self) -> Precision:
        """A copy with the same settings and the initial state (each run steps its own)."""
        return type(self)()

    # ------------------------------------------------------------ value semantics
    def _settings(self) -> tuple[Any, ...]:
        return ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Precision) and type(other) is type(self) and other._settings() == self._settings()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._settings()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __str__(self) -> str:
        return self.name


class FP32Precision(Precision):
    """fp32 throughout: no autocast, no loss scaling."""

    name = "fp32"


class BF16Precision(Precision):
    """bf16 autocast over fp32 master weights; bf16 has fp32's exponent range, so no loss scaling."""

    name = "bf16"
    autocast_dtype = torch.bfloat16


class FP16Precision(Precision):
    """fp16 autocast over fp32 master weights, with loss scaling (``stoker.precision.LossScale``).

    Args:
        loss_scale: a ``LossScale``, ``"dynamic"`` (``LossScale()``) or a number (a static scale).
    """

    name = "fp16"
    autocast_dtype = torch.float16
    pipeline_ok = False

    def __init__(self, *, loss_scale: LossScale | float | str = "dynamic") -> None:
        self.loss_scale = LossScale.of(loss_scale)
        scale = self.loss_scale
        if scale.dynamic:
            self.scaler = LossScaler(dynamic=True, init_scale=scale.init, growth_interval=scale.growth_interval)
        else:
            self.scaler = LossScaler(dynamic=False, init_scale=scale.init)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        assert self.scaler is not None
        return self.scaler.scale_loss(loss)

    def optimizer_step(self, parameters: Sequence[torch.Tensor], step: Callable[[], None]) -> bool:
        """Unscale the gradients; with a dynamic scale, skip ``step`` on inf/NaN (one host read)."""
        assert self.scaler is not None
        found_inf = self.scaler.unscale_(parameters)
        if not self.scaler.step_ok(found_inf):
            return False
        step()
        return True

    def state_dict(self) -> dict[str, Any] | None:
        assert self.scaler is not None
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            assert self.scaler is not None
            self.scaler.load_state_dict(state)

    def fresh(self) -> FP16Precision:
        return FP16Precision(loss_scale=self.loss_scale)

    def _settings(self) -> tuple[Any, ...]:
        return (self.loss_scale,)

    def __repr__(self) -> str:
        return f"FP16Precision(loss_scale={self.loss_scale!r})"


class BF16SRPrecision(Precision):
    """bf16 weights and optimizer state with stochastically rounded updates
    (``stoker.memory.stochastic_rounding``), under bf16 autocast; no loss scaling."""

    name = "bf16-sr"
    autocast_dtype = torch.bfloat16
    master_weights = "bf16"
    pipeline_ok = False

    def convert_module(self, module: nn.Module, *, sharded: bool = False) -> nn.Module:
        if sharded:
            raise ConfigError(
                "RunConfig: precision='bf16-sr' does not support a sharded strategy (FSDP keeps its own "
                "parameter dtypes); use strategy='replicated' or another precision"
            )
        to_bf16(module)  # before warm start: fp32 weights are then rounded to nearest once
        return module

    def convert_optimizer(self, optimizer: torch.optim.Optimizer, *, seed: int) -> torch.optim.Optimizer:
        # One seed on every replica: they apply the same averaged gradient and must round it
        # the same way, or their weights drift apart.
        return StochasticRounding(optimizer, seed=seed)

    def check_run(self, *, loss_scale: LossScale, compile_mode: str, cuda_graph: bool) -> None:
        """bf16-sr's update runs eagerly, one parameter at a time, and needs no loss scaling."""
        if not loss_scale.dynamic:
            raise ConfigError(
                f"RunConfig.loss_scale={loss_scale.describe()} is fp16 loss scaling; "
                "precision='bf16-sr' has fp32's exponent range and scales no loss (leave loss_scale unset, or "
                "use precision='fp16')"
            )
        if compile_mode == "step" or cuda_graph:
            raise ConfigError(
                "RunConfig: precision='bf16-sr' does not run with compile='step' or cuda_graph=True (its update "
                "steps one parameter at a time with its own generator); use compile='module' or 'none'"
            )


_BY_NAME: dict[str, type[Precision]] = {
    cls.name: cls for cls in (FP32Precision, BF16Precision, FP16Precision, BF16SRPrecision)
}
#: the names ``RunConfig(precision=...)`` takes: the modes' own, in this order
PRECISIONS: tuple[str, ...] = tuple(_BY_NAME)


def precision_names(*, master_weights: str | None = None) -> tuple[str, ...]:
    """The names of :data:`PRECISIONS` whose mode keeps its weights in ``master_weights``
    (``"fp32"``: the autocast modes over fp32 master weights, what ``stoker bench`` offers)."""
    return tuple(name for name, cls in _BY_NAME.items() if master_weights in (None, cls.master_weights))


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the forward pass of the mode named ``precision`` computes in (fp32: ``float32``)."""
    return _mode(precision).autocast_dtype or torch.float32


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """A context manager running the forward pass in the precision named ``precision`` (a no-op
    for fp32). Kept for code that holds a name (the bench); a run asks its ``Precision``."""
    dtype = _mode(precision).autocast_dtype
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=device.type, dtype=dtype)


def _mode(precision: str) -> type[Precision]:
    cls = _BY_NAME.get(precision)
    if cls is None:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    return cls


def make_precision(precision: str | Precision, loss_scale: LossScale | float | str = "dynamic") -> Precision:
    """A fresh ``Precision`` for ``precision`` (a name, or an instance whose settings are copied);
    ``loss_scale`` is fp16's when a name is given."""
    if isinstance(precision, Precision):
        return precision.fresh()
    cls = _BY_NAME.get(precision) if isinstance(precision, str) else None
    if cls is None:
        raise ConfigError(
            f"RunConfig.precision must be one of {', '.join(PRECISIONS)}; got {precision!r} "
            "(or give a stoker.precision.Precision, e.g. BF16Precision())"
        )
    if cls is FP16Precision:
        return FP16Precision(loss_scale=loss_scale)
    return cls()


__all__ = [
    "PRECISIONS",
    "BF16Precision",
    "BF16SRPrecision",
    "FP16Precision",
    "FP32Precision",
    "Precision",
    "autocast_context",
    "compute_dtype",
    "make_precision",
    "precision_names",
]
