"""``StopAtStepHook``: stop training at a given global step."""

from __future__ import annotations

from ..errors import ConfigError
from .base import Hook, LoopResult, RunContext


class StopAtStepHook(Hook):
    """Stop after ``num_steps`` more steps, or at global step ``last_step`` (give exactly one).

    The device loop is shortened so the run stops exactly at that step.
    """

    phase = "state"

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if (num_steps is None) == (last_step is None):
            raise ConfigError("StopAtStepHook: give exactly one of num_steps and last_step")
        value = num_steps if num_steps is not None else last_step
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"StopAtStepHook: steps must be a non-negative integer; got {value!r}")
        self.num_steps = num_steps
        self.last_step = last_step

    def after_setup(self, run: RunContext) -> None:
        if self.last_step is None:
            self.last_step = run.global_step + (self.num_steps or 0)
        run.max_steps = self.last_step if run.max_steps is None else min(run.max_steps, self.last_step)
        self.due_step = self.last_step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.last_step is not None and run.global_step >= self.last_step:
            run.request_stop()  # the planned end: nothing to report
