"""bf16 weights with stochastic rounding (``RunConfig(precision="bf16-sr")``).

A bf16 number has 8 bits of mantissa: an update smaller than half a unit in the last place of
the weight (``|lr * step| < 2**-9 * |w|``) is lost entirely when the new weight is rounded to
the nearest bf16, so training with pure bf16 weights stalls once updates get small. Stochastic
rounding picks one of the two neighbouring bf16 values at random, each with probability
proportional to its closeness (one minus its distance over the spacing): the rounded value is
exact *in expectation*, and many small updates add up to what fp32 would have accumulated.

How: the fp32 bit pattern of a value is ``[sign | exponent | 7 high mantissa bits | 16 low
bits]``; bf16 keeps the upper 16 bits. Adding a uniform random integer in ``[0, 2**16)`` to the
pattern and cutting off the low 16 bits carries into the kept bits with probability
``low_bits / 2**16``, which is the distance to the next bf16 (away from zero) over the spacing,
for either sign (the sign bit is untouched; magnitudes grow away from zero). An exact bf16 value
has zero low bits and never moves; a carry out of the mantissa steps into the next binade,
which is the right neighbour there too.

:class:`StochasticRounding` applies this to any ``torch.optim`` optimizer whose update treats
each parameter on its own (all of them but ``LBFGS``): the parameters and their floating-point
optimizer state live in bf16; for one parameter at a time it computes the update in fp32 (the
inner optimizer steps on fp32 copies of that one parameter, its gradient and its state) and
rounds the results back to bf16 stochastically. One parameter at a time keeps the fp32
scratch to the size of the largest parameter, so the peak falls with the memory at rest.

The random bits come from a ``torch.Generator`` the wrapper owns, seeded from ``RunConfig.seed``
(the same on every replica: replicas apply the same averaged gradient and must round it the
same way) and saved in the optimizer's ``state_dict``, so a killed run resumes bitwise.
Evaluation and prediction never round: only ``step`` draws random bits.

Why not torchao's ``bf16_stochastic_round`` optimizers: in torchao 0.18 the plain AdamW that
offers it is private (``_AdamW``, "only for quantized training"), it exists for Adam/AdamW only,
every parameter shape compiles a ``torch.compile`` graph (35 s on this CPU for a 2-layer MLP),
and its random bits come from the global generator inside a compiled graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..errors import CheckpointMismatchError, ConfigError

#: key of the wrapper's own entry in the optimizer ``state_dict``
STATE_KEY = "stochastic_rounding"


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` rounded to bf16 stochastically (unbiased: the mean over draws is ``x``).

    NaN and infinity stay what they are; a finite value near bf16's largest may round to
    infinity (as round-to-nearest does just above it). ``generator`` must be on ``x``'s device.
    """
    x32 = x.detach().to(torch.float32).contiguous()
    noise = torch.randint(0, 1 << 16, x32.shape, dtype=torch.int32, device=x32.device, generator=generator)
    # int32 addition wraps like uint32 for these patterns (no finite value reaches 0x7fffffff),
    # and -65536 is 0xffff0000: the mask keeping the upper 16 bits.
    bits = (x32.view(torch.int32) + noise) & -65536
    rounded = bits.view(torch.float32).to(torch.bfloat16)  # exact: the low bits are zero
    # A NaN whose payload sits in the low bits could carry into an infinity: keep NaN as NaN.
    return torch.where(torch.isnan(x32), x32.to(torch.bfloat16), rounded)


