"""``SummaryHook``: training scalars to TensorBoard and ``metrics.csv`` every N steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..summary.writer import ScalarWriter
from .base import IntervalHook, LoopResult, RunContext

if TYPE_CHECKING:
    from ..storage import Location


class SummaryHook(IntervalHook):
    """Write the mean loss, ``host_call`` values and throughput every ``every_n_steps`` steps.

    Files go to ``output_dir`` (default ``model_dir``): ``events/`` for TensorBoard and
    ``metrics.csv`` with one ``step,wall_time,tag,value`` row per value. Only the chief writes.
    """

    phase = "reporting"  # after the evaluations and the step counter, whose values it writes

    def __init__(self, every_n_steps: int = 100, output_dir: str | None = None, tensorboard: bool = True) -> None:
        super().__init__(every_n_steps)
        self.output_dir = output_dir
        self.tensorboard = tensorboard
        self._writer: ScalarWriter | None = None

    def after_setup(self, run: RunContext) -> None:
        super().after_setup(run)
        out = self.output_dir or run.model_dir
        if run.is_chief and out is not None:
            self._writer = ScalarWriter(out, tensorboard=self.tensorboard)
            # Rows queued before a checkpoint reach the files with it, also at a checkpoint this
            # hook is not due at: a run resumed from it after a kill -9 never writes them again.
            run.on_checkpoint.append(self._checkpointed)

    def _checkpointed(self, path: Location) -> None:
        if self._writer is not None:
            self._writer.flush()

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._flush(run)  # called only once due_step is reached

    def end(self, run: RunContext) -> None:
        if self._has_steps_since(run) and not run.interrupted:  # interrupted: no row a rerun would not write
            self._flush(run)
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _flush(self, run: RunContext) -> None:
        interval = self._interval(run)
        self._restart(run)
        if self._writer is None or not interval.loss_n:
            return
        scalars = {"loss": interval.loss_sum / interval.loss_n, **interval.means()}
        for key in ("steps_per_sec", "examples_per_sec", "input_wait_fraction", "bad_examples_skipped", "rollbacks"):
            if key in run.logs:
                scalars[key] = run.logs[key]
        scalars.update(run.input_scalars())  # a mixture's realised proportions (mix/<name>)
        self._writer.write(run.global_step, scalars)
        # Every flush_secs; and when a checkpoint was written at this very step: the saver runs
        # before this hook, so _checkpointed flushed the rows before this one, and a run
        # resumed from that checkpoint would never write this row again.
        self._writer.flush(force=run.last_checkpoint_step == run.global_step)
