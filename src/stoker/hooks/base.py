"""The ``Hook`` base class, what hooks see of a run, and the runner that calls them.

Hooks run on the host once per device loop (``RunConfig.iterations_per_loop`` steps), as in
TPUEstimator, never inside it. Every method is a no-op; the runner calls only the methods a
hook overrides. A hook asks training to stop by calling ``run.request_stop(reason)``, which
sets the flag ``run.stop_requested``; the device loop checks that flag after every step.

**The schedule is a property of the run, in global steps.** Loops end at multiples of
``iterations_per_loop`` and at every step a hook is scheduled at (``Hook.scheduled_after``),
counted from step 0, never from where a process started: a run resumed at any step, after any
stop, meets its hooks' actions at the very steps an uninterrupted run does. A stop from outside
(a signal: ``run.interrupt``) may end a loop at any step; hooks tell it from a planned end by
``run.interrupted`` and do nothing there that an uninterrupted run would not do.

**Hooks run by named phases** (:data:`PHASES`), not numbers: at every event, the hooks of one
phase run before those of the next. The order says what each hook may rely on: the NaN guard
before anything saves, the values of a checkpoint taken before it is written, the evaluation
written on its own checkpoint, decisions after the evaluation they act on, a signal's stop
last. Within a phase stoker's own hooks come first, then the others; each in the order given.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..config.slices import RunInfo
from ..errors import ConfigError, UserCodeError

if TYPE_CHECKING:
    import torch

    from ..config.changes import SettingChange
    from ..storage import Location

log = logging.getLogger("stoker")

Phase = Literal[
    "timing",
    "state",
    "measurement",
    "recording",
    "saving",
    "evaluation",
    "decisions",
    "reporting",
    "display",
    "signals",
]
#: The phases of a loop boundary, in the order their hooks run (docs/hooks.md has the table):
#:
#: - ``timing``: the loop's own time is read before any other hook works (the bench's step timer);
#: - ``state``: the run's stop step and a sound state before anything reads or saves it
#:   (``StopAtStepHook``, ``NanLossHook``);
#: - ``measurement``: rates for the hooks after it (``StepCounterHook`` fills ``run.logs``);
#: - ``recording``: what the checkpoint of the boundary must hold (checks of training values,
#:   the trackers' points);
#: - ``saving``: ``CheckpointSaverHook``;
#: - ``evaluation``: ``EvaluationHook``, on the checkpoint just written;
#: - ``decisions``: what acts on that evaluation (early stopping, LR on plateau, pruning);
#: - ``reporting``: log lines and summaries; a hook's phase unless it says another;
#: - ``display``: the progress bar and the profiler;
#: - ``signals``: stops from outside the run (a signal, a watching evaluator's stop file), last.
PHASES: tuple[Phase, ...] = get_args(Phase)


@dataclass(slots=True)
class LoopResult:
    """What one device loop did, read on the host once at its end.

    Attributes:
        first_step: global step before the loop.
        steps: optimizer steps run (fewer than planned if a stop was requested mid-loop).
        global_step: global step after the loop.
        losses: each step's loss.
        values: each step's ``host_call`` values, by name (plus ``learning_rate``).
        seconds: wall time of the loop.
        input_wait_seconds: time the loop waited for the infeed.
        examples: examples processed by all replicas (global batch x steps).
    """

    first_step: int
    steps: int
    global_step: int
    losses: list[float]
    values: dict[str, list[float]]
    seconds: float
    input_wait_seconds: float
    examples: int


@dataclass(eq=False)
class RunContext:
    """The part of a running ``train`` call that hooks read and act on.

    ``info`` is what hooks read of the run's configuration (``model_dir``, ``seed``,
    ``log_every_n_steps``, the precision's name): a read-only ``RunInfo``, never the whole
    ``RunConfig``.
    """

    info: RunInfo
    params: dict[str, Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    global_step: int
    max_steps: int | None
    global_batch_size: int
    is_chief: bool = True
    # Processes training together (replicas x pipeline stages); 1 when alone.
    world_size: int = 1
    stop_requested: bool = False
    stop_reason: str = ""
    # Stops asked from outside the run (a signal) and planned ones (max_steps, the data's end,
    # a hook's rule) so far: together they say whether the run is ``interrupted``.
    _interrupts: bool = False
    _final: bool = False
    last_checkpoint: Location | None = None  # a UrlPath when model_dir is an fsspec URL
    last_checkpoint_step: int | None = None
    # Rollbacks this run took so far (NanLossHook(on_nan="rollback")), resumes included.
    rollbacks: int = 0
    # Set by a hook that wants the process to exit once training has shut down cleanly.
    exit_code: int | None = None
    # Values hooks share within one loop boundary (e.g. rates from the step counter).
    logs: dict[str, float] = field(default_factory=dict)
    # The newest evaluation of this run (its ``global_step`` included), as handed to the hooks'
    # ``after_evaluation`` (add_evaluation); ``None`` before the first.
    last_evaluation: dict[str, float] | None = None
    # Settings that differ from those of the checkpoint this run resumed from, and what happened
    # to each (stoker.config.changes); trackers record them. Empty on a fresh run.
    changed_settings: Sequence[SettingChange] = ()
    # Sums over the loops so far (updated before the hooks run at each loop boundary).
    totals: RunTotals = field(default_factory=lambda: RunTotals())
    # Called with the path after each checkpoint save_checkpoint writes (e.g. SummaryHook
    # flushes its queued rows, so a resume from that checkpoint lacks none before it).
    on_checkpoint: list[Callable[[Location], None]] = field(default_factory=list)
    _save: Callable[[bool], Location | None] | None = None
    _on_evaluation: Callable[[RunContext, dict[str, float]], None] | None = None
    _epochs: Callable[[], float | None] | None = None
    _input_scalars: Callable[[], dict[str, float]] | None = None
    _any_replica: Callable[[bool], bool] = bool

    @property
    def model_dir(self) -> str | None:
        """``info.model_dir``: where checkpoints go (``None``: a run kept in memory)."""
        return self.info.model_dir

    def request_stop(self, reason: str = "") -> None:
        """Ask training to stop after the current step: the run's planned end (``max_steps``,
        the data's end, a hook's rule such as early stopping)."""
        self.stop_requested = True
        self._final = True
        self.stop_reason = self.stop_reason or reason

    def interrupt(self, reason: str = "") -> None:
        """Stop after the current step because of something outside the run (a signal): the
        run is not over, a rerun continues it (``interrupted``)."""
        self.stop_requested = True
        self._interrupts = True
        self.stop_reason = self.stop_reason or reason

    @property
    def interrupted(self) -> bool:
        """Whether training stops only because it was interrupted (``interrupt``), not at its
        planned end. At such a stop hooks act as after a kill: no final evaluation, no report of
        a partial interval; their state, in the stop's checkpoint, carries on in the rerun."""
        return self._interrupts and not self._final

    def any_replica(self, flag: bool) -> bool:
        """``flag`` agreed across replicas (true if true anywhere).

        Hooks that decide from something local to a process (a clock, a signal) must pass the
        decision through this before acting collectively, e.g. saving a checkpoint; decisions
        from the global step or from reduced losses are already the same on every replica.
        """
        return self._any_replica(flag)

    def epochs_read(self) -> float | None:
        """How many epochs of its data the run has read (``2.41``: two and 41 % of the third),
        when the source knows its length (``stoker.data``'s sources); else ``None``."""
        return None if self._epochs is None else self._epochs()

    def input_scalars(self) -> dict[str, float]:
        """What the training input reports about the batches read so far, for the summaries:
        ``mix/<name>``, each source's realised proportion, for a ``stoker.data.mix``; else ``{}``."""
        return {} if self._input_scalars is None else self._input_scalars()

    def add_evaluation(self, metrics: dict[str, float]) -> None:
        """Hand every hook an evaluation made now: ``metrics`` (the loss and metrics, with the
        evaluated ``global_step``) becomes ``last_evaluation`` and each hook's
        ``after_evaluation(run, metrics)`` is called, in phase order. Called by the hook that
        evaluates (``EvaluationHook``), once per evaluated step (``Hook.after_evaluation``)."""
        self.last_evaluation = metrics
        if self._on_evaluation is not None:
            self._on_evaluation(self, metrics)

    def save_checkpoint(self, *, stop: bool = False) -> Location | None:
        """Write a checkpoint of the current step now (once per step; no-op without model_dir).

        ``stop``: the checkpoint is written because the run stops before its end (a signal,
        ``PreemptionHook``), off the save schedule: it only serves the resume, so retention does
        not count it among ``keep_checkpoint_max``'s newest and drops it once a newer one exists.
        A step already saved stays as it was.

        With several replicas this is collective: every replica must call it at the same step.
        """
        if self._save is None:
            return None
        if self.last_checkpoint_step == self.global_step and self.last_checkpoint is not None:
            return self.last_checkpoint
        path = self._save(stop)
        if path is not None:
            for fn in self.on_checkpoint:
                fn(path)
        return path


