"""``EarlyStopping``: stop training when a metric stops improving (or reaches a target,
diverges, is not finite); the stop file.

The hook takes in the evaluations the run makes (``after_evaluation``, from
``train_and_evaluate``'s ``EvaluationHook``, which hands a resumed run back the evaluation of
the checkpoint it resumed from), or a training value every N steps (``source="train"``; what
is watched and how: ``monitor.py``). Its own state (best value, checks without improvement,
the step it stopped at and why) is kept in checkpoints, so a run killed anywhere and run again
stops at the same step with the same weights, and a stopped run run again stops at once and
says how to go on.

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
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import storage
from ..errors import ConfigError, StorageError
from .base import Hook, LoopResult, RunContext
from .monitor import (
    PHASE_OF_SOURCE,
    Monitor,
    check_monitor,
    check_number,
    check_positive_int,
    monitored_value,
)

if TYPE_CHECKING:
    from ..storage import Location

log = logging.getLogger("stoker")

STOP_FILE = "early_stop.json"


class EarlyStopping(Hook):
    """Stop training when ``monitor`` stops improving, reaches a target, diverges or is not finite.

    Keras' rule: a check improves when it beats the best so far by more than ``min_delta``
    (``mode="auto"``: the direction the name says, :func:`~stoker.hooks.monitor.resolve_mode`;
    ``"min"``: lower is better; ``"max"``: higher); with a ``baseline``, an improvement that does
    not also beat the baseline does not reset the count, and an improvement never stops. When
    ``patience`` checks in a row did not improve (``0``: the first that does not), training
    stops at that step. Lightning's extra stops, checked first: the value is NaN or infinite
    (``check_finite``), it reaches ``stopping_threshold`` (at least that good), or it is worse
    than ``divergence_threshold``.

    ``source="eval"`` (default): the checks are the evaluations of ``train_and_evaluate`` (give
    the hook there; ``train`` refuses it). ``source="train"``: the training loss (``"loss"``) or a
    ``host_call`` value, its mean over each ``every_n_steps`` steps (default
    ``RunConfig.log_every_n_steps``), in ``train`` or ``train_and_evaluate``.

    The stop's step's checkpoint is the final one (``RunConfig.keep_best`` still names the best)
    and ``early_stop.json`` records the stop. A stopped run rerun stops at once, unless the
    settings given now would not have stopped it (e.g. a larger ``patience``): then it trains on
    from there as a run with those settings would have.

    Attributes (after training): ``best``, ``best_step``, ``stopped_step``, ``stopped_by``
    (``"patience"``, ``"stopping_threshold"``, ``"divergence_threshold"``, ``"check_finite"``),
    ``reason``.
    """

    phase = PHASE_OF_SOURCE["eval"]

    def __init__(
        self,
        monitor: str,
        mode: str = "auto",
        patience: int = 3,
        min_delta: float = 0.0,
        baseline: float | None = None,
        *,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_finite: bool = True,
        source: str = "eval",
        every_n_steps: int | None = None,
    ) -> None:
        owner = "EarlyStopping"
        self.watch = Monitor(owner, monitor, mode, source, every_n_steps)
        self.patience = check_positive_int(owner, "patience", patience, minimum=0)
        if not (isinstance(min_delta, (int, float)) and min_delta >= 0):
            raise ConfigError(f"{owner}: min_delta must be a number >= 0; got {min_delta!r}")
        if not isinstance(check_finite, bool):
            raise ConfigError(f"{owner}: check_finite must be True or False; got {check_finite!r}")
        self.min_delta, self.check_finite = float(min_delta), check_finite
        self.baseline = check_number(owner, "baseline", baseline)
        self.stopping_threshold = check_number(owner, "stopping_threshold", stopping_threshold)
        self.divergence_threshold = check_number(owner, "divergence_threshold", divergence_threshold)
        if (
            self.stopping_threshold is not None
            and self.divergence_threshold is not None
            and not self.watch.better(self.stopping_threshold, self.divergence_threshold)
        ):
            raise ConfigError(
                f"{owner}: stopping_threshold must be better than divergence_threshold (mode={self.watch.mode!r}); "
                f"got {self.stopping_threshold:g} and {self.divergence_threshold:g}"
            )
        self.phase = PHASE_OF_SOURCE[self.watch.source]
        self.needs_evaluations = source == "eval"
        if source == "eval":
            self.due_step = sys.maxsize  # evaluations come through after_evaluation: no call after loops
        self._set_up = False  # after_setup has run in this train call
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.stopped_step: int | None = None
        self.stopped_by: str | None = None
        self.stopped_value: float | None = None
        self.reason = ""

    @property
    def source(self) -> str:
        """``"eval"`` or ``"train"``: what ``monitor`` names."""
        return self.watch.source

    # ------------------------------------------------------------ the rule
    def improves(self, value: float, than: float | None) -> bool:
        """Whether ``value`` beats ``than`` by more than ``min_delta`` (NaN never does)."""
        if math.isnan(value):
            return False
        return than is None or self.watch.better(
            value + (self.min_delta if self.watch.mode == "min" else -self.min_delta), than
        )

    def observe(self, step: int, results: Mapping[str, float]) -> bool:
        """Take in the evaluation ``results`` of ``step``; whether training should stop there."""
        seen = self.watch.evaluation({**results, "global_step": step})
        return self.stopped_step is not None if seen is None else self.decide(*seen)

    def decide(self, step: int, value: float) -> bool:
        """Take in ``value``, the check of ``step``; whether training should stop there."""
        if self.stopped_step is not None:
            return True
        self.wait += 1
        improved = self.improves(value, self.best)
        if improved:
            self.best, self.best_step = value, step
            if self.baseline is None or self.improves(value, self.baseline):
                self.wait = 0
        stopped_by = self._stop_rule(value, improved)
        if stopped_by is None:
            return False
        self.stopped_step, self.stopped_by, self.stopped_value = step, stopped_by, value
        self.reason = self._reason()
        return True

    def _stop_rule(self, value: float, improved: bool) -> str | None:
        """Which rule stops at a check of ``value`` (``None``: none), in Lightning's order."""
        if self.check_finite and not math.isfinite(value):
            return "check_finite"
        target = self.stopping_threshold
        if target is not None and (value == target or self.watch.better(value, target)):
            return "stopping_threshold"
        if self.divergence_threshold is not None and self.watch.better(self.divergence_threshold, value):
            return "divergence_threshold"
        if not improved and self.wait >= self.patience:  # Keras: an improvement never stops
            return "patience"
        return None

    def _stop_holds(self) -> bool:
        """Whether the settings given now make the recorded stop too (its reason updated to theirs)."""
        value = self.stopped_value
        if value is None:  # a checkpoint from before stopped_value was kept: a patience stop
            return self.wait >= self.patience
        stopped_by = self._stop_rule(value, improved=self.best_step == self.stopped_step)
        if stopped_by is not None and stopped_by != self.stopped_by:
            self.stopped_by = stopped_by
            self.reason = self._reason()
        return stopped_by is not None

    def _reason(self) -> str:
        watch, value = self.watch, self.stopped_value
        name = watch.name if watch.source == "eval" else f"training {watch.name}"
        if self.stopped_by == "check_finite":
            return f"early stopping: {name} = {value} is not finite (check_finite)"
        if self.stopped_by == "stopping_threshold":
            return f"early stopping: {name} = {value:.6g} reached stopping_threshold {self.stopping_threshold:g}"
        if self.stopped_by == "divergence_threshold":
            worse = "above" if watch.mode == "min" else "below"
            return f"early stopping: {name} = {value:.6g} is {worse} divergence_threshold {self.divergence_threshold:g}"
        best = "none" if self.best is None else f"{self.best:.6g} at step {self.best_step}"
        baseline = "" if self.baseline is None else f", baseline {self.baseline:g}"
        return (
            f"early stopping: {name} did not improve ({watch.mode}, min_delta {self.min_delta:g}{baseline}) in "
            f"{self.wait} {watch.checks}; best {best}"
        )

    def _how_to_continue(self) -> str:
        """What a rerun needs to train on after the recorded stop."""
        if self.stopped_by == "check_finite":
            change = "check_finite=False"
        elif self.stopped_by == "stopping_threshold":
            change = "a stopping_threshold it has not reached, or none"
        elif self.stopped_by == "divergence_threshold":
            change = "a divergence_threshold it has not crossed, or none"
        else:
            change = f"patience > {self.wait} (the checks in a row without improvement)"
        return (
            f"to train on from here, rerun with {change}; or remove EarlyStopping from hooks= and "
            f"{STOP_FILE} from the model_dir"
        )

    def replay(self, evaluations: Iterable[tuple[int, Mapping[str, float]]]) -> bool:
        """:meth:`observe` each ``(step, results)`` in step order; whether training should stop."""
        stop = False
        for step, results in sorted(evaluations, key=lambda e: e[0]):
            stop = self.observe(step, results)
        return stop

    # ------------------------------------------------------------ the hook
    def begin(self, run: RunContext) -> None:
        self._set_up = False

    def after_setup(self, run: RunContext) -> None:
        # A resumed run's evaluation of its start step came before (after_evaluation): a stop it
        # decided is this run's earlier stop, said here.
        self._set_up = True
        if self.stopped_step is not None and not self._stop_holds():
            self._forget_stop()
        if self.stopped_step is None:
            seen = self.watch.start(run)  # a resumed run's check of the step it resumed at
            if seen is not None:
                self.decide(*seen)
        if self.stopped_step is None:
            self._withdraw_stop_file(run)
            return
        log.info(
            "EarlyStopping: this run stopped early at step %d (%s); nothing more to do: %s",
            self.stopped_step,
            self.reason,
            self._how_to_continue(),
        )
        run.request_stop(f"it stopped early at step {self.stopped_step}")
        self._record(run)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.stopped_step is None:  # source="train" (evaluations come through after_evaluation)
            self._act(run, self.watch.take(run, result))

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        if self.stopped_step is not None:
            return
        seen = self.watch.evaluation(metrics)
        if self._set_up:
            self._act(run, seen)
        elif seen is not None:  # a resumed run's start step, during setup: after_setup says the stop
            self.decide(*seen)

    def _act(self, run: RunContext, seen: tuple[int, float] | None) -> None:
        if seen is not None and self.decide(*seen):
            run.request_stop(self.reason)
            run.save_checkpoint()  # the final checkpoint: the one of this step (for an evaluation, written already)
            self._record(run)

    def scheduled_after(self, step: int) -> int | None:
        """``source="train"``: the next check's step (loops end there); ``None`` for evaluations."""
        return self.watch.scheduled_after(step)

    def _forget_stop(self) -> None:
        self.stopped_step = self.stopped_by = self.stopped_value = None
        self.reason = ""

    def _withdraw_stop_file(self, run: RunContext) -> None:
        """Remove the ``early_stop.json`` this hook wrote at the step the run resumes at when the
        settings given now do not stop there (e.g. a larger ``patience``): training goes on."""
        if run.model_dir is None:
            return
        if run.is_chief:
            found = read_stop(run.model_dir)
            if found is not None and found.get("by") == "EarlyStopping" and found["step"] == run.global_step:
                log.info(
                    "EarlyStopping: the stop at step %d (%s) does not hold with the settings given now; training "
                    "goes on",
                    found["step"],
                    found.get("reason", ""),
                )
                remove_stop(run.model_dir)
        run.any_replica(False)  # collective: no replica's StopFileHook reads the file before it is gone

    def _record(self, run: RunContext) -> None:
        if run.is_chief and run.model_dir is not None and self.stopped_step is not None:
            if read_stop(run.model_dir) is None:  # a kill may have come before it was written
                write_stop(run.model_dir, self.stopped_step, self.reason, by="EarlyStopping")

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.watch.state_dict(),
            "best": self.best,
            "best_step": self.best_step,
            "wait": self.wait,
            "stopped_step": self.stopped_step,
            "stopped_by": self.stopped_by,
            "stopped_value": self.stopped_value,
            "reason": self.reason,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.watch.load_state_dict(state):
            return
        self.best, self.best_step, self.wait = state["best"], state["best_step"], int(state["wait"])
        self.stopped_step, self.reason = state["stopped_step"], state["reason"]
        # before these two were kept, every stop was patience's
        self.stopped_by = state.get("stopped_by", None if self.stopped_step is None else "patience")
        self.stopped_value = state.get("stopped_value")

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
        return cls(parts[0], parts[1] if len(parts) > 1 else "auto", patience, min_delta)

    def evaluator_callback(self, model_dir: str | os.PathLike[str]) -> Any:
        """An ``on_result(step, results)`` for a watching evaluator: decides from each evaluation
        and writes ``early_stop.json`` when training should stop (the trainer stops at its next
        checkpoint, the evaluator at its next look at the model_dir)."""
        if self.source != "eval":
            raise ConfigError("EarlyStopping: a watching evaluator decides from evaluations: give source='eval'")

        def on_result(step: int, results: dict[str, float]) -> None:
            if self.stopped_step is None and self.observe(step, results):
                log.info("evaluator: %s; stopping training at its next checkpoint", self.reason)
                write_stop(model_dir, step, self.reason, by="evaluator")

        return on_result


