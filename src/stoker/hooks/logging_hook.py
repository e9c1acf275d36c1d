"""``LoggingHook``: the loss and named values every N steps, on the chief."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from .base import Hook, LoopResult, RunContext, every_n_steps_due

log = logging.getLogger("stoker")


class LoggingHook(Hook):
    """Log the mean loss (and ``host_call`` values) of the steps since the last line.

    With ``language_model=True`` the loss is taken as nats per token (character) and the line
    also shows perplexity ``exp(loss)`` and bits per character ``loss / ln 2``, as the
    Transformer-XL seed logs them. Throughput comes from a ``StepCounterHook`` if one runs.
    """

    priority = 40

    def __init__(
        self,
        every_n_steps: int = 100,
        names: Sequence[str] | None = None,
        language_model: bool = False,
        logger: logging.Logger | None = None,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.names = list(names) if names is not None else None
        self.language_model = language_model
        self.logger = logger or log
        self._last_step = 0
        # running sums, not lists: memory stays flat however long the interval
        self._loss_sum, self._loss_n = 0.0, 0
        self._values: dict[str, list[float]] = {}  # name -> [sum, count, last]
        self.last_line = ""

    def after_setup(self, run: RunContext) -> None:
        self._last_step = run.global_step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._loss_sum += sum(result.losses)
        self._loss_n += len(result.losses)
        for name, vals in result.values.items():
            if vals and (self.names is None or name in self.names):
                acc = self._values.setdefault(name, [0.0, 0, 0.0])
                acc[0] += sum(vals)
                acc[1] += len(vals)
                acc[2] = vals[-1]
        if every_n_steps_due(self._last_step, run.global_step, self.every_n_steps):
            self._log(run)

    def end(self, run: RunContext) -> None:
        if self._loss_n:  # the steps after the last interval boundary
            self._log(run)

    def _log(self, run: RunContext) -> None:
        if not self._loss_n:
            return
        loss = self._loss_sum / self._loss_n
        parts = [f"step {run.global_step}", f"loss = {loss:.4f}"]
        if self.language_model:
            parts.append(f"ppl = {math.exp(min(loss, 700.0)):.3f}")
            parts.append(f"bpc = {loss / math.log(2):.4f}")
        for name, (total, count, last) in self._values.items():
            parts.append(f"{name} = {last:.6g}" if name == "learning_rate" else f"{name} = {total / count:.4g}")
        if "steps_per_sec" in run.logs:
            parts.append(f"{run.logs['steps_per_sec']:.1f} steps/sec")
            parts.append(f"{run.logs['examples_per_sec']:.1f} examples/sec")
            parts.append(f"input wait {100 * run.logs['input_wait_fraction']:.0f}%")
        self.last_line = ", ".join(parts)
        if run.is_chief:
            self.logger.info(self.last_line)
        self._last_step = run.global_step
        self._loss_sum, self._loss_n = 0.0, 0
        self._values.clear()