class Hook:
    """Base class of training hooks: override only what you need.

    Order of calls in one ``train``: ``begin``, ``after_setup`` (hook states restored from the
    checkpoint, ``run.global_step`` is the start step), then for each loop ``before_loop`` /
    ``after_loop``, ``end`` when training finishes normally (not after an exception), and
    ``close`` always, last. ``after_evaluation`` comes whenever an evaluation is made.

    ``due_step``: a hook that acts only every N steps may set it to the next step it acts at;
    its ``after_loop`` is then skipped until ``run.global_step`` reaches it (``None``, the
    default: after every loop). What the skipped loops did is summed in ``run.totals``.
    With ``iterations_per_loop=1`` this saves a call per hook per step.

    ``needs_evaluations``: a hook that acts on evaluations (``after_evaluation``) sets it, and
    ``Estimator.train`` refuses it unless a hook that makes them (``makes_evaluations``, such as
    ``train_and_evaluate``'s ``EvaluationHook``) runs too: without one it would never act.

    ``scheduled_after``: a hook that acts at fixed global steps (every N steps) says which, and
    loops end there, so it acts at exactly those steps, in a resumed run too.

    ``phase``: where the hook runs among the others at every event (:data:`PHASES`);
    ``"reporting"`` unless it says another.

    ``ends_loops``: whether the hook's ``due_step`` may end a loop. In one process the loops no
    hook watches run as one, up to the first ``due_step`` (a hook with ``due_step=None`` keeps
    every loop); a hook that only watches the run (the progress line) sets it ``False``: it is
    called at the first loop boundary at or past its ``due_step``, wherever loops end anyway.
    """

    phase: Phase = "reporting"
    due_step: int | None = None
    ends_loops: bool = True
    needs_evaluations: bool = False
    makes_evaluations: bool = False

    def begin(self, run: RunContext) -> None:
        """Training is about to start: the model and optimizer are built and restored, the
        hooks' own checkpointed state is not yet loaded, and the input is not yet built."""

    def after_setup(self, run: RunContext) -> None:
        """Model, optimizer and global step are restored; ``run.global_step`` is the start step."""

    def before_loop(self, run: RunContext, steps: int) -> None:
        """A device loop of ``steps`` steps is about to run."""

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        """A device loop has finished; its per-step values are in ``result``."""

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        """An evaluation was made: ``metrics`` holds its loss and metrics and the evaluated
        ``global_step`` (also in ``run.last_evaluation``; read it, do not change it).

        Called for each evaluated step once, when the evaluation is made, in phase order: in the
        ``evaluation`` phase of a loop boundary or of ``end`` (``train_and_evaluate``'s
        ``EvaluationHook``). A run resumed from the checkpoint of a step it evaluated gets that
        evaluation again, taken back from the index: that checkpoint was written before the
        evaluation, so no hook's state in it holds the evaluation. It comes during setup, from
        ``EvaluationHook``'s ``after_setup``: after every hook's ``load_state_dict``, and before
        the ``after_setup`` of the hooks in the phases after ``evaluation`` (yours by default).
        """

    def end(self, run: RunContext) -> None:
        """Training has finished normally (``run.interrupted``: stopped by a signal, to go on
        in a rerun)."""

    def scheduled_after(self, step: int) -> int | None:
        """The first global step after ``step`` at which this hook acts on a schedule of steps
        (``None``: it has none). The training loop ends a loop there, so the action falls on
        that step whatever ``iterations_per_loop`` is and wherever a process started: keep it
        a function of ``step`` and the hook's settings (every replica must agree on it)."""
        return None

    def close(self) -> None:
        """Release resources (signal handlers, files); called last, also after an error."""

    def state_dict(self) -> dict[str, Any] | None:
        """State to put in checkpoints (``None``: the hook has none)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    @property
    def state_key(self) -> str:
        """Name of this hook's entry in a checkpoint."""
        return type(self).__name__


