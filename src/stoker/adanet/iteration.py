"""One AdaNet iteration as one ``nn.Module``, and the final ensemble as another.

``IterationModel`` holds everything iteration ``t`` trains and compares: the frozen
subnetworks of the previous ensemble, the iteration's new subnetworks, the ensemble
parameters of every candidate, and the selection state as buffers (a moving average of each
candidate's ``adanet_loss``, the iteration number, the iteration's step counter), so the
engine's checkpoints carry all of it.

Candidate 0 at ``t > 0`` is the previous ensemble. Nothing of it trains, so its moving average
is *read, not updated*: the value it ended iteration ``t - 1`` with is carried over
(``previous_adanet_loss``) and its loss is not even computed in training steps.

A training step (``forward`` in TRAIN mode) runs every subnetwork once on the batch. Each new
subnetwork's head loss is a term of the step's loss; every candidate ensemble sees its
members' outputs *detached*, so its ``adanet_loss`` term reaches only its own mixture
weights. One backward pass therefore gives every parameter exactly the gradient of its own
objective, and ``CandidateOptimizers`` steps each subnetwork's optimizer and each
ensembler's optimizer on its own parameters.

The model's jobs are split: its construction (``_add_*`` and ``_plan_units``: which modules,
which units run the candidates), its steps (``forward``), its selection state (buffers and
``moving_average_losses``); the optimizers, schedules and the cleaning of diverged weights
are built by :mod:`stoker.adanet.training`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from ..errors import ConfigError
from ..hooks.base import Hook, LoopResult, RunContext
from ..spec import EstimatorSpec, ModeKeys
from .ensemble import BatchedWeightedSum, Combiner, Ensemble, Ensembler, _WeightedSum
from .heads import Head, MetricFn
from .subnetwork import Builder, Report, Subnetwork, as_subnetwork
from .training import (
    CandidateOptimizers,
    CandidateSchedules,
    build_optimizers,
    build_schedules,
    sanitize_diverged,
)

log = logging.getLogger("stoker")

__all__ = [
    "CandidateOptimizers",
    "CandidateRecord",
    "CandidateSchedules",
    "DivergedCandidateHook",
    "EnsembleModel",
    "IterationModel",
    "bias_corrected_ema",
]


def bias_corrected_ema(biased: torch.Tensor, updates: int, decay: float) -> torch.Tensor:
    """The zero-debiased moving average: ``biased / (1 - decay**updates)`` (NaN before any update).

    ``biased`` follows ``biased <- decay * biased + (1 - decay) * value`` from 0, as TF's
    ``assign_moving_average(zero_debias=True)``.
    """
    if updates <= 0:
        return torch.full_like(biased, float("nan"))
    return biased / (1.0 - decay**updates)


def _detached(s: Subnetwork) -> Subnetwork:
    c = s.complexity.detach() if isinstance(s.complexity, torch.Tensor) else s.complexity
    return Subnetwork(last_layer=s.last_layer.detach(), logits=s.logits.detach(), complexity=c, shared=s.shared)


def _logits_detached(s: Subnetwork) -> Subnetwork:
    """Enough for batched weighted sums, which read only logits and complexity (one op less)."""
    c = s.complexity.detach() if isinstance(s.complexity, torch.Tensor) else s.complexity
    return Subnetwork(last_layer=s.last_layer, logits=s.logits.detach(), complexity=c, shared=s.shared)


@dataclass(eq=False)
class CandidateRecord:
    """One candidate ensemble of the iteration (index = position in ``IterationModel.candidates``)."""

    name: str
    ensemble: Ensemble
    ensembler: Ensembler
    is_previous: bool


class IterationModel(nn.Module):
    """All subnetworks and candidate ensembles of one iteration (see the module docstring).

    Module names, which are also the checkpoint's weight names: ``subnetworks.<t>_<name>.*``
    (frozen and new), ``previous_ensemble.*`` (the previous ensemble's combiner, frozen),
    ``batched.<ensembler>.*`` (the packed SCALAR/VECTOR mixture weights of an ensembler's
    candidates, see ``BatchedWeightedSum``) and ``ensembles.<candidate>.*`` (candidates that
    are not batched, e.g. MATRIX weights).
    """

    # buffers (register_buffer in _add_selection_state)
    iteration_number: torch.Tensor
    iteration_step: torch.Tensor
    adanet_loss_ema: torch.Tensor
    previous_adanet_loss: torch.Tensor

    def __init__(
        self,
        *,
        iteration_number: int,
        head: Head,
        frozen: Mapping[str, nn.Module],
        new: Mapping[str, tuple[Builder, nn.Module]],
        candidates: Sequence[CandidateRecord],
        adanet_loss_decay: float,
        replicate_ensemble_in_training: bool,
        iteration_step: torch.Tensor,
        reports: Mapping[str, Report] | None = None,
        previous_adanet_loss: float | None = None,
        metric_fn: MetricFn | None = None,
    ) -> None:
        super().__init__()
        self.head = head
        self.metric_fn = metric_fn  # extra evaluation metrics of every candidate and subnetwork
        self.adanet_loss_decay = float(adanet_loss_decay)
        self.replicate_ensemble_in_training = bool(replicate_ensemble_in_training)
        self.candidates = list(candidates)
        self.reports = dict(reports or {})
        self._add_subnetworks(frozen, new)
        self._add_ensembles()
        self._add_selection_state(iteration_number, iteration_step, previous_adanet_loss)
        # Candidates of one ensembler with SCALAR/VECTOR weights run as one batched unit;
        # the rest (the frozen previous ensemble, MATRIX weights, custom combiners) one by one.
        self._units, batched = _plan_units(self.candidates)
        self.batched = nn.ModuleDict(batched)
        for unit in self._units:
            for i in (
                unit.indices if unit.batched else ()
            ):  # the packed parameters replace the candidates' own in training
                del self.ensembles[self.candidates[i].name]
        self._plan_train_step(iteration_step.device)

    # ------------------------------------------------------------------ construction
    def _add_subnetworks(self, frozen: Mapping[str, nn.Module], new: Mapping[str, tuple[Builder, nn.Module]]) -> None:
        self.subnetworks = nn.ModuleDict()
        for key, module in frozen.items():
            module.requires_grad_(False)
            self.subnetworks[key] = module
        for key, (_, module) in new.items():
            self.subnetworks[key] = module
        self.frozen_keys = list(frozen)
        self.new_keys = list(new)
        self.builders = {key: b for key, (b, _) in new.items()}

    def _add_ensembles(self) -> None:
        self.previous_ensemble: Combiner | None = None
        self.ensembles = nn.ModuleDict()
        for c in self.candidates:
            if c.is_previous:
                c.ensemble.combiner.requires_grad_(False)
                self.previous_ensemble = c.ensemble.combiner
            else:
                self.ensembles[c.name] = c.ensemble.combiner

    def _add_selection_state(
        self, iteration_number: int, iteration_step: torch.Tensor, previous_adanet_loss: float | None
    ) -> None:
        n_cand = len(self.candidates)
        self.register_buffer("iteration_number", torch.tensor(int(iteration_number), dtype=torch.int64))
        self.register_buffer("iteration_step", iteration_step)
        self.register_buffer("adanet_loss_ema", torch.zeros(n_cand, device=iteration_step.device))
        has_previous = self.previous_ensemble is not None
        if has_previous != (previous_adanet_loss is not None):
            raise ConfigError(
                "previous_adanet_loss is given exactly when there is a previous ensemble (candidate 0 at t > 0)"
            )
        if has_previous and not self.candidates[0].is_previous:
            raise ConfigError("the previous ensemble must be candidate 0")
        # The previous ensemble's bias-corrected moving average from iteration t - 1 (read, never
        # updated); 0 and unused at t = 0.
        self.register_buffer(
            "previous_adanet_loss",
            torch.tensor(float(previous_adanet_loss or 0.0), dtype=torch.float64, device=iteration_step.device),
        )
        self._first_trained = 1 if has_previous else 0

    def _plan_train_step(self, device: torch.device) -> None:
        # Training steps skip the previous ensemble's unit: it has nothing to train and its
        # moving average is carried over, not updated.
        self._train_units = [u for u in self._units if not self.candidates[u.indices[0]].is_previous]
        # What each training step reports (TensorBoard, metrics.csv and the log line, averaged
        # per device loop): every new subnetwork's loss and every trained candidate's adanet_loss.
        self._summary = _LossSummary(
            [f"subnetwork_loss/{k}" for k in self.new_keys]
            + [f"adanet_loss/{c.name}" for c in self.candidates[self._first_trained :]]
        )
        self._train_order = _restore_order(
            [i for u in self._train_units for i in u.indices], self._first_trained, device
        )
        self._frozen_list = [(k, self.subnetworks[k]) for k in self.frozen_keys]
        self._new_list = [(k, self.subnetworks[k]) for k in self.new_keys]
        # Members' last layers are needed (detached) only by unbatched units, e.g. MATRIX weights.
        self._detach = _detached if any(not u.batched for u in self._units) else _logits_detached

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> IterationModel:
        super().train(mode)
        # The previous ensemble's subnetworks are frozen: in prediction mode (no dropout) while
        # candidates train, unless the user asks to replicate them in training mode.
        frozen_mode = mode and self.replicate_ensemble_in_training
        for key in self.frozen_keys:
            self.subnetworks[key].train(frozen_mode)
        if self.previous_ensemble is not None:
            self.previous_ensemble.train(frozen_mode)
        return self

    # ------------------------------------------------------------------ steps
    def forward(self, features: Any, labels: Any = None, mode: ModeKeys = ModeKeys.TRAIN) -> EstimatorSpec:
        if mode == ModeKeys.TRAIN:
            return self._train_step(features, labels)
        if mode == ModeKeys.EVAL and labels is not None:
            return self._eval_step(features, labels)
        return self._predict_step(features)

    def _outputs(self, features: Any) -> dict[str, Subnetwork]:
        outs: dict[str, Subnetwork] = {}
        with torch.no_grad():
            for key, module in self._frozen_list:
                outs[key] = as_subnetwork(module(features))
        for key, module in self._new_list:
            outs[key] = as_subnetwork(module(features))
        return outs

    def _candidate_logits(
        self, outs: Mapping[str, Subnetwork], regularize: bool = True
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor | None, bool]]:
        """Per unit: (candidate indices, logits, regulariser, batched); batched units give
        logits ``[C, batch, ..., D]`` and a regulariser ``[C]``."""
        for module, keys, indices, batched in self._units:
            logits, reg = module([outs[k] for k in keys], regularize=regularize)
            yield indices, logits, reg, batched

    def _train_step(self, features: Any, labels: Any) -> EstimatorSpec:
        head = self.head
        outs: dict[str, Subnetwork] = {}
        with torch.no_grad():
            for key, module in self._frozen_list:
                outs[key] = as_subnetwork(module(features))
        losses: list[torch.Tensor] = []
        for key, module in self._new_list:
            s = as_subnetwork(module(features))
            losses.append(head.loss(s.logits, labels))
            outs[key] = self._detach(s)  # ensembles must not train the subnetworks
        parts = []
        for module, keys, _, batched in self._train_units:
            logits, reg = module([outs[k] for k in keys])
            loss = self._batched_loss(logits, labels) if batched else head.loss(logits, labels).reshape(1)
            parts.append(loss if reg is None else loss + reg)
        candidates = torch.cat(parts) if len(parts) > 1 else parts[0]
        if self._train_order is not None:
            candidates = candidates.index_select(0, self._train_order)
        stacked = torch.cat([torch.stack(losses), candidates])
        with torch.no_grad():
            # ema <- decay * ema + (1 - decay) * value, from 0 (bias-corrected when read). A NaN
            # or inf value makes the average NaN or inf for good: such a candidate never wins.
            # Candidate 0 at t > 0 (the previous ensemble) is skipped: its average is carried over.
            self.adanet_loss_ema[self._first_trained :].lerp_(
                stacked.detach()[len(losses) :], 1.0 - self.adanet_loss_decay
            )
            self.iteration_step.add_(1)  # also the number of moving-average updates (add_: no Module.__setattr__)
        # A non-finite term contributes neither to the reported loss nor to any gradient
        # (nan_to_num's gradient is zero there), so one diverging candidate cannot stop the
        # search: the engine stops on a non-finite step loss.
        total = torch.nan_to_num(stacked, 0.0, 0.0, 0.0).sum()
        return EstimatorSpec(loss=total, host_call=(self._summary, [stacked.detach()]))

    def _batched_loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Head loss of ``C`` candidates' logits ``[C, batch, ...]``: ``[C]`` or ``[C, batch]``."""
        # One fused head loss per candidate: cheaper than one loss over labels repeated C times.
        return torch.stack([self.head.loss(logits[c], labels, reduction) for c in range(logits.shape[0])])

    def _eval_step(self, features: Any, labels: Any) -> EstimatorSpec:
        head = self.head
        outs = self._outputs(features)
        metrics: dict[str, Any] = {}
        for indices, logits, reg, batched in self._candidate_logits(outs):
            per_example = (
                self._batched_loss(logits, labels, "none")
                if batched
                else head.loss(logits, labels, "none").unsqueeze(0)
            )
            for r, i in enumerate(indices):
                name = self.candidates[i].name
                cand_logits = logits[r] if batched else logits
                loss = per_example[r]
                metrics[f"{name}/adanet_loss"] = loss if reg is None else loss + (reg[r] if batched else reg)
                for metric, update in head.eval_metrics(cand_logits, features, labels, self.metric_fn).items():
                    metrics[f"{name}/{metric}"] = update
        for key in self.new_keys:
            logits = outs[key].logits
            metrics[f"subnetwork/{key}/loss"] = head.loss(logits, labels, "none")
            for name, update in head.eval_metrics(logits, features, labels, self.metric_fn).items():
                metrics[f"subnetwork/{key}/{name}"] = update
            report = self.reports.get(key)
            if report is not None:
                for name, metric in report.metrics.items():
                    metrics[f"report/{key}/{name}"] = metric(logits, labels)
        return EstimatorSpec(eval_metrics=metrics)

    def _predict_step(self, features: Any) -> EstimatorSpec:
        outs = self._outputs(features)
        preds = {}
        for indices, logits, _, batched in self._candidate_logits(outs, regularize=False):
            for r, i in enumerate(indices):
                preds[self.candidates[i].name] = logits[r] if batched else logits
        return EstimatorSpec(predictions=preds)

    def unpack(self) -> None:
        """Copy batched mixture weights into every candidate's own combiner (before saving one)."""
        for module in self.batched.values():
            assert isinstance(module, BatchedWeightedSum)
            module.unpack()

    # ------------------------------------------------------------------ selection state
    def moving_average_losses(self) -> list[float]:
        """Each candidate's bias-corrected moving average of ``adanet_loss`` (NaN if diverged).

        Candidate 0 at ``t > 0``, the previous ensemble, gives the value carried over from the
        previous iteration.
        """
        values = [
            float(v)
            for v in bias_corrected_ema(
                self.adanet_loss_ema.detach().cpu().double(), int(self.iteration_step), self.adanet_loss_decay
            )
        ]
        if self._first_trained:
            values[0] = float(self.previous_adanet_loss)
        return values

    # ------------------------------------------------------------------ optimizers
    def make_optimizer(self) -> CandidateOptimizers:
        """Each new subnetwork's optimizer (from its builder), and one optimizer per ensembler
        over the ensemble parameters of all its candidates (see ``training.build_optimizers``)."""
        return build_optimizers(self)

    def make_schedule(self, optimizer: torch.optim.Optimizer) -> CandidateSchedules | None:
        """Each new subnetwork's learning-rate schedule (``Builder.build_subnetwork_lr_schedule``)
        over its optimizer in ``optimizer`` (a ``CandidateOptimizers``); ``None`` if no builder
        gives one."""
        return build_schedules(self, optimizer)

    def sanitize_diverged(self, optimizer: torch.optim.Optimizer | None) -> list[str]:
        """Zero the non-finite weights (and optimizer state) of diverged parts.

        A candidate whose loss went NaN is out of the race (its moving average is NaN), but
        NaN weights would make the engine refuse to write the checkpoint. Returns the names
        of the parts it cleaned. One host sync (called once per device loop).
        """
        return sanitize_diverged(self, optimizer)


class _Unit(NamedTuple):
    """What runs as one in a step: a candidate's combiner, or the packed weights of several
    candidates (``batched``); the member keys it reads and the candidates it gives."""

    module: nn.Module
    keys: list[str]
    indices: list[int]
    batched: bool


def _plan_units(candidates: Sequence[CandidateRecord]) -> tuple[list[_Unit], dict[str, BatchedWeightedSum]]:
    """The units that run the candidates, and the packed modules by ensembler name: candidates
    of one ensembler with equal SCALAR/VECTOR signatures are batched into one."""
    units: list[_Unit] = []
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, c in enumerate(candidates):
        sig = None if c.is_previous else BatchedWeightedSum.signature(c.ensemble.combiner)
        if sig is None:
            units.append(_Unit(c.ensemble.combiner, list(c.ensemble.combiner.members), [i], False))
        else:
            groups.setdefault((c.ensembler.name, *sig), []).append(i)
    batched: dict[str, BatchedWeightedSum] = {}
    for indices in groups.values():
        if len(indices) == 1:
            c = candidates[indices[0]]
            units.append(_Unit(c.ensemble.combiner, list(c.ensemble.combiner.members), indices, False))
            continue
        # signature() is None for any other combiner: these are all _WeightedSums
        combiners = cast("list[_WeightedSum]", [candidates[i].ensemble.combiner for i in indices])
        module = BatchedWeightedSum(combiners)
        batched[candidates[indices[0]].ensembler.name] = module
        units.append(_Unit(module, list(module.keys), indices, True))
    return units, batched


class _LossSummary:
    """A ``host_call`` function: the loop's per-step losses ``[steps, n]`` -> mean per name."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __call__(self, losses: torch.Tensor) -> dict[str, float]:
        means = losses.double().mean(0).tolist()  # a diverged term stays NaN
        return dict(zip(self.names, means, strict=True))


def _restore_order(order: list[int], first: int, device: torch.device) -> torch.Tensor | None:
    """The ``index_select`` that puts unit outputs (candidates ``order``, all ``>= first``) back
    in candidate order; ``None`` where they already are."""
    if order == list(range(first, first + len(order))):
        return None
    return torch.tensor(sorted(range(len(order)), key=lambda j: order[j]), device=device)


class DivergedCandidateHook(Hook):
    """Before checkpoints are written, clean the weights of candidates whose loss went NaN."""

    phase = "state"  # after the NaN check, before anything saves

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._clean(run)

    def end(self, run: RunContext) -> None:
        self._clean(run)

    @staticmethod
    def _clean(run: RunContext) -> None:
        model = run.model
        if isinstance(model, IterationModel):
            cleaned = model.sanitize_diverged(run.optimizer)
            if cleaned:
                log.warning(
                    "adanet: %s diverged (non-finite loss) by step %d: out of this iteration's selection",
                    ", ".join(cleaned),
                    run.global_step,
                )


class EnsembleModel(nn.Module):
    """A chosen ensemble as one module: ``forward(features)`` gives the ensemble's logits.

    Weight names: ``subnetworks.<t>_<name>.*`` and ``ensemble.*`` (the combiner: mixture
    weights, bias). ``weighted_subnetworks`` gives each member's module and mixture weight.
    """

    def __init__(self, ensemble: Ensemble) -> None:
        super().__init__()
        self.subnetworks = nn.ModuleDict({w.key: w.module for w in ensemble.weighted_subnetworks})
        self.ensemble = ensemble.combiner
        self.name = ensemble.name
        self.candidate_name = ensemble.candidate_name
        self.ensembler_name = ensemble.ensembler_name
        self.iteration_number = ensemble.iteration_number
        self._info = ensemble
        self._members = [(w.key, w.module) for w in ensemble.weighted_subnetworks]

    @property
    def weighted_subnetworks(self) -> list:
        """Each member: ``name``, ``iteration_number``, ``module``, ``weight`` (its mixture weight)."""
        return list(self._info.weighted_subnetworks)

    @property
    def bias(self) -> torch.Tensor | None:
        return self.ensemble.bias_term()

    def forward(self, features: Any) -> torch.Tensor:
        outs = [as_subnetwork(module(features)) for _, module in self._members]
        return self.ensemble(outs, regularize=False)[0]

    def subnetwork_logits(self, features: Any) -> dict[str, torch.Tensor]:
        """Each member's own logits on ``features``, by key ``t<i>_<name>``."""
        return {key: as_subnetwork(module(features)).logits for key, module in self._members}
