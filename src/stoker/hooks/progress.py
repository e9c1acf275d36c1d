"""``ProgressBarHook``: a tqdm bar of global steps, shown only on a terminal."""

from __future__ import annotations

import sys
from typing import Any

from .base import Hook, LoopResult, RunContext


class ProgressBarHook(Hook):
    """A progress bar over ``max_steps`` updated once per loop; off when stderr is not a TTY."""

    phase = "display"

    def __init__(self, force: bool = False) -> None:
        self.force = force
        self._bar: Any = None

    @staticmethod
    def would_show() -> bool:
        """Whether a default (not forced) bar would show: stderr is a terminal. The default hooks
        leave the hook out otherwise, since with iterations_per_loop=1 every call counts."""
        return sys.stderr.isatty()

    def after_setup(self, run: RunContext) -> None:
        if not run.is_chief or not (self.force or self.would_show()):
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(total=run.max_steps, initial=run.global_step, unit="step", dynamic_ncols=True, leave=False)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self._bar is None:
            return
        self._bar.update(result.steps)
        if result.losses:
            self._bar.set_postfix(loss=f"{result.losses[-1]:.4f}", refresh=False)

    def end(self, run: RunContext) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