_EVENTS = ("begin", "after_setup", "before_loop", "after_loop", "after_evaluation", "end", "close", "scheduled_after")


class HookRunner:
    """Calls hooks in order, skipping those that did not override an event."""

    def __init__(self, hooks: Iterable[Hook]) -> None:
        self.hooks: list[Hook] = list(hooks)
        for h in self.hooks:
            if not isinstance(h, Hook):
                raise UserCodeError(f"hooks must be stoker.hooks.Hook instances; got {type(h).__name__}")
        # Checkpoint keys: the hook's state_key, numbered when two hooks share one.
        self._keys: list[str] = []
        for h in self.hooks:
            key, n = h.state_key, 1
            while key in self._keys:
                n += 1
                key = f"{h.state_key}#{n}"
            self._keys.append(key)
        self._by_event: dict[str, list[Callable[..., Any]]] = {
            event: [getattr(h, event) for h in self.hooks if getattr(type(h), event) is not getattr(Hook, event)]
            for event in _EVENTS
        }

        # The per-loop events, kept as attributes: with iterations_per_loop=1 they run every step.
        self._before_loop = self._by_event["before_loop"]
        self._after_loop = [(h, h.after_loop) for h in self.hooks if type(h).after_loop is not Hook.after_loop]
        self._ending_loops = [h for h, _ in self._after_loop if h.ends_loops]
        self._scheduled: list[Callable[[int], int | None]] = [
            h.scheduled_after for h in self.hooks if type(h).scheduled_after is not Hook.scheduled_after
        ]

    def _call(self, event: str, *args: Any) -> None:
        for fn in self._by_event[event]:
            fn(*args)

    def has(self, event: str) -> bool:
        """Whether any hook overrides ``event``."""
        return bool(self._by_event[event])

    def first_due_step(self) -> int | None:
        """The first global step at which some hook's ``after_loop`` is due (``sys.maxsize`` if
        none is), or ``None`` when a hook wants to be called after every loop (hooks that end no
        loop, ``Hook.ends_loops``, left out)."""
        first = sys.maxsize
        for hook in self._ending_loops:
            due = hook.due_step
            if due is None:
                return None
            if due < first:
                first = due
        return first

    def next_scheduled_step(self, step: int) -> int:
        """The first step after ``step`` at which some hook is scheduled (``sys.maxsize``: none)."""
        first = sys.maxsize
        for fn in self._scheduled:
            due = fn(step)
            if due is not None and step < due < first:
                first = due
        return first

    def begin(self, run: RunContext) -> None:
        self._call("begin", run)

    def after_setup(self, run: RunContext) -> None:
        self._call("after_setup", run)

    def before_loop(self, run: RunContext, steps: int) -> None:
        for fn in self._before_loop:
            fn(run, steps)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        step = run.global_step
        for hook, fn in self._after_loop:
            due = hook.due_step
            if due is None or step >= due:
                fn(run, result)

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        self._call("after_evaluation", run, metrics)

    def end(self, run: RunContext) -> None:
        self._call("end", run)

    def close(self) -> None:
        """Close every hook, even if one of them fails (the first failure is logged)."""
        for fn in self._by_event["close"]:
            try:
                fn()
            except Exception:  # noqa: BLE001 - closing must reach every hook
                log.exception("closing hook %r failed", fn)

    def state_dict(self) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for key, h in zip(self._keys, self.hooks, strict=True):
            s = h.state_dict()
            if s is not None:
                states[key] = s
        return states

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for key, h in zip(self._keys, self.hooks, strict=True):
            if key in states:
                h.load_state_dict(states[key])


