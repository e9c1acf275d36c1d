"""``PreemptionHook``: on SIGTERM / SIGINT finish the current step, checkpoint, exit cleanly."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

from .base import Hook, LoopResult, RunContext

log = logging.getLogger("stoker")


class PreemptionHook(Hook):
    """Turn a termination signal into a clean stop with a checkpoint.

    On the first SIGTERM or SIGINT the device loop stops after the step it is running (with
    several replicas: at the end of the loop, so that all replicas stop at the same step), a
    checkpoint of that step is written, the remaining hooks' ``end`` run, and then (with
    ``exit_process=True``) the process exits with code 128 + signal number, the convention
    schedulers such as SLURM read as "terminated by signal"; with several replicas, every one
    says and exits with the first of ``signals`` that any replica received. The stop is an
    interruption (``run.interrupt``), not the run's end: no final evaluation, no partial
    report, so the rerun of the same command ends bitwise as an uninterrupted run would.

    The first signal puts back the handlers that were there before for every one of
    ``signals``: a second signal of any of them goes to those (by default SIGTERM ends the
    process at once, SIGINT raises ``KeyboardInterrupt``), so a double Ctrl-C still stops at
    once, and the rerun resumes from the newest complete checkpoint, as after a kill -9.
    """

    phase = "signals"  # last: every other hook has acted on the step its checkpoint is of

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT), exit_process: bool = True) -> None:
        self.signals = signals
        self.exit_process = exit_process
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._run: RunContext | None = None

    def begin(self, run: RunContext) -> None:
        self.due_step = None
        if run.interrupted:
            return  # interrupted before a NaN rollback: this attempt stops at once, a second signal is the default's
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        self._run = run
        if run.world_size == 1:  # alone, nothing to agree on each loop: wait for the signal itself
            self.due_step = sys.maxsize
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        self.due_step = None  # after_loop runs at the end of this loop
        for sig, previous in self._previous.items():  # a second signal: what was there before
            signal.signal(sig, previous)
        if self._run is not None:
            self._run.interrupt(f"received {signal.Signals(signum).name}")

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        # Signals reach replicas at slightly different times: act when any replica has one.
        if run.any_replica(self.received is not None):
            if run.world_size > 1:
                # Every replica says and exits with the same signal, the first of `signals` that
                # any replica received (these collectives run on the stop path only).
                self.received = next(s for s in self.signals if run.any_replica(self.received == s))
            name = signal.Signals(self.received or signal.SIGTERM).name
            run.interrupt(f"received {name}")
            path = run.save_checkpoint(stop=True)  # serves the resume: not kept once a newer one exists
            log.warning(
                "%s at step %d: checkpoint %s written; rerun the same command to resume",
                name,
                run.global_step,
                path or "(no model_dir: nothing saved)",
            )

    def end(self, run: RunContext) -> None:
        if self.received is not None and self.exit_process:
            run.exit_code = 128 + self.received  # the Estimator exits after every hook has ended

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._run = None
