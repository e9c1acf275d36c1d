"""How an iteration's candidates train: their optimizers and schedules, and the cleaning of
diverged ones.

Every new subnetwork has its builder's optimizer (and optional LR schedule); the candidates
of one ensembler share one optimizer over their mixture weights. ``CandidateOptimizers`` and
``CandidateSchedules`` make them one optimizer and one schedule for the engine, which steps
and checkpoints them as it would a single one. A candidate whose loss went NaN is out of the
race, but its NaN weights would stop the engine's checkpoint: :func:`sanitize_diverged`
zeroes them (``IterationModel.sanitize_diverged``, called by ``DivergedCandidateHook``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import CheckpointMismatchError, ConfigError, UserCodeError
from .ensemble import BatchedWeightedSum, Ensembler


class IterationModel(Protocol):
    """What this module reads of an ``adanet.iteration.IterationModel`` (a protocol, so this
    module does not import the one that imports it)."""

    candidates: list[Any]
    subnetworks: nn.ModuleDict
    new_keys: list[str]
    builders: dict[str, Any]
    _units: list[Any]

    def parameters(self, recurse: bool = True) -> Iterable[nn.Parameter]: ...


__all__ = ["CandidateOptimizers", "CandidateSchedules", "build_optimizers", "build_schedules", "sanitize_diverged"]


def build_optimizers(model: IterationModel) -> CandidateOptimizers:
    """Each new subnetwork's optimizer (from its builder), and one optimizer per ensembler
    over the ensemble parameters of all its candidates."""
    optimizers: dict[str, torch.optim.Optimizer] = {}
    for key in model.new_keys:
        params = [p for p in model.subnetworks[key].parameters() if p.requires_grad]
        if not params:
            continue
        opt = model.builders[key].build_subnetwork_optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise UserCodeError(
                f"{type(model.builders[key]).__name__}.build_subnetwork_optimizer must return a "
                f"torch.optim.Optimizer; got {type(opt).__name__}"
            )
        optimizers[f"subnetwork/{key}"] = opt
    by_ensembler: dict[str, tuple[Ensembler, list[nn.Parameter]]] = {}
    for unit in model._units:
        c = model.candidates[unit.indices[0]]
        if c.is_previous:
            continue
        entry = by_ensembler.setdefault(c.ensembler.name, (c.ensembler, []))
        entry[1].extend(p for p in unit.module.parameters() if p.requires_grad)
    for name, (ensembler, params) in by_ensembler.items():
        opt = ensembler.build_optimizer(params) if params else None
        if opt is not None:
            optimizers[f"ensembler/{name}"] = opt
    if not optimizers:
        raise ConfigError("nothing to train in this iteration: no subnetwork or ensemble has trainable parameters")
    return CandidateOptimizers(optimizers)


def build_schedules(model: IterationModel, optimizer: torch.optim.Optimizer) -> CandidateSchedules | None:
    """Each new subnetwork's learning-rate schedule (``Builder.build_subnetwork_lr_schedule``)
    over its optimizer in ``optimizer`` (a ``CandidateOptimizers``); ``None`` if no builder
    gives one."""
    if not isinstance(optimizer, CandidateOptimizers):
        raise UserCodeError(f"make_schedule needs the iteration's CandidateOptimizers; got {type(optimizer).__name__}")
    schedules: dict[str, Any] = {}
    for key in model.new_keys:
        name = f"subnetwork/{key}"
        if name not in optimizer.optimizers:
            continue
        schedule = model.builders[key].build_subnetwork_lr_schedule(optimizer.optimizers[name])
        if schedule is None:
            continue
        missing = [m for m in ("step", "state_dict", "load_state_dict") if not callable(getattr(schedule, m, None))]
        if missing:
            raise UserCodeError(
                f"{type(model.builders[key]).__name__}.build_subnetwork_lr_schedule must return an LR scheduler "
                f"(step, state_dict, load_state_dict); {type(schedule).__name__} lacks {missing}"
            )
        schedules[name] = schedule
    return CandidateSchedules(schedules) if schedules else None


def sanitize_diverged(model: IterationModel, optimizer: torch.optim.Optimizer | None) -> list[str]:
    """Zero the non-finite weights (and optimizer state) of ``model``'s diverged parts; the
    names of the parts cleaned. One host sync when nothing diverged."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        return []
    state = optimizer.state if isinstance(optimizer, CandidateOptimizers) else {}
    cleaned = [k for k in model.new_keys if not _finite(model.subnetworks[k].parameters())]
    for unit in model._units:
        module, indices = unit.module, unit.indices
        if model.candidates[indices[0]].is_previous:
            continue
        if unit.batched:  # one row of the packed weights per candidate
            assert isinstance(module, BatchedWeightedSum)
            rows = [module.weights[r] for r in range(len(indices))]
            bias = [module.bias[r] for r in range(len(indices))] if module.bias is not None else [None] * len(indices)
            cleaned += [
                model.candidates[i].name
                for i, w, b in zip(indices, rows, bias, strict=True)
                if not _finite([w] if b is None else [w, b])
            ]
        elif not _finite(module.parameters()):
            cleaned.append(model.candidates[indices[0]].name)
    with torch.no_grad():
        for p in params:
            p.nan_to_num_(0.0, 0.0, 0.0)  # touches only the non-finite entries
            for value in state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    value.nan_to_num_(0.0, 0.0, 0.0)
    return cleaned


def _finite(params: Iterable[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params)


class CandidateOptimizers(torch.optim.Optimizer):
    """Several optimizers that step as one, so the engine's single-optimizer step drives them.

    ``param_groups`` is the concatenation of the children's groups (the same dicts, so a
    learning-rate change is seen by the child), ``state`` maps a parameter to its child's
    state, and ``state_dict`` holds each child's state dict under its name.
    """

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        # Deliberately not calling Optimizer.__init__: the children own groups and state.
        self.optimizers = dict(optimizers)
        self._params = [p for opt in self.optimizers.values() for g in opt.param_groups for p in g["params"]]
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks: dict[int, Any] = {}
        self._optimizer_step_post_hooks: dict[int, Any] = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]  # a read-only view over the optimizers
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]  # a read-only view over the optimizers
        merged: dict[Any, Any] = {}
        for opt in self.optimizers.values():
            merged.update(opt.state)
        return merged

    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # torch overloads step on closure
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:  # what each child's zero_grad would do, without its per-call overhead
            for p in self._params:
                p.grad = None
            return
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=False)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        saved = state_dict.get("optimizers")
        if not isinstance(saved, Mapping) or set(saved) != set(self.optimizers):
            got = sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__
            raise CheckpointMismatchError(
                f"the saved candidate optimizers {got} are not this iteration's {sorted(self.optimizers)}"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(saved[name])

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}: {type(opt).__name__}" for name, opt in self.optimizers.items())
        return f"CandidateOptimizers({inner})"


class CandidateSchedules:
    """Several subnetworks' LR schedulers that the engine steps and checkpoints as one."""

    def __init__(self, schedules: Mapping[str, Any]) -> None:
        self.schedules = dict(schedules)

    def step(self) -> None:
        for schedule in self.schedules.values():
            schedule.step()

    def state_dict(self) -> dict[str, Any]:
        return {"schedules": {name: s.state_dict() for name, s in self.schedules.items()}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        saved = state_dict.get("schedules")
        if not isinstance(saved, Mapping) or set(saved) != set(self.schedules):
            got = sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__
            raise CheckpointMismatchError(
                f"the saved subnetwork schedules {got} are not this iteration's {sorted(self.schedules)}"
            )
        for name, schedule in self.schedules.items():
            schedule.load_state_dict(saved[name])