class RunTotals:
    """Sums over every loop of one ``train`` call so far: steps, time, losses, ``host_call``
    values. The training loop adds each loop's result once, before the hooks run; a hook that
    reports every N steps keeps a copy from its last report and reports the difference
    (:meth:`since`), so it needs no call in the loops between (``Hook.due_step``).

    Sums hold finite values only; NaN and infinities are counted apart (``bad``), so that one
    of them makes the interval it falls in NaN or infinite, as a sum over that interval would
    be, and not every interval after it (a running sum that took an inf cannot give it back).
    """

    __slots__ = ("steps", "seconds", "input_wait_seconds", "loss_sum", "loss_n", "values", "bad", "on_nonfinite_loss")

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.input_wait_seconds = 0.0
        self.loss_sum = 0.0
        self.loss_n = 0
        self.values: dict[str, list[float]] = {}  # name -> [sum, count, last]
        # name (None: the loss) -> [NaNs, +infs, -infs] left out of its sum; empty while all is finite
        self.bad: dict[str | None, list[int]] = {}
        #: Called when a loop adds a NaN or infinite loss (before the hooks of that loop run).
        self.on_nonfinite_loss: list[Callable[[], None]] = []

    def add(self, result: LoopResult) -> None:
        """Add one loop's result.

        Values are added one step at a time, in step order, so the sums are the same however
        the steps were cut into loops (a run stopped and resumed mid-interval sums bitwise as
        an uninterrupted one).
        """
        self.steps += result.steps
        self.seconds += result.seconds
        self.input_wait_seconds += result.input_wait_seconds
        losses = result.losses
        total = self.loss_sum
        for v in losses:
            total += v
        if total - total == 0.0:  # x - x: NaN unless x is finite
            self.loss_sum = total
        else:
            self.loss_sum = self._finite_sum(None, self.loss_sum, losses)
            for fn in self.on_nonfinite_loss:
                fn()
        self.loss_n += len(losses)
        values = self.values
        for name, vals in result.values.items():
            if vals:
                acc = values.get(name)
                if acc is None:
                    acc = values[name] = [0.0, 0, 0.0]
                total = acc[0]
                for v in vals:
                    total += v
                acc[0] = total if total - total == 0.0 else self._finite_sum(name, acc[0], vals)
                acc[1] += len(vals)
                acc[2] = vals[-1]

    def _finite_sum(self, name: str | None, total: float, vals: list[float]) -> float:
        """``total`` plus the finite ``vals``; the others are counted in ``bad[name]``."""
        counts = self.bad.setdefault(name, [0, 0, 0])
        for v in vals:
            if v - v == 0.0:
                total += v
            else:
                counts[0 if v != v else 1 if v > 0 else 2] += 1
        return total

    def copy(self) -> RunTotals:
        out = RunTotals()
        out.steps, out.seconds, out.input_wait_seconds = self.steps, self.seconds, self.input_wait_seconds
        out.loss_sum, out.loss_n = self.loss_sum, self.loss_n
        out.values = {name: list(acc) for name, acc in self.values.items()}
        out.bad = {name: list(counts) for name, counts in self.bad.items()}
        return out

    def since(self, earlier: RunTotals) -> RunTotals:
        """What was added after ``earlier`` (a copy taken before): the interval between them."""
        out = RunTotals()
        out.steps, out.seconds = self.steps - earlier.steps, self.seconds - earlier.seconds
        out.input_wait_seconds = self.input_wait_seconds - earlier.input_wait_seconds
        out.loss_sum, out.loss_n = self.loss_sum - earlier.loss_sum, self.loss_n - earlier.loss_n
        for name, (total, count, last) in self.values.items():
            before = earlier.values.get(name, (0.0, 0, 0.0))
            if count > before[1]:
                out.values[name] = [total - before[0], count - before[1], last]
        for name, counts in self.bad.items():  # rare: only once something was not finite
            before_counts = earlier.bad.get(name, (0, 0, 0))
            nan, pos, neg = (c - b for c, b in zip(counts, before_counts, strict=True))
            if nan or pos or neg:
                out.bad[name] = [nan, pos, neg]
                spoilt = math.nan if nan or (pos and neg) else math.inf if pos else -math.inf
                if name is None:
                    out.loss_sum = spoilt
                elif name in out.values:
                    out.values[name][0] = spoilt
        return out

    def means(self, names: Sequence[str] | None = None) -> dict[str, float]:
        """The mean of each value (``learning_rate``: its last value), those in ``names`` if given."""
        return {
            name: last if name == "learning_rate" else total / count
            for name, (total, count, last) in self.values.items()
            if count and (names is None or name in names)
        }


