"""``TrackerHook``: what the experiment-tracker hooks (MLflow, W&B) share.

A tracker hook logs the run's params once, the training loss, learning rate and rates every
``every_n_steps`` steps, every evaluation (``after_evaluation``) and, at the end, the final
and best checkpoints as artifacts. Only the chief logs.

**One tracker run, each step once, across kills.** The tracker's run id is kept in the hook's
checkpointed state, so a resumed run (kill -9, preemption, an elastic restart) continues the same
tracker run. Points are held back and sent when a checkpoint has been written (and at the end),
so the tracker never receives a step past the newest checkpoint; the points not yet sent when a
checkpoint is written are in that checkpoint's state too, and so are those sent too recently for
the tracker to surely hold them (:attr:`Tracker.unsure_s`). A resumed run sends those first, less
any the tracker already has (a kill may come after the send), which it asks the tracker
(:meth:`Tracker.last_steps`): each step reaches the tracker once, with the values of the run
that continues.

**Changed settings.** A resumed run whose settings differ from its checkpoint's
(``stoker.config.changes``) logs each change as a param ``changed.<step>.<name>`` =
``"<new> (was <old>; applied | given | kept)"``. A tracker keeps a param's first value (MLflow
refuses another), so the run's params stay those it started with and every change stands beside
them, with the step it took effect from.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config.changes import SettingChange, show
from .base import Hook, LoopResult, RunContext, RunTotals, every_n_steps_due, next_due_step

log = logging.getLogger("stoker")

# A point: (key, value, step, wall time in ms)
Point = tuple[str, float, int, int]


class Tracker:
    """The calls a tracker hook makes of one tracking service (MLflow, W&B)."""

    # Seconds after a send before the service surely holds what it was sent (W&B's service
    # buffers it and a kill -9 loses the buffer): points sent more recently stay in the
    # checkpoint's state, so a resumed run sends again those the service lacks.
    unsure_s: float = 0.0

    def start(self, run_id: str | None, params: Mapping[str, str]) -> str:
        """Open run ``run_id`` to continue it, or a new run logging ``params``; its id."""
        raise NotImplementedError

    def last_steps(self, keys: set[str]) -> dict[str, int]:
        """The newest step the tracker holds for each of ``keys`` (absent: none)."""
        raise NotImplementedError

    def log_params(self, params: Mapping[str, str]) -> None:
        """Add params to the open run (new names only: a tracker may refuse another value)."""
        raise NotImplementedError

    def log(self, points: list[Point]) -> None:
        raise NotImplementedError

    def log_artifacts(self, directory: Path, name: str) -> None:
        raise NotImplementedError

    def finish(self, ok: bool, interrupted: bool = False) -> None:
        """End the tracker's run: ``ok`` at training's end, ``interrupted`` at a signal's stop
        (a rerun continues the same run), else after an error."""
        raise NotImplementedError


def flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``params`` flattened to ``a.b -> str(value)`` (scalars and short lists; others skipped)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}."))
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[name] = str(value)[:500]
        elif isinstance(value, (list, tuple)) and len(value) <= 32:
            out[name] = str(list(value))[:500]
    return out


class TrackerHook(Hook):
    """Logs a training run to an experiment tracker; subclasses say which (:meth:`_open`)."""

    # Before the checkpoint saver: the points of a boundary are taken before its checkpoint is
    # written, so they are in it. The end of training is logged in close(), after every hook's
    # end (the final checkpoint, the final evaluation).
    phase = "recording"

    def __init__(self, every_n_steps: int | None = None, log_checkpoints: bool = True) -> None:
        self.every_n_steps = every_n_steps
        self.log_checkpoints = log_checkpoints
        self.run_id: str | None = None
        self._tracker: Tracker | None = None
        self._pending: list[Point] = []
        self._last_step = 0  # where the current logging interval began
        self._interval = RunTotals()  # the loops since then, summed here (its sums are checkpointed)
        self._eval_step = -1  # the step of the last evaluation logged
        self._ending = False
        self._run: RunContext | None = None
        # A resumed run: the newest step the tracker already had of each key (asked once per key)
        self._have: dict[str, int] | None = None
        self._unsure: list[tuple[float, list[Point]]] = []  # (monotonic time, points) of recent sends
        self._unsure_s = 0.0

    def _open(self, run: RunContext) -> Tracker:
        """The tracker client for ``run`` (imports its package)."""
        raise NotImplementedError

    # ------------------------------------------------------------ events
    def after_setup(self, run: RunContext) -> None:
        if self.every_n_steps is None:
            self.every_n_steps = run.info.log_every_n_steps or 100
        self._ending = False
        if not run.is_chief:
            return
        self._tracker = self._open(run)
        self._run = run
        self._unsure_s, self._unsure = self._tracker.unsure_s, []
        resumed = self.run_id is not None
        self.run_id = self._tracker.start(self.run_id, {} if resumed else self._params(run))
        self._have = {} if resumed else None
        log.info("%s: %s run %s", type(self).__name__, "continuing" if resumed else "logging to", self.run_id)
        if run.changed_settings:
            self._tracker.log_params(changed_params(run.changed_settings, run.global_step))
        if run.model_dir is not None:
            run.on_checkpoint.append(lambda path: self._send())

    def scheduled_after(self, step: int) -> int | None:
        return None if self.every_n_steps is None else next_due_step(step, self.every_n_steps)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self._tracker is None:
            return
        assert self.every_n_steps is not None
        self._interval.add(result)
        if every_n_steps_due(self._last_step, run.global_step, self.every_n_steps):
            self._take_interval(run)
        if run.model_dir is None:
            self._send()

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        step = int(metrics["global_step"])
        if self._tracker is None or step <= self._eval_step:
            return
        self._eval_step, now = step, int(time.time() * 1000)
        self._pending += [(f"eval/{k}", float(v), step, now) for k, v in metrics.items() if k != "global_step"]

    def end(self, run: RunContext) -> None:
        self._ending = True  # logged in close(), once the other hooks' end has run

    def close(self) -> None:
        tracker, run = self._tracker, self._run
        self._tracker, self._run = None, None
        if tracker is None or run is None:
            return
        if not self._ending:
            tracker.finish(ok=False)  # points held back stay in the checkpoint's state
            return
        self._tracker = tracker
        ended = not run.interrupted  # interrupted (a signal): the rerun reports the interval and the end
        try:
            if self._interval.loss_n and ended:
                self._take_interval(run)
            self._send()
            if self.log_checkpoints and run.model_dir is not None and ended:
                self._log_checkpoints(run)
            tracker.finish(ok=ended, interrupted=not ended)
        finally:
            self._tracker = None

    def state_dict(self) -> dict[str, Any]:
        acc = self._interval
        return {
            "run_id": self.run_id,
            "pending": [list(p) for p in self._recent() + self._pending],
            "eval_step": self._eval_step,
            "last_step": self._last_step,
            "interval": {"loss_sum": acc.loss_sum, "loss_n": acc.loss_n, "values": acc.values, "bad": acc.bad},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state["run_id"]
        self._pending = [(str(k), float(v), int(s), int(t)) for k, v, s, t in state["pending"]]
        self._eval_step, self._last_step = int(state["eval_step"]), int(state["last_step"])
        acc, saved = RunTotals(), state["interval"]
        acc.loss_sum, acc.loss_n = float(saved["loss_sum"]), int(saved["loss_n"])
        acc.values = {k: list(v) for k, v in saved["values"].items()}
        acc.bad = {k: list(v) for k, v in saved["bad"].items()}
        self._interval = acc

    # ------------------------------------------------------------ what is logged
    def _params(self, run: RunContext) -> dict[str, str]:
        params = flat_params({k: v for k, v in run.params.items() if k != "cache"})
        params["global_batch_size"] = str(run.global_batch_size)
        spec_path = Path(run.model_dir) / "run_spec.json" if run.model_dir is not None else None
        if spec_path is not None and spec_path.exists():
            params.update(flat_params(json.loads(spec_path.read_text()), "run_spec."))
        return params

    def _take_interval(self, run: RunContext) -> None:
        interval, self._interval = self._interval, RunTotals()
        self._last_step = run.global_step
        if not interval.loss_n:
            return
        now = int(time.time() * 1000)
        values = {"loss": interval.loss_sum / interval.loss_n, **interval.means()}
        for key in ("steps_per_sec", "examples_per_sec", "input_wait_fraction"):
            if key in run.logs:
                values[key] = run.logs[key]
        values.update(run.input_scalars())  # a mixture's realised proportions (mix/<name>)
        self._pending += [(k, float(v), run.global_step, now) for k, v in values.items()]

    def _send(self) -> None:
        if self._tracker is None or not self._pending:
            return
        points, self._pending = self._pending, []
        if self._have is not None:  # resumed: never a step the tracker already has (a kill came after a send)
            asked = {p[0] for p in points} - self._have.keys()
            if asked:
                self._have.update({k: -1 for k in asked} | self._tracker.last_steps(asked))
            points = [p for p in points if p[2] > self._have[p[0]]]
        if points:
            self._tracker.log(points)
            if self._unsure_s:
                self._unsure = [*self._unsure, (time.monotonic(), points)]

    def _recent(self) -> list[Point]:
        """The points sent less than ``Tracker.unsure_s`` ago (a resumed run sends again those the
        tracker lacks)."""
        now = time.monotonic()
        self._unsure = [(t, points) for t, points in self._unsure if now - t < self._unsure_s]
        return [p for _, points in self._unsure for p in points]

    def _log_checkpoints(self, run: RunContext) -> None:
        model_dir = Path(str(run.model_dir))
        if not model_dir.is_dir():
            log.info("%s: checkpoints are logged as artifacts from a local model_dir only", type(self).__name__)
            return
        index = (
            json.loads((model_dir / "checkpoint.json").read_text()) if (model_dir / "checkpoint.json").exists() else {}
        )
        assert self._tracker is not None
        latest, best = index.get("latest"), (index.get("best") or {}).get("name")
        if latest and (model_dir / latest).is_dir():
            self._tracker.log_artifacts(model_dir / latest, f"checkpoints/{latest}")
        if best and best != latest and (model_dir / best).is_dir():
            self._tracker.log_artifacts(model_dir / best, f"checkpoints/{best}")


def changed_params(changes: Sequence[SettingChange], step: int) -> dict[str, str]:
    """The params that record settings changed at ``step``: ``changed.<step>.<name>`` ->
    ``"<new> (was <old>; applied | given | kept)"``."""
    return {
        f"changed.{step}.{c.tracker_name}": f"{show(c.new)} (was {show(c.old)}; {c.outcome})"[:500] for c in changes
    }


def missing_extra(package: str, extra: str, hook: str) -> ImportError:
    return ImportError(f"{hook} needs the {package} package: pip install 'stoker[{extra}]'")


__all__ = ["Point", "Tracker", "TrackerHook", "changed_params", "flat_params", "missing_extra"]