class StochasticRounding(torch.optim.Optimizer):
    """Wraps ``optimizer`` so bf16 parameters and state are updated in fp32 and rounded back stochastically.

    Args:
        optimizer: a fresh (never stepped) ``torch.optim`` optimizer over the (bf16)
            parameters; parameters of another dtype are updated by it as they are, unrounded.
        seed: seeds the generator of the rounding's random bits.

    The wrapper's ``param_groups`` hold the model's parameters (LR schedules, ``zero_grad`` and
    gradient clipping use them as usual). The inner optimizer holds a stand-in parameter for
    each (empty between steps), because the update must not change the dtype of the model's
    own parameters even for a moment: that would reset their gradient accumulators, and with
    them the hooks DDP averages gradients with. ``state_dict`` is the inner optimizer's plus the
    generator state under ``"stochastic_rounding"``; ``load_state_dict`` requires that entry.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, seed: int) -> None:
        if isinstance(optimizer, StochasticRounding):
            raise ConfigError("precision='bf16-sr': the optimizer already rounds stochastically (wrapped twice)")
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError(
                "precision='bf16-sr' does not support torch.optim.LBFGS (its update couples all parameters "
                "and needs a closure); use fp32 or bf16, or an optimizer that updates each parameter on its own"
            )
        if optimizer.state:
            raise ConfigError("precision='bf16-sr': wrap the optimizer before its first step (it already has state)")
        self.inner = optimizer
        groups = []
        for g in optimizer.param_groups:
            groups.append({**g, "params": list(g["params"])})
            g["params"] = [_stand_in(p) for p in g["params"]]
        self._building = True
        super().__init__(groups, optimizer.defaults)
        self._building = False
        self.state = optimizer.state  # keyed by the stand-ins; what memory counters read
        self.generator = torch.Generator(device=_device_of(groups))
        self.generator.manual_seed(seed)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_building", False):  # Optimizer.__init__ registering our groups
            super().add_param_group(param_group)
            return
        self.inner.add_param_group({**param_group, "params": [_stand_in(p) for p in param_group["params"]]})
        super().add_param_group({**self.inner.param_groups[-1], "params": list(param_group["params"])})

    def _pairs(self) -> list[tuple[dict[str, Any], list[tuple[nn.Parameter, nn.Parameter]]]]:
        """Each inner group with its (parameter, stand-in) pairs; hyper-parameters copied in
        (a schedule changes ours)."""
        pairs = []
        for mine, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update((k, v) for k, v in mine.items() if k != "params")
            pairs.append((inner, list(zip(mine["params"], inner["params"], strict=True))))
        return pairs

    @torch.no_grad()
    # override: torch overloads step on closure (a closure -> float); this step refuses a closure
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """One update of every parameter that has a gradient, one parameter at a time."""
        if closure is not None:
            raise ConfigError(
                "precision='bf16-sr': optimizer.step(closure) is not supported (the step runs once per parameter)"
            )
        pairs = self._pairs()
        saved = [inner["params"] for inner, _ in pairs]
        try:
            for inner, _ in pairs:  # the inner optimizer sees one parameter of one group at a time
                inner["params"] = []
            for inner, group in pairs:
                for p, stand_in in group:
                    if p.grad is not None:
                        inner["params"] = [stand_in]
                        self._step_one(p, stand_in)
                inner["params"] = []
        finally:
            for (inner, _), params in zip(pairs, saved, strict=True):
                inner["params"] = params

    def _step_one(self, p: nn.Parameter, stand_in: nn.Parameter) -> None:
        state = self.inner.state[stand_in]
        if p.dtype != torch.bfloat16:  # updated as it is: the stand-in shares its memory
            stand_in.data, stand_in.grad = p.data, p.grad
            self.inner.step()
            stand_in.data, stand_in.grad = _empty_like(stand_in), None
            return
        grad = p.grad
        assert grad is not None  # step() passes only parameters that have a gradient
        stand_in.data, stand_in.grad = p.float(), grad.float()
        for k, v in state.items():
            if k != "step" and _is_bf16(v):
                state[k] = v.float()
        self.inner.step()
        p.copy_(self.round(stand_in))
        stand_in.data, stand_in.grad = _empty_like(stand_in), None
        # Every floating-point state tensor but "step" is kept in bf16, the one created by the
        # first step (fp32, from the fp32 stand-in) too.
        for k, v in list(state.items()):
            if k != "step" and isinstance(v, torch.Tensor) and v.dtype == torch.float32:
                state[k] = self.round(v)

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (fp32) as bf16: stochastically, with the wrapper's generator."""
        return stochastic_round_bf16(x, self.generator)

    def state_dict(self) -> dict[str, Any]:
        self._pairs()  # the inner groups take the current learning rate etc.
        state = self.inner.state_dict()
        state[STATE_KEY] = {"generator": self.generator.get_state()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        mine = state_dict.pop(STATE_KEY, None)
        if mine is None:
            raise CheckpointMismatchError(
                "the optimizer state has no stochastic-rounding generator: it was not written with "
                "precision='bf16-sr' (resume with the precision that wrote it)"
            )
        self.inner.load_state_dict(state_dict)
        self.state = self.inner.state
        for mine_group, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            mine_group.update((k, v) for k, v in inner.items() if k != "params")
            for p, stand_in in zip(mine_group["params"], inner["params"], strict=True):
                state = self.inner.state.get(stand_in, {})
                for k, v in state.items():  # cast to the fp32 stand-in's dtype on loading; it was bf16 (exact)
                    if (
                        p.dtype == torch.bfloat16
                        and k != "step"
                        and isinstance(v, torch.Tensor)
                        and v.dtype == torch.float32
                    ):
                        state[k] = v.to(torch.bfloat16)
        self.generator.set_state(mine["generator"])

    def __repr__(self) -> str:
        return f"StochasticRounding({self.inner!r})"


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device)


def _stand_in(p: torch.Tensor) -> nn.Parameter:
    """What the inner optimizer holds for ``p``: fp32 for a bf16 parameter, empty between steps."""
    dtype = torch.float32 if p.dtype == torch.bfloat16 else p.dtype
    return nn.Parameter(torch.empty(0, dtype=dtype, device=p.device), requires_grad=p.requires_grad)


def to_bf16(model: nn.Module) -> nn.Module:
    """Cast ``model``'s floating-point parameters and buffers to bf16 in place and make it cast
    floating-point inputs to bf16 too; return it.

    Buffers go too (BatchNorm statistics) and inputs are cast because CPU normalisation kernels
    refuse mixing bf16 weights with fp32 inputs or statistics; autocast still runs the ops it
    keeps in fp32 (softmax, losses) in fp32.
    """
    model.to(torch.bfloat16)
    if not getattr(model, "_stoker_bf16_inputs", False):
        model.register_forward_pre_hook(_inputs_to_bf16, with_kwargs=True)
        model._stoker_bf16_inputs = True  # type: ignore[assignment]  # Module.__setattr__ is typed Tensor | Module
    return model


def _inputs_to_bf16(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    return tree_map(_to_bf16, args), tree_map(_to_bf16, kwargs)


def _to_bf16(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.bfloat16:
        return value.to(torch.bfloat16)
    return value


def _is_bf16(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16


def _device_of(groups: list[dict[str, Any]]) -> torch.device:
    for g in groups:
        for p in g["params"]:
            return p.device
    return torch.device("cpu")


__all__ = ["STATE_KEY", "StochasticRounding", "stochastic_round_bf16", "to_bf16"]