class IntervalHook(Hook):
    """A hook that acts every ``every_n_steps`` steps on what the loops since it last acted did.

    It reads that interval from ``run.totals`` (:meth:`_interval`) and restarts it when it acts
    (:meth:`_restart`), which also sets ``due_step`` to the next multiple of ``every_n_steps``:
    it is called only at the steps it acts at, not after every loop in between. Those multiples
    are its schedule (:meth:`scheduled_after`): loops end on them.
    """

    def __init__(self, every_n_steps: int) -> None:
        self.every_n_steps = every_n_steps
        self._since = RunTotals()  # run.totals when the interval began

    def after_setup(self, run: RunContext) -> None:
        self._restart(run)

    def scheduled_after(self, step: int) -> int:
        return next_due_step(step, self.every_n_steps)

    def _restart(self, run: RunContext) -> None:
        self._since = run.totals.copy()
        self.due_step = next_due_step(run.global_step, self.every_n_steps)

    def _interval(self, run: RunContext) -> RunTotals:
        return run.totals.since(self._since)

    def _has_steps_since(self, run: RunContext) -> bool:
        """Whether a loop has run since the interval began (at ``end``: steps not yet reported)."""
        return run.totals.loss_n > self._since.loss_n


def next_due_step(step: int, n: int) -> int:
    """The first step after ``step`` that is a multiple of ``n``: where ``every_n_steps_due``
    becomes true again after an action at ``step``."""
    return (step // n + 1) * n


def every_n_steps_due(last: int, step: int, n: int) -> bool:
    """Whether an every-``n``-steps action last done at ``last`` is due at ``step``.

    It fires at the first loop boundary at or past each multiple of ``n``: exactly at the
    multiple when the hook declares it (``Hook.scheduled_after``, so loops end there), else
    rounded up to a loop boundary.
    """
    return step // n > last // n


def check_evaluations(hooks: Sequence[Hook]) -> None:
    """A ``ConfigError`` naming ``train_and_evaluate`` when one of ``hooks`` needs evaluations
    (``Hook.needs_evaluations``) and none of them makes any."""
    if any(h.makes_evaluations for h in hooks):
        return
    needing = [h for h in hooks if h.needs_evaluations]
    if not needing:
        return
    names = list(dict.fromkeys(type(h).__name__ for h in needing))
    which, verb, it = (names[0], "acts", "it") if len(names) == 1 else (" and ".join(names), "act", "them")
    # EarlyStopping and ReduceLROnPlateau (a ``source`` of "eval") can watch a training value instead
    instead = " (or watch a training value: source='train')" if any(getattr(h, "source", None) for h in needing) else ""
    raise ConfigError(
        f"train: {which} {verb} on evaluations, which train() does not make: give {it} to "
        f"train_and_evaluate(train_input_fn, eval_input_fn, max_steps, eval_every_n_steps=N){instead}"
    )


def sorted_hooks(hooks: Sequence[Hook]) -> list[Hook]:
    """``hooks`` in the order they run: by ``phase`` (:data:`PHASES`), within a phase stoker's
    own hooks before the others, each in the order given. A ``ConfigError`` for an unknown phase."""
    rank = {phase: i for i, phase in enumerate(PHASES)}
    for h in hooks:
        if getattr(h, "phase", None) not in rank:
            raise ConfigError(
                f"hooks: {type(h).__name__}.phase must be one of {', '.join(PHASES)}; got {getattr(h, 'phase', None)!r}"
            )
    return sorted(hooks, key=lambda h: (rank[h.phase], not type(h).__module__.startswith("stoker.")))
