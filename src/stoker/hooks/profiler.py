"""``ProfilerHook``: a ``torch.profiler`` Chrome trace of a range of steps."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .base import Hook, LoopResult, RunContext

log = logging.getLogger("stoker")


class ProfilerHook(Hook):
    """Profile from the loop that reaches ``start_step`` for at least ``num_steps`` steps.

    Profiling starts and stops at loop boundaries. The trace is written to ``trace_file``
    (default ``model_dir/profile/trace-<first step>.json``) and opens in ``chrome://tracing`` or
    Perfetto.
    """

    phase = "display"

    def __init__(
        self, start_step: int = 10, num_steps: int = 10, trace_file: str | os.PathLike[str] | None = None
    ) -> None:
        if start_step < 0 or num_steps < 1:
            raise ConfigError(
                f"ProfilerHook: start_step must be >= 0 and num_steps >= 1; got {start_step}, {num_steps}"
            )
        self.start_step = start_step
        self.num_steps = num_steps
        self.trace_file = trace_file
        self._prof: Any = None
        self._first = 0
        self.written: Path | None = None

    def before_loop(self, run: RunContext, steps: int) -> None:
        if self._prof is None and self.written is None and run.global_step + steps > self.start_step:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities, record_shapes=True)
            self._prof.__enter__()
            self._first = run.global_step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self._prof is not None and run.global_step - self._first >= self.num_steps:
            self._finish(run)

    def end(self, run: RunContext) -> None:
        if self._prof is not None:
            self._finish(run)

    def close(self) -> None:
        if self._prof is not None:  # training failed mid-profile: stop profiling, write nothing
            self._prof.__exit__(None, None, None)
            self._prof = None

    def _finish(self, run: RunContext) -> None:
        self._prof.__exit__(None, None, None)
        if self.trace_file is not None:
            path = Path(self.trace_file)
        else:
            base = Path(run.model_dir) if run.model_dir else Path(".")
            path = base / "profile" / f"trace-{self._first}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        if run.is_chief:
            self._prof.export_chrome_trace(str(path))
            log.info("profile of steps %d-%d written to %s", self._first + 1, run.global_step, path)
        self.written = path
        self._prof = None
