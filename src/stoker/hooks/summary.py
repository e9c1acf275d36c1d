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
        self._losses: list[float] = []
        self._values: dict[str, list[float]] = {}

    def after_setup(self, run: RunContext) -> None:
        self._last_step = run.global_step
        out = self.output_dir or run.model_dir
        if run.is_chief and out is not None:
            self._writer = ScalarWriter(out, tensorboard=self.tensorboard)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._losses.extend(result.losses)
        for name, vals in result.values.items():
            self._values.setdefault(name, []).extend(vals)
        if not every_n_steps_due(self._last_step, run.global_step, self.every_n_steps):
            return
        self._flush(run)

    def end(self, run: RunContext) -> None:
        if self._losses:
            self._flush(run)
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _flush(self, run: RunContext) -> None:
        self._last_step = run.global_step
        if self._writer is None or not self._losses:
            return
        scalars = {"loss": sum(self._losses) / len(self._losses)}
        for name, vals in self._values.items():
            scalars[name] = vals[-1] if name == "learning_rate" else sum(vals) / len(vals)
        for key in ("steps_per_sec", "examples_per_sec", "input_wait_fraction"):
            if key in run.logs:
                scalars[key] = run.logs[key]
        self._writer.write(run.global_step, scalars)
        self._writer.flush()
        self._losses.clear()
        self._values.clear()
