"""What a user writes to plug a model family into the search: ``Builder`` and ``Generator``.

PyTorch adaptation of ``adanet.subnetwork``. In TensorFlow a builder adds ops to a graph
and returns the resulting tensors; here a builder returns an ``nn.Module`` *once per
iteration*, and every call of that module on a batch returns a :class:`Subnetwork` (the
per-batch ``last_layer``, ``logits``, ``complexity`` and ``shared``). The module is the
subnetwork's state: its parameters are trained by the builder's own optimizer, checkpointed
with the iteration and frozen once the subnetwork joins the ensemble.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import ConfigError
from ..metrics import Metric
from .outputs import Subnetwork, as_subnetwork, complexity_value  # re-exported for users

if TYPE_CHECKING:
    from .ensemble import Ensemble  # for annotations only; ensemble.py does not import this module

__all__ = [
    "Builder",
    "Generator",
    "MaterializedReport",
    "Report",
    "SimpleGenerator",
    "Subnetwork",
    "as_subnetwork",
    "check_builder_name",
    "complexity_value",
]


def check_builder_name(name: Any) -> str:
    """Builder names key modules and checkpoint entries, so they must be plain identifiers."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a Builder's name must be a non-empty string; got {name!r}")
    if "." in name or "/" in name or any(ch.isspace() for ch in name):
        raise ConfigError(f"Builder name {name!r} may not contain '.', '/' or whitespace (it names checkpoint entries)")
    return name


@dataclass(kw_only=True)
class Report:
    """What a builder wants remembered about its subnetwork, for generators of later iterations.

    Attributes:
        hparams: plain values (str, int, float, bool) describing the subnetwork.
        attributes: plain values or 0-dim tensors, materialised to Python numbers.
        metrics: ``stoker.metrics.Metric`` objects called as ``metric(logits, labels)`` on the
            ``ReportMaterializer``'s data; their values go into the ``MaterializedReport``.
    """

    hparams: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Metric] = field(default_factory=dict)


@dataclass(kw_only=True)
class MaterializedReport:
    """A ``Report`` with every value a Python scalar, as written to ``report/iteration-<t>.json``."""

    iteration_number: int
    name: str
    hparams: dict[str, Any]
    attributes: dict[str, Any]
    metrics: dict[str, float]
    included_in_final_ensemble: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_number": self.iteration_number,
            "name": self.name,
            "hparams": dict(self.hparams),
            "attributes": dict(self.attributes),
            "metrics": dict(self.metrics),
            "included_in_final_ensemble": self.included_in_final_ensemble,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MaterializedReport:
        return cls(
            iteration_number=int(d["iteration_number"]),
            name=str(d["name"]),
            hparams=dict(d["hparams"]),
            attributes=dict(d["attributes"]),
            metrics={k: float(v) for k, v in d["metrics"].items()},
            included_in_final_ensemble=bool(d["included_in_final_ensemble"]),
        )


class Builder(abc.ABC):
    """Builds one candidate subnetwork of one iteration.

    Subclasses give ``name`` (unique within an iteration; it names the subnetwork in
    checkpoints and in ``architecture-<t>.json``), ``build_subnetwork`` and
    ``build_subnetwork_optimizer``.
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The subnetwork's name, e.g. ``"3_layer_dnn"``."""

    @abc.abstractmethod
    def build_subnetwork(
        self,
        features: Any,
        logits_dimension: int,
        training: bool,
        iteration_step: torch.Tensor,
        previous_ensemble: Ensemble | None,
    ) -> nn.Module:
        """Return the module whose ``forward(features)`` gives a ``Subnetwork`` (or logits).

        Called once per iteration (and again, identically, whenever a run is resumed or
        the final ensemble is rebuilt), with the global RNGs seeded from
        ``(RunConfig.seed, iteration, name)``.

        Args:
            features: one example batch, on the training device (for shapes).
            logits_dimension: the head's number of logits.
            training: whether the module is built for training (False when rebuilding
                the final ensemble for prediction).
            iteration_step: a 0-dim int64 tensor, on the device, that stoker increments in
                place after every training step of this iteration; keep a reference and
                read it in ``forward`` for step-dependent behaviour.
            previous_ensemble: the ensemble chosen at the previous iteration (None at 0).
        """

    @abc.abstractmethod
    def build_subnetwork_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The optimizer that trains this subnetwork's parameters on its own head loss."""

    def build_subnetwork_lr_schedule(self, optimizer: torch.optim.Optimizer) -> Any:
        """An optional learning-rate scheduler of this subnetwork's optimizer (e.g.
        ``torch.optim.lr_scheduler.StepLR(optimizer, 100)``), stepped once per training step of
        the iteration and checkpointed with it; ``None`` (the default) keeps the rate fixed."""
        return None

    def build_subnetwork_report(self) -> Report | None:
        """An optional ``Report``, materialised after the iteration by a ``ReportMaterializer``."""
        return None


class Generator(abc.ABC):
    """Proposes the builders of each iteration. It must be deterministic: the same
    arguments must give builders with the same names, because a resumed run and the
    final ensemble are rebuilt by calling it again."""

    @abc.abstractmethod
    def generate_candidates(
        self,
        previous_ensemble: Ensemble | None,
        iteration_number: int,
        previous_ensemble_reports: Sequence[MaterializedReport],
        all_reports: Sequence[MaterializedReport],
    ) -> Sequence[Builder]:
        """The builders to train at ``iteration_number``."""


class SimpleGenerator(Generator):
    """The same fixed list of builders at every iteration."""

    def __init__(self, builders: Sequence[Builder]) -> None:
        self._builders = list(builders)

    def generate_candidates(
        self,
        previous_ensemble: Ensemble | None,
        iteration_number: int,
        previous_ensemble_reports: Sequence[MaterializedReport],
        all_reports: Sequence[MaterializedReport],
    ) -> Sequence[Builder]:
        return list(self._builders)
