"""``NanLossHook``: stop on a non-finite loss, keeping the last good checkpoint."""

from __future__ import annotations

import math
import sys

from ..errors import NanLossError
from .base import Hook, LoopResult, RunContext


class NanLossHook(Hook):
    """Raise ``NanLossError`` naming the first step whose loss is NaN or infinite.

    It runs before any checkpoint is written at that loop boundary, and the Estimator writes
    no checkpoint after an error, so the newest checkpoint on disk is the last good one.
    """

    priority = 10

    def after_setup(self, run: RunContext) -> None:
        # Called only after a loop with a non-finite loss: run.totals sees every loss first.
        self.due_step = sys.maxsize
        run.totals.on_nonfinite_loss.append(self._wake)

    def _wake(self) -> None:
        self.due_step = None

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if math.isfinite(sum(result.losses)):  # the sum is finite only if every loss is
            return
        for i, loss in enumerate(result.losses):
            if not math.isfinite(loss):
                step = result.first_step + i + 1
                raise NanLossError(step, loss, str(run.last_checkpoint) if run.last_checkpoint else None)
