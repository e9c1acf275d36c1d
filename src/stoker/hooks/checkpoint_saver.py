"""``CheckpointSaverHook``: write checkpoints every N steps or seconds, and at the end."""

from __future__ import annotations

import time

from ..errors import ConfigError
from .base import Hook, LoopResult, RunContext, every_n_steps_due, next_due_step

# The longest stretch (in seconds at the measured step rate) between two clock reads of a
# time-based saver in one process: a save is late by at most about this if the rate drops.
CLOCK_READ_SECS = 5.0


class CheckpointSaverHook(Hook):
    """Save every ``save_steps`` steps (on their multiples: loops end there) or ``save_secs``
    seconds (at loop boundaries), and at the end."""

    phase = "saving"

    def __init__(self, save_steps: int | None = None, save_secs: float | None = None) -> None:
        if (save_steps is None) == (save_secs is None):
            raise ConfigError("CheckpointSaverHook: give exactly one of save_steps and save_secs")
        self.save_steps = save_steps
        self.save_secs = save_secs
        self._last_step = 0
        self._last_time = 0.0
        self._alone = True
        self._clock_mark = (0, 0.0)  # (step, time) the clock read's step rate is measured from

    def after_setup(self, run: RunContext) -> None:
        self._alone = run.world_size == 1
        self._mark(run.global_step)

    def _mark(self, step: int) -> None:
        self._last_step = step
        self._last_time = time.monotonic()
        if self.save_steps is not None:
            self.due_step = next_due_step(step, self.save_steps)
        else:
            self.due_step = None  # the clock is read after the next loop
            self._clock_mark = (step, self._last_time)

    def scheduled_after(self, step: int) -> int | None:
        return None if self.save_steps is None else next_due_step(step, self.save_steps)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.save_steps is not None:
            due = every_n_steps_due(self._last_step, run.global_step, self.save_steps)
        else:  # clocks differ between replicas: save when any replica's interval is up
            now = time.monotonic()
            due = run.any_replica(now - self._last_time >= (self.save_secs or 0.0))
            if not due and self._alone:
                self._next_clock_read(run.global_step, now)
        if due:
            self._save(run)

    def _next_clock_read(self, step: int, now: float) -> None:
        """Alone, read the clock again only after about half the steps the wall-clock step
        rate says are left (at most CLOCK_READ_SECS worth): with iterations_per_loop=1 a read
        per step is a measurable part of a small model's step. Replicas must agree on every
        loop's decision, so they read it after every loop."""
        mark_step, mark_time = self._clock_mark
        elapsed = now - mark_time
        if step <= mark_step or elapsed <= 0:
            return
        rate = (step - mark_step) / elapsed  # steps per wall second, host time included
        left = min(self._last_time + (self.save_secs or 0.0) - now, CLOCK_READ_SECS)
        self.due_step = step + max(1, int(left * rate / 2))

    def end(self, run: RunContext) -> None:
        self._save(run)

    def _save(self, run: RunContext) -> None:
        run.save_checkpoint()
        self._mark(run.global_step)
