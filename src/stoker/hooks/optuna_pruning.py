"""``OptunaPruning``: report each evaluation to an Optuna trial and stop the run it prunes.

optuna is imported when the hook is built, never before (``pip install 'stoker[optuna]'``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from ..errors import ConfigError
from .base import Hook, RunContext
from .early_stopping import monitored_value
from .tracking import missing_extra

log = logging.getLogger("stoker")


class OptunaPruning(Hook):
    """Report ``monitor`` of each evaluation to ``trial`` (at its global step) and, when the
    trial's pruner says so, stop training cleanly (the checkpoint of that step is the final one)
    and raise ``optuna.TrialPruned`` from ``train`` / ``train_and_evaluate``.

    The values reported and a prune are kept in checkpoints: a trial resumed after kill -9 (the
    same trial, or its retry in a new Optuna trial, see ``stoker.tune``) reports them again and
    a pruned run rerun raises ``TrialPruned`` at once.
    """

    phase = "decisions"  # after the evaluation it reports
    needs_evaluations = True

    def __init__(self, trial: Any, monitor: str) -> None:
        try:
            import optuna
        except ImportError as e:
            raise missing_extra("optuna", "optuna", "OptunaPruning") from e
        if not (callable(getattr(trial, "report", None)) and callable(getattr(trial, "should_prune", None))):
            raise ConfigError(
                "OptunaPruning: trial must be the optuna trial the objective is given (optuna.trial.Trial); "
                f"got {type(trial).__name__}"
            )
        self._optuna = optuna
        self.trial, self.monitor = trial, monitor
        self.reported: list[tuple[int, float]] = []
        self.pruned_step: int | None = None
        self._set_up = self._replayed = False

    def begin(self, run: RunContext) -> None:
        self._set_up = self._replayed = False

    def after_setup(self, run: RunContext) -> None:
        self._set_up = True
        self._replay()
        if self.pruned_step is not None:  # also by a resumed run's start step, taken in just before
            run.request_stop(f"the Optuna trial was pruned at step {self.pruned_step}")

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        if self.pruned_step is not None:
            return
        step = int(metrics["global_step"])
        if self.reported and step <= self.reported[-1][0]:
            return
        self._replay()  # a resumed run's start step comes before after_setup: the earlier values first
        value = monitored_value("OptunaPruning", self.monitor, metrics)
        self.reported.append((step, value))
        with warnings.catch_warnings():  # a resumed run reports its start step again: ignored
            warnings.simplefilter("ignore", UserWarning)
            self.trial.report(value, step)
        if self.trial.should_prune():
            self.pruned_step = step
            if self._set_up:  # during setup, after_setup says it
                run.request_stop(f"the Optuna trial is pruned at step {step}")
                run.save_checkpoint()

    def end(self, run: RunContext) -> None:
        if self.pruned_step is not None:
            raise self._optuna.TrialPruned(f"pruned at step {self.pruned_step}")

    def _replay(self) -> None:
        """Report the values of the checkpoint's state once, to a retried trial (a new Optuna
        trial, the same run); the same trial resumed has them and says it ignores them."""
        if self._replayed:
            return
        self._replayed = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for step, value in self.reported:
                self.trial.report(value, step)

    def state_dict(self) -> dict[str, Any]:
        return {"reported": [list(r) for r in self.reported], "pruned_step": self.pruned_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reported = [(int(s), float(v)) for s, v in state["reported"]]
        self.pruned_step = state["pruned_step"]


__all__ = ["OptunaPruning"]
