"""``LoggingHook``: the loss and named values every N steps, on the chief."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from .base import IntervalHook, LoopResult, RunContext

log = logging.getLogger("stoker")


class LoggingHook(IntervalHook):
    """Log the mean loss (and ``host_call`` values) of the steps since the last line, how many
    epochs of its data the run has read (``epoch 2.41``) when the source knows its length, and a
    mixture's realised proportions (``mix/web = 0.7012``, :func:`stoker.data.mix`).

    With ``language_model=True`` the loss is taken as nats per token (character) and the line
    also shows perplexity ``exp(loss)`` and bits per character ``loss / ln 2``, as the
    Transformer-XL seed logs them. Throughput comes from a ``StepCounterHook`` if one runs.
    """

    phase = "reporting"  # after the step counter, whose rates it shows

    def __init__(
        self,
        every_n_steps: int = 100,
        names: Sequence[str] | None = None,
        language_model: bool = False,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__(every_n_steps)
        self.names = list(names) if names is not None else None
        self.language_model = language_model
        self.logger = logger or log
        self._pending: tuple[int, float, dict[str, float], float | None, tuple[float, float, float] | None] | None = (
            None
        )
        self._line: str | None = ""

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._log(run)  # called only once due_step is reached

    def end(self, run: RunContext) -> None:
        if self._has_steps_since(run):  # the steps after the last interval boundary
            self._log(run)

    def _log(self, run: RunContext) -> None:
        interval = self._interval(run)
        self._restart(run)
        if not interval.loss_n:
            return
        logs = run.logs
        rates = (
            (logs["steps_per_sec"], logs["examples_per_sec"], logs["input_wait_fraction"])
            if "steps_per_sec" in logs
            else None
        )
        # host_call values, then what the input reports (a mixture's mix/<name> proportions)
        values, epochs = {**interval.means(self.names), **run.input_scalars()}, run.epochs_read()
        self._pending = (run.global_step, interval.loss_sum / interval.loss_n, values, epochs, rates)
        self._line = None
        if run.is_chief and self.logger.isEnabledFor(logging.INFO):
            self.logger.info(self.last_line)

    @property
    def last_line(self) -> str:
        """The last line logged (formatted when read, if the logger did not need it)."""
        if self._line is None:
            self._line = self._format(*self._pending) if self._pending is not None else ""
        return self._line

    def _format(
        self,
        step: int,
        loss: float,
        values: dict[str, float],
        epochs: float | None,
        rates: tuple[float, float, float] | None,
    ) -> str:
        parts = [f"step {step}", f"loss = {loss:.4f}"]
        if self.language_model:
            parts.append(f"ppl = {math.exp(min(loss, 700.0)):.3f}")
            parts.append(f"bpc = {loss / math.log(2):.4f}")
        for name, value in values.items():
            parts.append(f"{name} = {value:.6g}" if name == "learning_rate" else f"{name} = {value:.4g}")
        if epochs is not None:  # the epochs of its data read (a source that knows its length)
            parts.append(f"epoch {epochs:.2f}")
        if rates is not None:
            parts.append(f"{rates[0]:.1f} steps/sec")
            parts.append(f"{rates[1]:.1f} examples/sec")
            parts.append(f"input wait {100 * rates[2]:.0f}%")
        return ", ".join(parts)
