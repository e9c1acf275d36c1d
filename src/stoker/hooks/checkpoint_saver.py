"""``CheckpointSaverHook``: write checkpoints every N steps or seconds, and at the end."""

from __future__ import annotations

import time

from .base import Hook, LoopResult, RunContext, every_n_steps_due, next_due_step


class CheckpointSaverHook(Hook):
    """Save every ``save_steps`` steps or ``save_secs`` seconds (at loop boundaries) and at the end."""

    priority = 30

    def __init__(self, save_steps: int | None = None, save_secs: float | None = None) -> None:
        if (save_steps is None) == (save_secs is None):
            raise ValueError("CheckpointSaverHook: give exactly one of save_steps and save_secs")
        self.save_steps = save_steps
        self.save_secs = save_secs
        self._last_step = 0
        self._last_time = 0.0

    def after_setup(self, run: RunContext) -> None:
        self._mark(run.global_step)

    def _mark(self, step: int) -> None:
        self._last_step = step
        self._last_time = time.monotonic()
        if self.save_steps is not None:  # a clock (save_secs) is read after every loop
            self.due_step = next_due_step(step, self.save_steps)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.save_steps is not None:
            due = every_n_steps_due(self._last_step, run.global_step, self.save_steps)
        else:  # clocks differ between replicas: save when any replica's interval is up
            due = run.any_replica(time.monotonic() - self._last_time >= (self.save_secs or 0.0))
        if due:
            self._save(run)

    def end(self, run: RunContext) -> None:
        self._save(run)

    def _save(self, run: RunContext) -> None:
        run.save_checkpoint()
        self._mark(run.global_step)
