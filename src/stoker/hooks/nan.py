"""``NanLossHook``: on a non-finite (or spiking) loss, stop, or roll back and skip its batches.

By default the run stops with ``NanLossError``, keeping the last good checkpoint. With
``on_nan="rollback"`` the hook raises :class:`RollbackRequest` instead; the training run
(``stoker.engine.training``) catches it, restores the newest checkpoint (weights, optimizer,
schedule, RNG, input position, hook states), records the bad step's input batches in the
input position as batches to pass over, and trains on. So the run goes on exactly as a run
whose input stream never held those batches, and the record is part of the checkpointed
input state: a resume (kill -9) after a rollback is bitwise too.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from typing import Any

from ..errors import ConfigError, NanLossError, StokerError
from .base import Hook, LoopResult, RunContext

ON_NAN = ("stop", "rollback")


class RollbackRequest(StokerError):  # noqa: N818 - a request the training run handles, not an error
    """Raised by ``NanLossHook(on_nan="rollback")`` at a loop boundary: the training run rolls
    back to its newest checkpoint and passes over the input batches of global step ``step``.

    It never leaves ``Estimator.train`` (the training run catches it); a ``StokerError`` so that
    every exception stoker defines is in one tree. Raising unwinds the hooks after this one at that
    boundary, so none of them writes a checkpoint of the bad step.
    """

    def __init__(self, step: int, loss: float, reason: str) -> None:
        super().__init__(f"roll back: {reason}")
        self.step = step
        self.loss = loss
        self.reason = reason


class NanLossHook(Hook):
    """Act on the first step whose loss is NaN or infinite, or (``spike_factor``) a spike.

    Args:
        on_nan: ``"stop"`` (the default): raise ``NanLossError`` naming the step.
            ``"rollback"``: restore the newest checkpoint, skip the input batches of that step
            (all ``gradient_accumulation_steps`` micro-batches of it) and train on; after
            ``max_rollbacks`` rollbacks in a run, the next bad step stops it with ``NanLossError``.
        max_rollbacks: rollbacks a run may take (counted over the whole run, across resumes).
        spike_factor: also treat a finite loss above ``spike_factor`` x the median of the last
            ``spike_window`` accepted losses as bad (``None``: only non-finite losses). Checked
            once the window is full, so the first ``spike_window`` steps never count as
            spikes; meant for positive losses.
        spike_window: how many recent losses the median is taken over.

    It runs before any checkpoint is written at that loop boundary, and no checkpoint is written
    after an error or before a rollback, so the newest checkpoint on disk is the last good one.
    """

    phase = "state"  # before anything saves: the newest checkpoint stays the last good one

    def __init__(
        self,
        on_nan: str = "stop",
        max_rollbacks: int = 3,
        spike_factor: float | None = None,
        spike_window: int = 50,
    ) -> None:
        if on_nan not in ON_NAN:
            raise ConfigError(f"NanLossHook: on_nan must be one of {', '.join(ON_NAN)}; got {on_nan!r}")
        if not isinstance(max_rollbacks, int) or max_rollbacks < 0:
            raise ConfigError(f"NanLossHook: max_rollbacks must be an integer >= 0; got {max_rollbacks!r}")
        if spike_factor is not None and not spike_factor > 1:
            raise ConfigError(f"NanLossHook: spike_factor must be None or a number > 1; got {spike_factor!r}")
        if not isinstance(spike_window, int) or spike_window < 1:
            raise ConfigError(f"NanLossHook: spike_window must be a positive integer; got {spike_window!r}")
        self.on_nan = on_nan
        self.max_rollbacks = max_rollbacks
        self.spike_factor = spike_factor
        self.spike_window = spike_window
        self._recent: deque[float] = deque(maxlen=spike_window)

    def begin(self, run: RunContext) -> None:
        self._recent.clear()  # a run that rolled back reloads the window from the checkpoint

    def after_setup(self, run: RunContext) -> None:
        if self.spike_factor is not None:
            self.due_step = None  # every loss counts towards the window
            return
        # Called only after a loop with a non-finite loss: run.totals sees every loss first.
        self.due_step = sys.maxsize
        run.totals.on_nonfinite_loss.append(self._wake)

    def _wake(self) -> None:
        self.due_step = None

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.spike_factor is None and math.isfinite(sum(result.losses)):  # finite only if every loss is
            return
        found = self._first_bad(result.losses)
        if found is None:
            return
        i, reason = found
        step, loss = result.first_step + i + 1, result.losses[i]
        checkpoint = str(run.last_checkpoint) if run.last_checkpoint else None
        if self.on_nan == "stop":
            raise NanLossError(step, loss, checkpoint, detail=reason)
        if run.rollbacks >= self.max_rollbacks:
            already = f"{run.rollbacks} rollback(s) already, max_rollbacks={self.max_rollbacks}"
            raise NanLossError(step, loss, checkpoint, detail=f"{reason}; {already}" if reason else already)
        raise RollbackRequest(step, loss, f"loss is {loss} at step {step}" + (f" ({reason})" if reason else ""))

    def _first_bad(self, losses: list[float]) -> tuple[int, str] | None:
        """The index of the first bad loss and why ("" for a non-finite one), adding the good
        ones before it to the spike window."""
        factor, recent = self.spike_factor, self._recent
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                return i, ""
            if factor is not None:
                if len(recent) == self.spike_window:
                    median = statistics.median(recent)
                    if loss > factor * median:
                        return i, f"over {factor:g} x the median {median:.6g} of the last {len(recent)} losses"
                recent.append(loss)
        return None

    def state_dict(self) -> dict[str, Any] | None:
        if self.spike_factor is None:
            return None  # nothing of its own: checkpoints stay as they were
        return {"recent": list(self._recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent.clear()
        self._recent.extend(float(v) for v in state.get("recent", []))
