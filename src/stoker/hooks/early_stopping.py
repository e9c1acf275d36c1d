"""``EarlyStopping``: stop training when an evaluation metric stops improving; the stop file.

The hook reads the evaluations the run makes (``run.last_evaluation``, set by
``train_and_evaluate``'s ``EvaluationHook``, which hands a resumed run back the evaluation of
the checkpoint it resumed from). Its own state (best value, evaluations without improvement,
the step it stopped at) is kept in checkpoints, so a run killed anywhere and run again stops at
the same step with the same weights, and a stopped run run again stops at once and says why.

A stop is also recorded in ``model_dir/early_stop.json`` (written atomically), which is how a
watching evaluator (``stoker evaluate --watch --early_stopping ...``) stops a trainer: every
training run with a ``model_dir`` reads that file when it starts and after each checkpoint
(``StopFileHook``, a default hook), and stops there.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import storage
from ..errors import ConfigError, StorageError
from .base import Hook, LoopResult, RunContext

if TYPE_CHECKING:
    from ..storage import Location

log = logging.getLogger("stoker")

STOP_FILE = "early_stop.json"
MODES = ("min", "max")


def check_monitor(owner: str, monitor: object) -> str:
    """``monitor`` if it can name an evaluation metric; a ``ConfigError`` from ``owner`` else."""
    if not isinstance(monitor, str) or not monitor:
        raise ConfigError(f"{owner}: monitor must be the name of an evaluation metric; got {monitor!r}")
    return monitor


def monitored_value(owner: str, monitor: str, results: Mapping[str, float]) -> float:
    """``results[monitor]`` as a float; a ``ConfigError`` from ``owner`` naming the metrics the
    evaluation has when it lacks ``monitor``."""
    if monitor not in results:
        available = sorted(k for k in results if k != "global_step")
        raise ConfigError(f"{owner}: monitor={monitor!r} is not among the evaluation's metrics {available}")
    return float(results[monitor])


class MetricWatch:
    """One monitored evaluation metric: whether a value improves on another (``mode``,
    ``min_delta``), and the value read from an evaluation's results."""

    def __init__(self, owner: str, monitor: str, mode: str, min_delta: float) -> None:
        check_monitor(owner, monitor)
        if mode not in MODES:
            raise ConfigError(f"{owner}: mode must be one of {MODES}; got {mode!r}")
        if not (isinstance(min_delta, (int, float)) and min_delta >= 0):
            raise ConfigError(f"{owner}: min_delta must be a number >= 0; got {min_delta!r}")
        self.owner, self.monitor, self.mode, self.min_delta = owner, monitor, mode, float(min_delta)

    def improves(self, value: float, than: float | None) -> bool:
        """Whether ``value`` beats ``than`` by more than ``min_delta`` (NaN never does)."""
        if math.isnan(value):
            return False
        if than is None:
            return True
        return value - self.min_delta > than if self.mode == "max" else value + self.min_delta < than

    def value(self, results: Mapping[str, float]) -> float:
        """The monitored metric of ``results`` (:func:`monitored_value`)."""
        return monitored_value(self.owner, self.monitor, results)


