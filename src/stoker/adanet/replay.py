"""Replay a finished search: the same iterations, choosing the recorded candidates without
evaluating (``architecture-<t>.json`` records them as ``replay_indices``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = ["Config"]


@dataclass(kw_only=True)
class Config:
    """``best_ensemble_indices[t]`` is the candidate index chosen at iteration ``t``; past the
    end of the list, iterations select as usual."""

    best_ensemble_indices: Sequence[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.best_ensemble_indices = [int(i) for i in self.best_ensemble_indices]
        if any(i < 0 for i in self.best_ensemble_indices):
            raise ConfigError(f"replay.Config: indices must be >= 0; got {self.best_ensemble_indices}")

    def get_best_ensemble_index(self, iteration_number: int) -> int | None:
        """The recorded index of ``iteration_number``, or ``None`` past the recorded ones."""
        if 0 <= iteration_number < len(self.best_ensemble_indices):
            return self.best_ensemble_indices[iteration_number]
        return None
