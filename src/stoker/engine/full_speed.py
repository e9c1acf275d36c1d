"""Time to full speed: where a training run's time before its first full-speed step went (issue 49).

A restarted run pays for starting the process and importing, loading the checkpoint, starting
the input pipeline and compiling (from the checkpoint's compiled artifacts or afresh) before it
trains at full speed. ``FullSpeedClock`` times those phases and says them in one log line when
the first step that compiled nothing and was not the run's first has run, e.g.::

    time to full speed: 14.2 s, at step 102 (start-up and imports 4.1 s, checkpoint load 0.3 s,
    compiled artifacts 0.4 s, input pipeline 0.1 s, compile 9.2 s from artifacts, first steps 0.5 s;
    resumed from step 100)

The phases: start-up and imports (from the process's start to ``train``; ``/proc``, so Linux
only; said by the process's first run only: a later ``train`` in the same process, an AdaNet
iteration, an Optuna trial or a notebook cell, started nothing), checkpoint load (restoring the
state), compiled artifacts (reading, checking and installing the checkpoint's bundle:
``stoker.engine.compile_cache``), input pipeline (building the infeed and the steps' waits for
input), compile (the steps during which dynamo compiled a graph, less their waits for input),
first steps (the other steps before full speed).
``benchmarks/restart.py`` reads the line.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

log = logging.getLogger("stoker")

# Whether a clock of this process has counted the process's start already (only the first may).
_startup_counted = False


def process_age() -> float | None:
    """Seconds since this process started (``None`` where ``/proc`` does not say)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


def _compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (0 when it was never imported: an eager run)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["stats"]["unique_graphs"])


def _first_startup() -> float | None:
    """The process's age, for its first clock; ``None`` (not said) for every later one."""
    global _startup_counted
    if _startup_counted:
        return None
    _startup_counted = True
    return process_age()


class FullSpeedClock:
    """Times a training run's start-up phases and logs them once, at its first full-speed step."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = time.perf_counter()
        self.startup = _first_startup() if enabled else None
        names = ("checkpoint load", "compiled artifacts", "input pipeline", "compile", "first steps")
        self.seconds: dict[str, float] = dict.fromkeys(names, 0.0)
        self.compile_source = ""
        self.resumed_from: int | None = None
        self.done = not enabled
        self._last = self.started
        self._graphs = 0
        self._waited = 0.0
        self._steps = 0
        self._infeed: Any = None

    def restored(self, global_step: int, compile_source: str, artifacts_seconds: float = 0.0) -> None:
        """The state is restored (``global_step``: where the run resumes, 0 at a first start);
        ``compile_source``: how its compile starts (e.g. "from artifacts", "fresh"), after
        ``artifacts_seconds`` reading and installing the compiled artifacts."""
        now = time.perf_counter()
        self.seconds["checkpoint load"] += now - self._last - artifacts_seconds
        self.seconds["compiled artifacts"] = artifacts_seconds
        self.resumed_from = global_step or None
        self.compile_source = compile_source
        self._last = now

    def input_started(self, infeed: Any) -> None:
        """The infeed is built; its ``wait_seconds`` count as input pipeline from now on."""
        now = time.perf_counter()
        self.seconds["input pipeline"] += now - self._last
        self._infeed, self._waited, self._last = infeed, infeed.wait_seconds, now
        self._graphs = _compiled_graphs()

    def attach(self, loop: Any) -> None:
        """Time each step of ``loop`` (a ``DeviceLoop``) until full speed, then leave it."""
        if self.done:
            return
        inner = loop.after_step

        def after_step(step: int) -> None:
            if inner is not None:
                inner(step)
            if not self.done and self._step_done(step):
                loop.after_step = inner  # from the next loop on: no cost once at full speed

        loop.after_step = after_step

    def _step_done(self, step: int) -> bool:
        now = time.perf_counter()
        waited = self._infeed.wait_seconds - self._waited if self._infeed is not None else 0.0
        graphs = _compiled_graphs()
        compiled = graphs != self._graphs
        if self._steps >= 1 and not compiled:
            self.done = True
            self._say(step)
            return True
        self.seconds["input pipeline"] += waited
        self.seconds["compile" if compiled else "first steps"] += max(0.0, now - self._last - waited)
        self._steps += 1
        self._last, self._graphs = now, graphs
        self._waited += waited
        return False

    def finish(self, step: int) -> None:
        """The run ended at ``step``: say where its time went if it never reached full speed
        (a run of one or two steps), so every run says it once."""
        if not self.done:
            self.done = True
            log.info("%s", self.line(step, reached=False))

    def line(self, step: int, reached: bool = True) -> str:
        """The log line, at the run's first full-speed step ``step`` (``reached=False``: at its
        end, full speed not reached)."""
        total = self._last - self.started + (self.startup or 0.0)
        parts = [] if self.startup is None else [f"start-up and imports {self.startup:.1f} s"]
        for name, seconds in self.seconds.items():
            if name == "compiled artifacts" and not seconds:
                continue
            source = f" {self.compile_source}" if name == "compile" and self.compile_source else ""
            parts.append(f"{name} {seconds:.1f} s{source}")
        where = f"resumed from step {self.resumed_from}" if self.resumed_from is not None else "first start"
        at = f"at step {step}" if reached else f"not reached by the run's end at step {step}"
        return f"time to full speed: {total:.1f} s, {at} ({', '.join(parts)}; {where})"

    def _say(self, step: int) -> None:
        log.info("%s", self.line(step))


__all__ = ["FullSpeedClock", "process_age"]
