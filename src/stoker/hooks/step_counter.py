"""``StepCounterHook``: steps/sec, examples/sec and the input-bound fraction."""

from __future__ import annotations

import logging

from .base import IntervalHook, LoopResult, RunContext

log = logging.getLogger("stoker")


class StepCounterHook(IntervalHook):
    """Measure throughput over every ``every_n_steps`` steps and share it in ``run.logs``.

    ``examples/sec`` is the global batch times the steps over the wall time of the loops (host
    time between loops excluded), as TPUEstimator's ``ExamplesPerSecondHook``. ``input_wait``
    is the fraction of that time the device loop waited for data: near 0 means the input
    pipeline keeps up, near 1 means the run is input-bound.
    """

    phase = "measurement"  # its rates in run.logs are read by the hooks after it

    def __init__(self, every_n_steps: int = 100) -> None:
        super().__init__(every_n_steps)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        # called only once due_step is reached
        interval = self._interval(run)
        if interval.seconds <= 0:
            return  # nothing measurable yet: measure over a longer interval
        run.logs["steps_per_sec"] = interval.steps / interval.seconds
        run.logs["examples_per_sec"] = interval.steps * run.global_batch_size / interval.seconds
        run.logs["input_wait_fraction"] = interval.input_wait_seconds / interval.seconds
        self._restart(run)
