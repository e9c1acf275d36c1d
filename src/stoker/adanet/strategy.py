"""Ensemble strategies: which candidate ensembles to form from an iteration's subnetworks.

A strategy sees the iteration's new builders and the builders of the previous ensemble's
subnetworks, and proposes ``Candidate``s: a name, the new builders to include and the
previous subnetworks to keep. Every candidate is then built once per ensembler.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from .subnetwork import Builder

__all__ = ["AllStrategy", "Candidate", "GrowStrategy", "SoloStrategy", "Strategy"]


@dataclass(frozen=True)
class Candidate:
    """A proposed ensemble.

    Attributes:
        name: unique within the iteration (with the ensembler's name when there are several).
        subnetwork_builders: the iteration's new builders it includes.
        previous_ensemble_subnetwork_builders: the previous ensemble's builders whose
            (frozen) subnetworks it keeps.
    """

    name: str
    subnetwork_builders: Sequence[Builder]
    previous_ensemble_subnetwork_builders: Sequence[Builder]


class Strategy(abc.ABC):
    """Proposes candidate ensembles each iteration; must be deterministic."""

    @abc.abstractmethod
    def generate_ensemble_candidates(
        self, subnetwork_builders: Sequence[Builder], previous_ensemble_subnetwork_builders: Sequence[Builder] | None
    ) -> list[Candidate]:
        """The candidates of one iteration."""


class GrowStrategy(Strategy):
    """One candidate per new builder: the previous ensemble plus that subnetwork (``<b>_grow``)."""

    def generate_ensemble_candidates(
        self, subnetwork_builders: Sequence[Builder], previous_ensemble_subnetwork_builders: Sequence[Builder] | None
    ) -> list[Candidate]:
        previous = list(previous_ensemble_subnetwork_builders or [])
        return [Candidate(f"{b.name}_grow", [b], previous) for b in subnetwork_builders]


class AllStrategy(Strategy):
    """One candidate: the previous ensemble plus every new subnetwork (``all``)."""

    def generate_ensemble_candidates(
        self, subnetwork_builders: Sequence[Builder], previous_ensemble_subnetwork_builders: Sequence[Builder] | None
    ) -> list[Candidate]:
        return [Candidate("all", list(subnetwork_builders), list(previous_ensemble_subnetwork_builders or []))]


class SoloStrategy(Strategy):
    """One candidate per new builder, alone, without the previous ensemble (``<b>_solo``)."""

    def generate_ensemble_candidates(
        self, subnetwork_builders: Sequence[Builder], previous_ensemble_subnetwork_builders: Sequence[Builder] | None
    ) -> list[Candidate]:
        return [Candidate(f"{b.name}_solo", [b], []) for b in subnetwork_builders]