def check_positive_int(owner: str, name: str, value: object, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{owner}: {name} must be an integer >= {minimum}; got {value!r}")
    return value


class EarlyStopping(Hook):
    """Stop training when ``monitor`` has not improved for ``patience`` evaluations.

    Give it in ``hooks=`` to ``Estimator.train_and_evaluate``. Keras' rule: an evaluation
    improves when it beats the best so far by more than ``min_delta`` (``mode="min"``: lower
    is better; ``"max"``: higher); with a ``baseline``, an improvement that does not also beat
    the baseline does not reset the count. When ``patience`` evaluations in a row did not
    improve, training stops at that step (its checkpoint, written for the evaluation, is the
    final one; ``RunConfig.keep_best`` still names the best) and ``early_stop.json`` records why.

    Attributes (after training): ``best``, ``best_step``, ``stopped_step``, ``reason``.
    """

    priority = 37  # after EvaluationHook (35), whose results it reads at the same boundary

    def __init__(
        self,
        monitor: str,
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        baseline: float | None = None,
    ) -> None:
        self.watch = MetricWatch("EarlyStopping", monitor, mode, min_delta)
        self.patience = check_positive_int("EarlyStopping", "patience", patience)
        self.baseline = None if baseline is None else float(baseline)
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.seen_step = -1  # the step of the last evaluation taken in
        self.stopped_step: int | None = None
        self.reason = ""

    # ------------------------------------------------------------ the rule
    def observe(self, step: int, results: Mapping[str, float]) -> bool:
        """Take in the evaluation of ``step``; whether training should stop there."""
        if step <= self.seen_step:
            return self.stopped_step is not None
        self.seen_step = step
        if self.stopped_step is not None:
            return True
        value = self.watch.value(results)
        self.wait += 1
        if self.watch.improves(value, self.best):
            self.best, self.best_step = value, step
            if self.baseline is None or self.watch.improves(value, self.baseline):
                self.wait = 0
                return False
        if self.wait < self.patience:
            return False
        self.stopped_step = step
        best = "none" if self.best is None else f"{self.best:.6g} at step {self.best_step}"
        self.reason = (
            f"early stopping: {self.watch.monitor} did not improve ({self.watch.mode}, min_delta "
            f"{self.watch.min_delta:g}{'' if self.baseline is None else f', baseline {self.baseline:g}'}) in "
            f"{self.wait} evaluation(s); best {best}"
        )
        return True

    def replay(self, evaluations: Iterable[tuple[int, Mapping[str, float]]]) -> bool:
        """:meth:`observe` each ``(step, results)`` in step order; whether training should stop."""
        stop = False
        for step, results in sorted(evaluations, key=lambda e: e[0]):
            stop = self.observe(step, results)
        return stop

    # ------------------------------------------------------------ the hook
    def after_setup(self, run: RunContext) -> None:
        self._take(run)  # a resumed run gets back the evaluation of the step it resumed at
        if self.stopped_step is not None:
            log.info(
                "EarlyStopping: this run stopped early at step %d (%s); nothing more to do (to train on, "
                "remove EarlyStopping from hooks= and %s from model_dir)",
                self.stopped_step,
                self.reason,
                STOP_FILE,
            )
            run.request_stop(f"it stopped early at step {self.stopped_step}")
            self._record(run)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self._take(run):
            run.request_stop(self.reason)
            run.save_checkpoint()  # the final checkpoint: the one of this step, written for its evaluation
            self._record(run)

    def _take(self, run: RunContext) -> bool:
        """Observe the run's newest evaluation if it is new; whether it stops training now."""
        ev = run.last_evaluation
        if ev is None or self.stopped_step is not None:
            return False
        step = int(ev["global_step"])
        if step > run.global_step or step <= self.seen_step:
            return False
        return self.observe(step, ev)

    def _record(self, run: RunContext) -> None:
        if run.is_chief and run.model_dir is not None and self.stopped_step is not None:
            if read_stop(run.model_dir) is None:  # a kill may have come before it was written
                write_stop(run.model_dir, self.stopped_step, self.reason)

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_step": self.best_step,
            "wait": self.wait,
            "seen_step": self.seen_step,
            "stopped_step": self.stopped_step,
            "reason": self.reason,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = state["best"], state["best_step"]
        self.wait, self.seen_step = int(state["wait"]), int(state["seen_step"])
        self.stopped_step, self.reason = state["stopped_step"], state["reason"]

    @classmethod
    def parse(cls, spec: str) -> EarlyStopping:
        """``MONITOR[:MODE[:PATIENCE[:MIN_DELTA]]]`` (the ``--early_stopping`` flag), e.g. ``accuracy:max:3``."""
        parts = spec.split(":")
        if not 1 <= len(parts) <= 4 or not parts[0]:
            raise ConfigError(f"--early_stopping must be MONITOR[:MODE[:PATIENCE[:MIN_DELTA]]]; got {spec!r}")
        try:
            patience = int(parts[2]) if len(parts) > 2 else 3
            min_delta = float(parts[3]) if len(parts) > 3 else 0.0
        except ValueError as e:
            raise ConfigError(f"--early_stopping {spec!r}: PATIENCE must be an integer, MIN_DELTA a number") from e
        return cls(parts[0], parts[1] if len(parts) > 1 else "min", patience, min_delta)

    def evaluator_callback(self, model_dir: str | os.PathLike[str]) -> Any:
        """An ``on_result(step, results)`` for a watching evaluator: decides from each evaluation
        and writes ``early_stop.json`` when training should stop (the trainer stops at its next
        checkpoint, the evaluator at its next look at the model_dir)."""

        def on_result(step: int, results: dict[str, float]) -> None:
            if self.stopped_step is None and self.observe(step, results):
                log.info("evaluator: %s; stopping training at its next checkpoint", self.reason)
                write_stop(model_dir, step, self.reason)

        return on_result


# ==================================================================== the stop file
def write_stop(model_dir: str | os.PathLike[str] | Location, step: int, reason: str) -> None:
    """Record in ``model_dir/early_stop.json`` that training stops (step of the deciding
    evaluation, why); written atomically (temp + rename; an object store's put is atomic)."""
    data = json.dumps({"step": int(step), "reason": reason}).encode()
    path = storage.location(model_dir) / STOP_FILE
    if isinstance(path, Path):
        tmp = path.with_name(f".{STOP_FILE}.{uuid.uuid4().hex}.tmp")
        storage.write_all([(tmp, data)])
        os.replace(tmp, path)
    else:
        storage.write_all([(path, data)])


def read_stop(model_dir: str | os.PathLike[str] | Location) -> dict[str, Any] | None:
    """What ``early_stop.json`` says (``{"step", "reason"}``), or ``None`` when there is none."""
    path = storage.location(model_dir) / STOP_FILE
    try:
        if isinstance(path, Path) and not path.exists():
            return None
        found = json.loads(storage.read_bytes(path))
    except (OSError, StorageError, ValueError):
        return None
    return found if isinstance(found, dict) and "step" in found else None


class StopFileHook(Hook):
    """Stop training when ``model_dir/early_stop.json`` exists (a default hook with a model_dir).

    It is read when training starts and after each checkpoint, never per step: a watching
    evaluator writes it after evaluating a checkpoint, and the trainer stops at the next one
    it writes, which is its final checkpoint.
    """

    priority = 38

    def after_setup(self, run: RunContext) -> None:
        if run.model_dir is None:
            return
        if self._check(run, "this run was stopped early"):
            return

        def checkpointed(path: Location) -> None:
            self._check(run, "stopping")

        run.on_checkpoint.append(checkpointed)

    def _check(self, run: RunContext, what: str) -> bool:
        assert run.model_dir is not None
        found = read_stop(run.model_dir)
        if found is None:
            return False
        if not run.stop_requested:
            run.request_stop(f"{what}: {STOP_FILE} says {found.get('reason', '')} (at step {found['step']})")
        return True


__all__ = ["STOP_FILE", "EarlyStopping", "MetricWatch", "StopFileHook", "read_stop", "write_stop"]
