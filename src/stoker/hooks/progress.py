"""``ProgressBarHook``: how far training got, as a tqdm bar on a terminal and as a periodic log
line everywhere else (a Slurm log, a Kubernetes pod, a file).

On a terminal the bar is redrawn after every loop. Without one a redrawn bar is noise in a log
file, so the hook writes a line instead, every ``every_secs`` seconds (30 by default): step, rate,
ETA, and the epoch when the data's length is known. The line is written at a loop boundary that
comes anyway: the hook never ends a loop (``Hook.ends_loops``), reads the clock only about as
often as the step rate says a line could be due, and touches nothing the run computes.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from .base import Hook, LoopResult, RunContext

log = logging.getLogger("stoker")

#: The longest stretch (in seconds at the measured step rate) between two clock reads in the line mode.
CLOCK_READ_SECS = 5.0


class ProgressBarHook(Hook):
    """A progress bar over ``max_steps`` updated once per loop when stderr is a terminal (or
    ``force=True``); otherwise a log line every ``every_secs`` seconds, at loop boundaries:

    ``progress: step 1200/10000 (12%), epoch 2.41, 45.2 steps/sec, ETA 3m15s``

    The rate is of the wall time since the previous line (host work included, as the ETA needs);
    the epoch is how many epochs of its data the run has read (``run.epochs_read()``, for sources
    that know their length); the ETA needs ``max_steps``. ``every_secs=None``: no lines. Only the
    chief shows either.
    """

    phase = "display"

    def __init__(self, force: bool = False, every_secs: float | None = 30.0) -> None:
        self.force = force
        self.every_secs = every_secs
        # The bar is redrawn after every loop; the lines only watch: written at the loops'
        # boundaries, they never make one (the loops stay as without the hook).
        self.ends_loops = self._shows_bar = force or self.would_show()
        self._bar: Any = None
        self._lines = False
        self._line = (0, 0.0)  # (step, time) of the last line, or of the start
        self._clock = time.monotonic

    @staticmethod
    def would_show() -> bool:
        """Whether a bar (not forced) would show: stderr is a terminal; without one, lines instead."""
        return sys.stderr.isatty()

    def after_setup(self, run: RunContext) -> None:
        self._lines = False
        self.due_step = None
        if not run.is_chief:
            self.due_step = sys.maxsize  # nothing to show: never called
        elif self._shows_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=run.max_steps, initial=run.global_step, unit="step", dynamic_ncols=True, leave=False)
        elif self.every_secs is not None:
            self._lines = True
            self._line = (run.global_step, self._clock())
            self.due_step = run.global_step + 1  # the first boundary measures the step rate
        else:
            self.due_step = sys.maxsize

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self._lines:
            self._after_loop_lines(run)
            return
        if self._bar is None:
            return
        self._bar.update(result.steps)
        if result.losses:
            self._bar.set_postfix(loss=f"{result.losses[-1]:.4f}", refresh=False)

    def _after_loop_lines(self, run: RunContext) -> None:
        now, step = self._clock(), run.global_step
        last_step, last_time = self._line
        elapsed = now - last_time
        rate = (step - last_step) / elapsed if elapsed > 0 else 0.0
        every = self.every_secs or 0.0
        if elapsed >= every and step > last_step:
            log.info("progress: %s", progress_line(step, run.max_steps, rate, run.epochs_read()))
            self._line, left = (step, now), every
        else:
            left = every - elapsed
        # Read the clock again after about half the steps the rate says are left until the next
        # line (at most CLOCK_READ_SECS worth): with iterations_per_loop=1 a read per step counts.
        self.due_step = step + max(1, int(min(left, CLOCK_READ_SECS) * rate / 2))

    def end(self, run: RunContext) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def progress_line(step: int, max_steps: int | None, rate: float, epochs: float | None) -> str:
    """``step 1200/10000 (12%), epoch 2.41, 45.2 steps/sec, ETA 3m15s`` (the parts that are known)."""
    parts = [f"step {step}" if max_steps is None else f"step {step}/{max_steps} ({100 * step / max_steps:.0f}%)"]
    if epochs is not None:
        parts.append(f"epoch {epochs:.2f}")
    parts.append(f"{rate:.3g} steps/sec")
    if max_steps is not None and rate > 0:
        parts.append(f"ETA {duration(max(0, max_steps - step) / rate)}")
    return ", ".join(parts)


def duration(seconds: float) -> str:
    """``42s``, ``3m15s``, ``2h05m``: seconds said at the precision an ETA deserves."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


__all__ = ["CLOCK_READ_SECS", "ProgressBarHook", "duration", "progress_line"]
