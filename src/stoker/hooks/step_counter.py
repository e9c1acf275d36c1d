"""``StepCounterHook``: steps/sec, examples/sec and the input-bound fraction."""

from __future__ import annotations

import logging

from .base import Hook, LoopResult, RunContext, every_n_steps_due

log = logging.getLogger("stoker")


class StepCounterHook(Hook):
    """Measure throughput over every ``every_n_steps`` steps and share it in ``run.logs``.

    ``examples/sec`` is the global batch times the steps over the wall time of the loops (host
    time between loops excluded), as TPUEstimator's ``ExamplesPerSecondHook``. ``input_wait``
    is the fraction of that time the device loop waited for data: near 0 means the input
    pipeline keeps up, near 1 means the run is input-bound.
    """

    priority = 20

    def __init__(self, every_n_steps: int = 100) -> None:
        self.every_n_steps = every_n_steps
        self._last_step = 0
        self._steps = 0
        self._seconds = 0.0
        self._wait = 0.0

    def after_setup(self, run: RunContext) -> None:
        self._last_step = run.global_step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._steps += result.steps
        self._seconds += result.seconds
        self._wait += result.input_wait_seconds
        if not every_n_steps_due(self._last_step, run.global_step, self.every_n_steps) or self._seconds <= 0:
            return
        run.logs["steps_per_sec"] = self._steps / self._seconds
        run.logs["examples_per_sec"] = self._steps * run.global_batch_size / self._seconds
        run.logs["input_wait_fraction"] = self._wait / self._seconds
        self._last_step = run.global_step
        self._steps, self._seconds, self._wait = 0, 0.0, 0.0
