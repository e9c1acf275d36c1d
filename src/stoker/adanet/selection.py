"""Choosing at the end of an iteration: which candidate wins, and what is recorded of it.

:func:`choose` applies the search's rules (a replayed choice, a single candidate,
``force_grow``, an ``Evaluator`` or the moving average of ``adanet_loss``);
:func:`chosen_architecture` and :func:`selection_record` describe the choice for
``architecture-<t>.json`` and ``iteration-<t>/selection.json``. Writing them (and the final
checkpoint) is the ``Estimator``'s, in its commit order.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from ..estimator import Estimator as PlainEstimator
from .architecture import Architecture
from .evaluator import Evaluator, Objective, select_best
from .iteration import CandidateRecord, IterationModel
from .replay import Config as ReplayConfig


def choose(
    t: int,
    est: PlainEstimator,
    model: IterationModel,
    *,
    replay_config: ReplayConfig | None,
    force_grow: bool,
    evaluator: Evaluator | None,
) -> tuple[int, list[float] | None, str]:
    """(index of the chosen candidate, the values compared, how it was chosen)."""
    n = len(model.candidates)
    replayed = replay_config.get_best_ensemble_index(t) if replay_config is not None else None
    if replayed is not None:
        if replayed >= n:
            raise ConfigError(f"replay.Config gives index {replayed} for iteration {t}, which has only {n} candidates")
        return replayed, None, "replay"
    if n == 1:
        return 0, None, "only candidate"
    grow = force_grow and t > 0  # candidate 0 at t > 0 is the previous ensemble
    if grow and n == 2:
        return 1, None, "force_grow: the only new candidate"
    names = [c.name for c in model.candidates]
    if evaluator is not None:
        values = evaluator.evaluate(est, names)
        objective = evaluator.objective
        how = f"evaluator {evaluator.metric_name} ({Objective(objective).value})"
    else:
        values = model.moving_average_losses()
        objective = Objective.MINIMIZE
        how = "moving average of adanet_loss"
    return select_best(values, objective, start=1 if grow else 0), values, how


def chosen_architecture(
    t: int, step: int, index: int, chosen: CandidateRecord, previous: Architecture | None
) -> Architecture:
    """Iteration ``t``'s architecture, ``chosen`` (candidate ``index``) having won at ``step``;
    ``previous`` is iteration ``t - 1``'s (None at ``t = 0``)."""
    if chosen.is_previous:
        assert previous is not None
        return Architecture(
            ensemble_candidate_name=previous.ensemble_candidate_name,
            ensembler_name=previous.ensembler_name,
            iteration_number=t,
            global_step=step,
            subnetworks=list(previous.subnetworks),
            replay_indices=[*previous.replay_indices, index],
        )
    return Architecture(
        ensemble_candidate_name=chosen.ensemble.candidate_name,
        ensembler_name=chosen.ensemble.ensembler_name,
        iteration_number=t,
        global_step=step,
        subnetworks=[(w.iteration_number, w.name) for w in chosen.ensemble.weighted_subnetworks],
        replay_indices=[*(previous.replay_indices if previous else []), index],
    )


def selection_record(
    t: int, step: int, model: IterationModel, index: int, values: list[float] | None, how: str, ema: list[float]
) -> dict[str, Any]:
    """What ``iteration-<t>/selection.json`` holds: every candidate's moving average and
    compared value, and the choice."""
    chosen = model.candidates[index]
    return {
        "iteration_number": t,
        "global_step": step,
        "candidates": [
            {
                "index": i,
                "name": c.name,
                "adanet_loss_ema": _json_float(ema[i]),
                "value": _json_float(values[i]) if values else None,
            }
            for i, c in enumerate(model.candidates)
        ],
        "chosen_index": index,
        "chosen": chosen.name,
        "selected_by": how,
        "subnetworks": [w.key for w in chosen.ensemble.weighted_subnetworks],
    }


def _json_float(value: float | None) -> float | None:
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return float(value)