# ==================================================================== the stop file
def write_stop(model_dir: str | os.PathLike[str] | Location, step: int, reason: str, by: str | None = None) -> None:
    """Record in ``model_dir/early_stop.json`` that training stops (step of the deciding
    evaluation, why, and who decided: ``"EarlyStopping"`` in the trainer, ``"evaluator"``);
    written atomically (temp + rename; an object store's put is atomic)."""
    found: dict[str, Any] = {"step": int(step), "reason": reason}
    if by is not None:
        found["by"] = by
    data = json.dumps(found).encode()
    path = storage.location(model_dir) / STOP_FILE
    if isinstance(path, Path):
        tmp = path.with_name(f".{STOP_FILE}.{uuid.uuid4().hex}.tmp")
        storage.write_all([(tmp, data)])
        os.replace(tmp, path)
    else:
        storage.write_all([(path, data)])


def read_stop(model_dir: str | os.PathLike[str] | Location) -> dict[str, Any] | None:
    """What ``early_stop.json`` says (``{"step", "reason"}`` and ``"by"``), or ``None`` when there is none."""
    path = storage.location(model_dir) / STOP_FILE
    try:
        if isinstance(path, Path) and not path.exists():
            return None
        found = json.loads(storage.read_bytes(path))
    except (OSError, StorageError, ValueError):
        return None
    return found if isinstance(found, dict) and "step" in found else None


