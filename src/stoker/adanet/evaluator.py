"""Choosing an iteration's ensemble, and materialising subnetwork reports.

Without an ``Evaluator`` the candidate with the smallest bias-corrected moving average of
its training ``adanet_loss`` wins (AdaNet's data-driven choice on the training set). With
one, every candidate is evaluated on ``Evaluator.input_fn`` and ``metric_name`` decides.
A NaN value never wins; if every candidate is NaN the search stops with an error.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError, NonFiniteError, UserCodeError
from .subnetwork import MaterializedReport

if TYPE_CHECKING:
    from ..estimator import Estimator as PlainEstimator
    from .iteration import IterationModel

__all__ = ["Evaluator", "Objective", "ReportMaterializer", "select_best"]

InputFn = Callable[[dict[str, Any]], Iterable[Any]]


class Objective(str, enum.Enum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


def select_best(values: Sequence[float], objective: Objective | str = Objective.MINIMIZE, start: int = 0) -> int:
    """Index of the best value at or after ``start``; NaN never wins, ties go to the lower index.

    Raises ``ValueError`` when every considered value is NaN.
    """
    objective = Objective(objective)
    best: int | None = None
    for i in range(start, len(values)):
        v = float(values[i])
        if math.isnan(v):
            continue
        if best is None or (v < values[best] if objective is Objective.MINIMIZE else v > values[best]):
            best = i
    if best is None:
        raise NonFiniteError(f"every candidate's selection value is NaN ({list(values)}): no ensemble can be chosen")
    return best


@dataclass
class Evaluator:
    """Evaluate every candidate ensemble on ``input_fn`` at the end of each iteration.

    Attributes:
        input_fn: the data (the training set gives AdaNet proper; a held-out set gives
            AdaNet.HoldOut, without its learning guarantees).
        steps: batches to evaluate (None: all of ``input_fn``).
        metric_name: ``adanet_loss`` (head loss + regulariser) or one of the head's metrics
            (e.g. ``accuracy``), computed per candidate.
        objective: ``minimize`` or ``maximize`` the metric.
    """

    input_fn: InputFn
    steps: int | None = None
    metric_name: str = "adanet_loss"
    objective: Objective | str = Objective.MINIMIZE

    def __post_init__(self) -> None:
        self.objective = Objective(self.objective)
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(f"Evaluator.steps must be a positive integer or None; got {self.steps!r}")

    def evaluate(self, estimator: PlainEstimator, candidate_names: Sequence[str]) -> list[float]:
        """Each candidate's ``metric_name`` on ``input_fn``, evaluated with the iteration's Estimator."""
        results = estimator.evaluate(self.input_fn, steps=self.steps, name="adanet_candidates")
        keys = [f"{name}/{self.metric_name}" for name in candidate_names]
        missing = [k for k in keys if k not in results]
        if missing:
            known = sorted(
                {k.split("/", 1)[1] for k in results if "/" in k and not k.startswith(("subnetwork/", "report/"))}
            )
            raise ConfigError(
                f"Evaluator.metric_name={self.metric_name!r} is not computed for every candidate; candidates have "
                f"{known}"
            )
        return [float(results[k]) for k in keys]


@dataclass
class ReportMaterializer:
    """Evaluate the builders' ``Report`` metrics on ``input_fn`` after each iteration and write
    ``MaterializedReport``s, which the generator receives at later iterations."""

    input_fn: InputFn
    steps: int | None = None

    def materialize(
        self, estimator: PlainEstimator, model: IterationModel, iteration_number: int, included: Iterable[str]
    ) -> list[MaterializedReport]:
        """One report per new subnetwork whose builder gave a ``Report``."""
        if not model.reports:
            return []
        results = estimator.evaluate(self.input_fn, steps=self.steps, name="adanet_reports")
        included = set(included)
        out = []
        for key, report in model.reports.items():
            name = model.builders[key].name
            out.append(
                MaterializedReport(
                    iteration_number=iteration_number,
                    name=name,
                    hparams=dict(report.hparams),
                    attributes={k: _plain(v, f"{name}'s report attribute {k!r}") for k, v in report.attributes.items()},
                    metrics={m: float(results[f"report/{key}/{m}"]) for m in report.metrics},
                    included_in_final_ensemble=key in included,
                )
            )
        return out


def _plain(value: Any, what: str) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ConfigError(f"{what} must be a scalar; it has shape {list(value.shape)}")
        return value.detach().cpu().reshape(()).item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, what) for k, v in value.items()}
    raise UserCodeError(f"{what} must be a number, string, bool or 0-dim tensor; got {type(value).__name__}")
