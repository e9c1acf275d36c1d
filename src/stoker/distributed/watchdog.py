"""Naming a stuck replica: where each replica is, and a watchdog that reads the others' places.

A replica that dies stops its heartbeat and is named by ``ProcessGroupStrategy``. A replica
that is alive but stuck (a hang in ``model_fn``, a hook, an input read) keeps beating, and the
others would wait in their next collective for ``distributed_timeout`` (30 min by default).

So each replica keeps its :class:`Progress`: the global step it runs, the phase it is in, and
how many collectives it has entered. The training thread updates it with plain attribute
stores; the heartbeat thread publishes it to the process group's store once a second. Every
replica calls the same collectives in the same order, so a replica that has waited in its
collective number ``n`` for longer than :meth:`StuckReplica.limit` (``factor`` x its median step
time, at least ``min_seconds``) knows the replicas that have entered fewer than ``n`` are the
ones missing, and where they were last seen. It logs that and ends its process with exit
status 1 (a thread cannot interrupt a collective blocked in C++; the newest complete
checkpoint is on disk, as after a kill -9).

**Every replica stops at once.** Before it exits, the replica that named the stuck one puts its
message in the store (:data:`STUCK_KEY`) and waits a moment (:data:`ANNOUNCE_WAIT`) for the
others to see it. Every other replica's heartbeat thread reads that key once a second and ends
its process too, with the same status: the stuck one (whose training thread may never come back
to Python, so no signal handler of its own could end it cleanly) and any other waiting in the
collective. A launcher then finds every process gone within seconds; torchrun no longer waits
its 30 s before killing the stuck one. A replica stuck in C code that holds the GIL cannot run
its heartbeat either; only the launcher's kill ends it.

Only a replica last seen inside a training step (its input, ``model_fn``, backward, update) is
named. The work between loops (the outfeed, hooks, evaluations, summaries, checkpoint writes:
the chief writes while the others wait at the barrier) is marked exempt and left to
``distributed_timeout``, since one replica may legitimately take longer there; so is
everything before a training run has timed ``MIN_STEP_SAMPLES`` loops (start-up, compilation,
the first steps) and everything outside ``train``.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("stoker")

#: Loops a replica must have timed before it accuses anyone (the first ones include start-up).
MIN_STEP_SAMPLES = 3
#: The phase after a device loop (outfeed, hooks, evaluations, checkpoints): exempt.
BETWEEN_LOOPS = "the work between loops (outfeed, hooks, evaluation)"
#: Exit status of every replica of a run that stops because a replica is stuck.
STUCK_EXIT_CODE = 1
#: The store key holding the message of the replica that named a stuck one (per torchrun restart:
#: an elastic agent's store outlives the workers it restarts).
STUCK_KEY = f"stoker/stuck/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
#: Seconds the naming replica waits for the others to see :data:`STUCK_KEY` before it exits (when it
#: hosts the store, the store goes with it): a little over two heartbeats.
ANNOUNCE_WAIT = 2.5


@dataclass(frozen=True, kw_only=True)
class StuckReplica:
    """When a replica counts as stuck: it has not reached a collective another replica has
    waited in for ``factor`` x that replica's median step time, and at least ``min_seconds``.

    ``RunConfig(stuck_replica=StuckReplica(...))``; ``None`` there waits ``distributed_timeout``.
    """

    factor: float = 20.0
    min_seconds: float = 20.0

    def __post_init__(self) -> None:
        for name in ("factor", "min_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"StuckReplica.{name} must be a number > 0; got {value!r}")

    def limit(self, median_step_seconds: float) -> float:
        """Seconds a replica waits in a collective before it names the missing ones."""
        return max(self.min_seconds, self.factor * median_step_seconds)


class Progress:
    """Where this replica is; written by the training thread, read by the heartbeat thread."""

    def __init__(self) -> None:
        self.step = 0
        self.phase = "starting"
        self.exempt = False
        self.since = time.time()  # when the phase (or the collective) began
        self.entered = 0  # collectives entered so far
        self.collective = ""  # the one it waits in now ("" when in none)
        self.step_seconds: deque[float] = deque(maxlen=64)
        self.watch: StuckReplica | None = None  # set while a training run is watched

    # ---------------------------------------------------------------- the training thread
    def mark(self, phase: str, step: int | None = None, exempt: bool = False) -> None:
        """Enter ``phase`` (of global step ``step``, if given)."""
        if step is not None:
            self.step = step
        self.phase, self.exempt, self.since = phase, exempt, time.time()

    def enter(self, collective: str) -> None:
        """A collective begins: one more entered, waited in from now."""
        self.entered += 1
        self.collective, self.since = collective, time.time()

    def leave(self) -> None:
        self.collective = ""

    def start_watch(self, watch: StuckReplica | None) -> None:
        """A training run begins (``None``: it is not watched); its first loops are timed afresh."""
        self.step_seconds.clear()
        self.watch = watch

    def loop_timed(self, seconds: float, steps: int) -> None:
        if steps:
            self.step_seconds.append(seconds / steps)

    # ---------------------------------------------------------------- the heartbeat thread
    def record(self) -> str:
        """What the store holds for this replica."""
        return "|".join(
            (
                str(self.entered),
                str(self.step),
                self.phase,
                self.collective,
                repr(self.since),
                "1" if self.exempt else "",
            )
        )

    def overdue(self, now: float) -> float | None:
        """The limit, if this replica has waited in a collective longer than it; else ``None``."""
        watch, samples = self.watch, self.step_seconds
        if watch is None or not self.collective or len(samples) < MIN_STEP_SAMPLES:
            return None
        limit = watch.limit(statistics.median(samples))
        return limit if now - self.since > limit else None


@dataclass(frozen=True)
class Seen:
    """A replica's published :class:`Progress`."""

    entered: int
    step: int
    phase: str
    collective: str
    since: float
    exempt: bool

    @classmethod
    def parse(cls, text: str) -> Seen:
        entered, step, phase, collective, since, exempt = text.split("|")
        return cls(int(entered), int(step), phase, collective, float(since), bool(exempt))


