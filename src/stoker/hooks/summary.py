"""``SummaryHook``: training scalars to TensorBoard and ``metrics.csv`` every N steps."""

from __future__ import annotations

from ..summary import ScalarWriter
from .base import Hook, LoopResult, RunContext, every_n_steps_due


class SummaryHook(Hook):
    """Write the mean loss, ``host_call`` values and throughput every ``every_n_steps`` steps.

    Files go to ``output_dir`` (default ``model_dir``): ``events/`` for TensorBoard and
    ``metrics.csv`` with one ``step,wall_time,tag,value`` row per value. Only the chief writes.
    """

    priority = 45

    def __init__(self, every_n_steps: int = 100, output_dir: str | None = None, tensorboard: bool = True) -> None:
        self.every_n_steps = every_n_steps
        self.output_dir = output_dir
        self.tensorboard = tensorboard
        self._writer: ScalarWriter | None = None
        self._last_step = 0
        self._loss_sum, self._loss_n = 0.0, 0
        self._values: dict[str, list[float]] = {}  # name -> [sum, count, last]

    def after_setup(self, run: RunContext) -> None:
        self._last_step = run.global_step
        out = self.output_dir or run.model_dir
        if run.is_chief and out is not None:
            self._writer = ScalarWriter(out, tensorboard=self.tensorboard)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._loss_sum += sum(result.losses)
        self._loss_n += len(result.losses)
        for name, vals in result.values.items():
            if vals:
                acc = self._values.setdefault(name, [0.0, 0, 0.0])
                acc[0] += sum(vals)
                acc[1] += len(vals)
                acc[2] = vals[-1]
        if not every_n_steps_due(self._last_step, run.global_step, self.every_n_steps):
            return
        self._flush(run)

    def end(self, run: RunContext) -> None:
        if self._loss_n:
            self._flush(run)
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _flush(self, run: RunContext) -> None:
        self._last_step = run.global_step
        if self._writer is None or not self._loss_n:
            return
        scalars = {"loss": self._loss_sum / self._loss_n}
        for name, (total, count, last) in self._values.items():
            scalars[name] = last if name == "learning_rate" else total / count
        for key in ("steps_per_sec", "examples_per_sec", "input_wait_fraction"):
            if key in run.logs:
                scalars[key] = run.logs[key]
        self._writer.write(run.global_step, scalars)
        self._writer.flush()
        self._loss_sum, self._loss_n = 0.0, 0
        self._values.clear()