def remove_stop(model_dir: str | os.PathLike[str] | Location) -> None:
    """Remove ``model_dir/early_stop.json`` (if there is one)."""
    path = storage.location(model_dir) / STOP_FILE
    if isinstance(path, Path):
        path.unlink(missing_ok=True)
    elif storage.exists(path):
        storage.remove_tree(path)


class StopFileHook(Hook):
    """Stop training when ``model_dir/early_stop.json`` exists (a default hook with a model_dir).

    It is read when training starts and after each checkpoint, never per step: a watching
    evaluator writes it after evaluating a checkpoint, and the trainer stops at the next one
    it writes, which is its final checkpoint.
    """

    # Stops from outside the run, read after EarlyStopping has withdrawn a stop that no longer holds.
    phase = "signals"

    def after_setup(self, run: RunContext) -> None:
        if run.model_dir is None:
            return
        if self._check(run, "this run was stopped early", f"; to train on, remove {STOP_FILE} from the model_dir"):
            return

        def checkpointed(path: Location) -> None:
            self._check(run, "stopping")

        run.on_checkpoint.append(checkpointed)

    def _check(self, run: RunContext, what: str, then: str = "") -> bool:
        assert run.model_dir is not None
        found = read_stop(run.model_dir)
        if found is None:
            return False
        if not run.stop_requested:
            run.request_stop(f"{what}: {STOP_FILE} says {found.get('reason', '')} (at step {found['step']}){then}")
        return True


__all__ = [
    "STOP_FILE",
    "EarlyStopping",
    "StopFileHook",
    "check_monitor",
    "monitored_value",
    "read_stop",
    "remove_stop",
    "write_stop",
]