def missing_replicas(mine: Progress, others: dict[int, Seen]) -> dict[int, Seen]:
    """The replicas that have not entered the collective ``mine`` waits in (exempt ones left out)."""
    return {r: s for r, s in others.items() if s.entered < mine.entered and not s.exempt}


def stuck_message(
    me: str, mine: Progress, missing: dict[int, Seen], limit: float, name: Callable[[int], str], now: float
) -> str:
    """The error a waiting replica reports before it exits."""
    where = "; ".join(
        f"{name(r)} last seen at step {s.step}, in {s.collective or s.phase}, {now - s.since:.0f} s ago"
        for r, s in sorted(missing.items())
    )
    median = statistics.median(mine.step_seconds)
    return (
        f"stuck replica: {where}. {me} has waited {now - mine.since:.0f} s in {mine.collective} of step "
        f"{mine.step} (the limit: {limit:.0f} s, from a median step of {median:.3g} s; RunConfig.stuck_replica) "
        f"and stops with exit status {STUCK_EXIT_CODE}. Rerun the same command to resume from the last "
        "complete checkpoint"
    )


def check_and_exit(
    progress: Progress,
    read: Callable[[], dict[int, Any]],
    me: str,
    name: Callable[[int], str],
    announce: Callable[[str], None] | None = None,
) -> None:
    """The heartbeat thread's check: if this replica is overdue in a collective and some
    replicas have not entered it, name them, ``announce`` the message to every replica (they
    stop too: :func:`stop_as_named`) and end the process."""
    now = time.time()
    limit = progress.overdue(now)
    if limit is None:
        return
    missing = missing_replicas(progress, {r: Seen.parse(t) for r, t in read().items()})
    if not missing:
        return  # everyone is in it (a slow collective), or the missing ones are exempt
    message = stuck_message(me, progress, missing, limit, name, now)
    _report(message)
    if announce is not None:
        try:
            announce(message)
        except Exception as error:  # noqa: BLE001 - the store may be gone: exit all the same
            log.debug("announcing the stuck replica: %s", error)
    os._exit(STUCK_EXIT_CODE)


def stop_as_named(me: str, message: str) -> None:
    """End this process because another replica named a stuck one (``message``, which says who):
    every replica of the run stops within a heartbeat."""
    _report(
        f"{me} stops with exit status {STUCK_EXIT_CODE}: another replica named a stuck one ({message}). Rerun "
        "the same command to resume from the last complete checkpoint"
    )
    os._exit(STUCK_EXIT_CODE)


def _report(message: str) -> None:
    """Log ``message`` as an error and make sure it reaches the job's log before the process ends."""
    if log.hasHandlers():
        log.error("%s", message)
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
    else:  # nobody configured logging: the message must still reach the job's log
        print(message, file=sys.stderr, flush=True)


__all__ = [
    "ANNOUNCE_WAIT",
    "MIN_STEP_SAMPLES",
    "STUCK_EXIT_CODE",
    "STUCK_KEY",
    "Progress",
    "Seen",
    "StuckReplica",
    "missing_replicas",
    "stop_as_named",
    "stuck_message",
]
