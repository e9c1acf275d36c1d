"""``TrainingRun``: one ``train`` call, from restoring the state to the last hook.

This is the top loop of stoker, kept short: restore, set up hooks and the infeed, then run
device loops (``loop.py`` steps, ``infeed.py`` iterates) with the hooks between them until a
hook or the data asks to stop. Whatever happens, the state a later ``train`` resumes from is
handed back to the ``ModelState``: global step, carried cache, input position, hook states.
A rollback (``NanLossHook(on_nan="rollback")`` raises ``RollbackRequest``) ends the attempt
like an error, restores the newest checkpoint as a resume would, records the bad step's input
batches in the input position and starts the next attempt with the same hooks; a signal the
undone loop had received stops that attempt at once, at the restored checkpoint.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ..checkpoint.io_config import CheckpointConfig
from ..config.slices import LoopConfig, RunInfo
from ..distributed.watchdog import BETWEEN_LOOPS
from ..errors import ConfigError, NanLossError
from ..hooks import (
    CheckpointSaverHook,
    Hook,
    HookRunner,
    LoggingHook,
    MLPerfLogHook,
    NanLossHook,
    PreemptionHook,
    ProgressBarHook,
    RollbackRequest,
    RunContext,
    StepCounterHook,
    StopAtStepHook,
    SummaryHook,
)
from ..hooks.base import sorted_hooks
from ..hooks.early_stopping import StopFileHook
from ..hooks.tracking import TrackerHook
from ..spec import ModeKeys
from ..storage import Location
from .full_speed import FullSpeedClock
from .infeed import Infeed, epochs_read, input_scalars, with_rollback
from .inputs import InputFn, InputPlan
from .loop import DeviceLoop, ModelFn, TrainStep
from .model_state import ModelState, compile_source
from .steps import make_train_step

log = logging.getLogger("stoker")

# The most steps run as one loop when no hook is due before (bounds how late an error that is
# read at loop boundaries, such as a NaN loss, is raised when nothing else is due for long).
MAX_MERGED_STEPS = 1000


def default_hooks(loop: LoopConfig, checkpointing: CheckpointConfig) -> list[Hook]:
    """The hooks every ``train`` runs, from the loop's and checkpointing's slices: NaN guard,
    logging, progress, and with a ``model_dir`` MLPerf logging (if asked), the checkpoint saver,
    preemption handling, the early-stop file and summaries."""
    hooks: list[Hook] = [NanLossHook()]
    if loop.log_every_n_steps is not None:
        hooks += [StepCounterHook(loop.log_every_n_steps), LoggingHook(loop.log_every_n_steps)]
    if loop.progress_bar:  # a bar on a terminal, else a line every 30 s
        hooks.append(ProgressBarHook())
    if checkpointing.model_dir and loop.mlperf_log:
        hooks.append(MLPerfLogHook())
    if checkpointing.model_dir:
        steps = checkpointing.save_checkpoints_steps
        save_secs = None if steps else checkpointing.save_checkpoints_secs
        hooks.append(CheckpointSaverHook(save_steps=steps, save_secs=save_secs))
        hooks.append(StopFileHook())  # early_stop.json: a watching evaluator's EarlyStopping
        hooks.append(PreemptionHook())
        if loop.summaries:
            hooks.append(SummaryHook(loop.log_every_n_steps or 100))
    return hooks


def train_hooks(defaults: Sequence[Hook], given: Sequence[Hook]) -> list[Hook]:
    """A ``train`` call's hooks: ``defaults`` less those of a class ``given`` has (a hook the caller
    passes replaces the default one of its class, e.g. ``LoggingHook(language_model=True)`` the
    plain one), then ``given``."""
    kinds = {type(h) for h in given}
    return [h for h in defaults if type(h) not in kinds] + list(given)


def quick_run_hooks(hooks: Sequence[Hook]) -> list[Hook]:
    """``hooks`` for ``RunConfig.fast_dev_run``, which writes nothing: trackers (MLflow, W&B) left
    out, as Lightning leaves out its loggers; said in one line."""
    trackers = [type(h).__name__ for h in hooks if isinstance(h, TrackerHook)]
    log.info(
        "fast_dev_run: a quick run of the code paths; model_dir is neither read nor written%s",
        f", {', '.join(trackers)} left out" if trackers else "",
    )
    return [h for h in hooks if not isinstance(h, TrackerHook)]


def check_train_arguments(steps: int | None, max_steps: int | None, max_epochs: int | None = None) -> None:
    """The rules for ``train(steps=..., max_steps=..., max_epochs=...)``: at most one, each a non-negative int."""
    given = [n for n, v in (("steps", steps), ("max_steps", max_steps), ("max_epochs", max_epochs)) if v is not None]
    if len(given) > 1:
        either = " or ".join(given) if len(given) == 2 else "one of steps, max_steps and max_epochs"
        raise ConfigError(f"train: give {either}, not {'both' if len(given) == 2 else 'all three'}")
    for name, value in (("steps", steps), ("max_steps", max_steps), ("max_epochs", max_epochs)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(f"train: {name} must be a non-negative integer; got {value!r}")


def train_end(
    inputs: InputPlan, input_fn: InputFn, steps: int | None, max_steps: int | None, max_epochs: int | None
) -> int | None:
    """A ``train`` call's arguments checked (:func:`check_train_arguments`, a train batch size) and
    its ``max_steps``: as given, or the step that ends epoch ``max_epochs`` of ``input_fn``'s train
    input (its length read once, :meth:`InputPlan.epoch_steps`). Without an optimizer,
    ``ModelState.build_for_training`` says what to pass."""
    check_train_arguments(steps, max_steps, max_epochs)
    if inputs.train_batch_size is None:
        raise ConfigError("train: the Estimator needs train_batch_size")
    return max_steps if max_epochs is None else max_epochs * inputs.epoch_steps(input_fn, "train(max_epochs=...)")


def evaluation_schedule(
    inputs: InputPlan,
    input_fn: InputFn,
    ends: tuple[int | None, int | None],
    intervals: tuple[int | None, int | None],
) -> tuple[int, int]:
    """``train_and_evaluate``'s end and evaluation interval in steps, from ``ends`` (``max_steps``,
    ``max_epochs``) and ``intervals`` (``eval_every_n_steps``, ``eval_every_n_epochs``), epochs of
    ``input_fn``'s train input (its length read once, :meth:`InputPlan.epoch_steps`): an epoch's
    end is a step, so evaluations every N epochs fall on scheduled steps like every N steps."""
    (max_steps, max_epochs), (every_n_steps, every_n_epochs) = ends, intervals
    if (max_steps is None) == (max_epochs is None):
        raise ConfigError("train_and_evaluate: give max_steps or max_epochs (one of them)")
    if every_n_steps is not None and every_n_epochs is not None:
        raise ConfigError("train_and_evaluate: give eval_every_n_steps or eval_every_n_epochs, not both")
    check_train_arguments(None, max_steps, max_epochs)
    for name, value in (("eval_every_n_steps", every_n_steps), ("eval_every_n_epochs", every_n_epochs)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"train_and_evaluate: {name} must be a positive integer; got {value!r}")
    if max_epochs is not None or every_n_epochs is not None:
        per_epoch = inputs.epoch_steps(input_fn, "max_epochs" if max_epochs is not None else "eval_every_n_epochs")
        max_steps = max_steps if max_epochs is None else max_epochs * per_epoch
        every_n_steps = every_n_steps if every_n_epochs is None else every_n_epochs * per_epoch
    assert max_steps is not None
    return max_steps, 1000 if every_n_steps is None else every_n_steps


def _import_what_building_imports() -> None:
    """torch imports ``torch._dynamo`` when an optimizer is built (``Optimizer.add_param_group``),
    compiled or not, about 0.7x ``import torch``: imported before the time to full speed starts,
    it is said as start-up and imports, not as the checkpoint load (docs/results/startup.md)."""
    import torch._dynamo  # noqa: F401


class TrainingRun:
    """Trains ``state`` on batches of ``input_fn`` through ``model_fn``, with hooks between loops.

    ``loop`` is the run's ``LoopConfig``; ``info`` is handed on to the hooks (``RunContext.info``).
    """

    def __init__(
        self,
        state: ModelState,
        inputs: InputPlan,
        model_fn: ModelFn,
        hooks: Sequence[Hook],
        *,
        loop: LoopConfig,
        info: RunInfo,
    ) -> None:
        self.state = state
        self.inputs = inputs
        self.model_fn = model_fn
        self.config = loop
        self.info = info
        self.strategy = state.strategy
        self.hooks = list(hooks)
        self._max_steps: int | None = None
        self._finished_saved = False  # the final checkpoint's commit wrote finished.json
        self._clock = FullSpeedClock(enabled=False)  # run()'s: where the time to full speed went
        #: Whether the last ``run`` stopped because it was interrupted (a signal), not at its end.
        self.interrupted = False

    def run(self, input_fn: InputFn, steps: int | None = None, max_steps: int | None = None) -> None:
        """Train until ``steps`` more steps, global step ``max_steps``, or the end of the data."""
        if self.config.fast_dev_run:  # a quick run: that many steps whatever was asked, nothing written
            steps, max_steps, self.hooks = self.config.fast_dev_run, None, quick_run_hooks(self.hooks)
        state = self.state
        _import_what_building_imports()
        self._clock = FullSpeedClock(enabled=self.strategy.is_chief)
        state.restore_for_training()
        self._clock.restored(state.global_step, *compile_source(state))
        if max_steps is not None and state.global_step >= max_steps:
            log.info("train: global step %d already reaches max_steps=%d; nothing to do", state.global_step, max_steps)
            self._mark_finished(max_steps)  # again: a kill may have come between the last save and the marker
            return
        if state.checkpoints is not None and self.strategy.is_chief:
            state.checkpoints.clear_finished()  # training goes on: a watching evaluator must not stop
        hooks = list(self.hooks)
        if steps is not None or max_steps is not None:  # first of its phase: run.max_steps is final for the others
            hooks.insert(0, StopAtStepHook(num_steps=steps, last_step=max_steps))
        self._max_steps, self._finished_saved = max_steps, False
        self._interrupt: str | None = None  # a signal the loop a rollback undid had received
        while True:
            try:
                run = self._attempt(input_fn, sorted_hooks(hooks), max_steps)
                break
            except RollbackRequest as request:  # the same hooks go on from the restored checkpoint
                self._roll_back(request)
        self.interrupted = run.interrupted
        self._clock.finish(run.global_step)  # said at full speed, else now
        if run.stop_reason:
            log.info("training stopped at step %d: %s", run.global_step, run.stop_reason)
        if run.exit_code is not None:
            sys.exit(run.exit_code)

    def _attempt(self, input_fn: InputFn, hooks: list[Hook], max_steps: int | None) -> RunContext:
        """Train from the state in memory until a stop (or a rollback request, raised)."""
        state = self.state
        runner = HookRunner(hooks)
        run = self._run_context(max_steps)
        run._on_evaluation = runner.after_evaluation  # an evaluation reaches every hook when it is made
        if self._interrupt is not None:  # interrupted in the attempt this one replaces: stop at once
            run.interrupt(self._interrupt)
        step = self._train_step()
        infeed: Infeed | None = None
        started = False
        progress = self.strategy.progress if self.strategy.world_size > 1 else None
        if progress is not None:  # a replica stuck in a training step is named (RunConfig.stuck_replica)
            progress.start_watch(self.config.stuck_replica)
        try:
            runner.begin(run)
            runner.load_state_dict(state.pending_hook_state)
            runner.after_setup(run)
            params = self.inputs.mode_params(ModeKeys.TRAIN)
            infeed = self.inputs.infeed(input_fn, ModeKeys.TRAIN, params, restore=state.pending_input_state)
            self._clock.input_started(infeed)
            run.rollbacks = len(infeed.rollbacks)
            run._save = lambda stop: self._save(run, runner, infeed, step, stop)
            run._epochs = lambda: epochs_read(infeed)
            run._input_scalars = lambda: input_scalars(infeed)
            loop = DeviceLoop(step, run, run.global_batch_size, self.strategy)
            if state.ema is not None:
                loop.after_step = state.ema.after_step  # RunConfig.ema: updated after its steps
            self._clock.attach(loop)  # one line at the first full-speed step: where the time went
            state.build_model().train()
            state.holds, state.weights_of, started = "memory", None, True
            self._loops(run, runner, loop, infeed, step)
            runner.end(run)
            state.wait_for_checkpoint()  # the end of training (and SIGTERM) waits for the write in flight
            self._mark_finished(max_steps)
        except BaseException as error:
            if isinstance(error, RollbackRequest) and run.interrupted:
                self._interrupt = run.stop_reason  # the signal outlives the rollback
            if state.writer is not None:
                state.writer.drain()
            if started:
                state.holds = None  # memory may be ahead of (or worse than) the newest checkpoint
            clearer = error if isinstance(error, RollbackRequest) else self.strategy.explain_failure(error)
            if clearer is not error:
                raise clearer from error
            raise
        finally:
            if progress is not None:
                progress.start_watch(None)
            state.global_step = run.global_step
            state.cache = step.params.get("cache")
            if infeed is not None:
                state.pending_input_state = infeed.state_dict()
                infeed.close()
            state.pending_hook_state = runner.state_dict()
            runner.close()
        return run

    def _roll_back(self, request: RollbackRequest) -> None:
        """Restore the newest checkpoint and record the bad step's batches as ones to pass over."""
        state = self.state
        state.wait_for_checkpoint(everywhere=True)  # every replica restores the chief's newest
        latest = state.latest_checkpoint()
        if latest is None:
            raise NanLossError(
                request.step,
                request.loss,
                None,
                detail="no checkpoint to roll back to: give a model_dir and save before the bad step",
            ) from request
        # the run's rollbacks so far: those after the checkpoint are not in it
        since = (state.pending_input_state or {}).get("rollbacks", [])
        state.holds = None
        state.restore_for_training()
        if request.step <= state.global_step:  # a hook before NanLossHook saved after the bad step
            raise NanLossError(
                request.step,
                request.loss,
                str(latest),
                detail=f"the newest checkpoint is of step {state.global_step}, not before the bad step: "
                "no good checkpoint to roll back to",
            ) from request
        accumulation = self.config.gradient_accumulation_steps
        state.pending_input_state = with_rollback(
            state.pending_input_state,
            steps_after=request.step - state.global_step - 1,
            accumulation=accumulation,
            raw_default=state.global_step * accumulation,
            record={"step": request.step, "reason": request.reason},
            since=since,
        )
        rollbacks = state.pending_input_state["rollbacks"]
        log.warning(
            "%s: rolled back to %s (step %d); input batch(es) %s of the stream are passed over from now on "
            "(rollback %d of the run)",
            request.reason,
            latest,
            state.global_step,
            rollbacks[-1]["batches"],
            len(rollbacks),
        )

    def _loops(self, run: RunContext, runner: HookRunner, loop: DeviceLoop, infeed: Infeed, step: TrainStep) -> None:
        """Device loops with the hooks between them until a stop is requested.

        Where loops end is a property of the run in global steps, never of where this process
        started (:meth:`_loop_end`), so a resumed run meets every hook at the same steps.
        """
        state = self.state
        end_loop = getattr(step, "end_loop", None)  # a step keeping state on the device hands it back
        alone = self.strategy.world_size == 1
        before_loop = runner.before_loop if runner.has("before_loop") else None
        check_checkpoint = state.check_checkpoint if state.writer is not None else None
        totals = run.totals
        # Alone, with no hook that watches every loop (each one's after_loop waits for a due
        # step, none has a before_loop), loops that no hook would see run as one: up to the
        # first due step. Hooks see the same steps; the host is visited less often.
        merge = alone and before_loop is None
        # Every step a loop boundary, whatever is scheduled: no schedule to read per step.
        unit = self.config.iterations_per_loop == 1 and not merge
        # With iterations_per_loop=1 this body runs every step: keep it short.
        while not run.stop_requested:
            first = run.global_step
            end = first + 1 if unit else self._loop_end(runner, first, merge)
            if run.max_steps is not None and end > run.max_steps:
                end = run.max_steps
            n = end - first
            if n <= 0:
                break
            if before_loop is not None:
                before_loop(run, n)
            result = loop.run_loop(infeed, n)
            if end_loop is not None:
                end_loop()
            state.global_step = run.global_step
            if loop.exhausted:
                run.request_stop(f"input_fn's data ended at step {run.global_step}")
            if run.logs:
                run.logs.clear()  # values hooks share are fresh at every loop boundary
            skipped = infeed.bad_examples_skipped
            if skipped:  # unreadable examples replaced so far: a summary scalar beside the warnings
                run.logs["bad_examples_skipped"] = skipped
            if run.rollbacks:  # NanLossHook(on_nan="rollback") rollbacks so far, the same way
                run.logs["rollbacks"] = run.rollbacks
            totals.add(result)
            runner.after_loop(run, result)
            if check_checkpoint is not None:
                check_checkpoint()  # an asynchronous write that failed stops training here
            if not alone:  # a stop one replica decided (a signal, its clock) stops them all
                run.stop_requested = run.any_replica(run.stop_requested)

    def _loop_end(self, runner: HookRunner, step: int, merge: bool) -> int:
        """The global step the loop starting at ``step`` ends at: the next multiple of
        ``iterations_per_loop``, or earlier at the first step a hook is scheduled at
        (``Hook.scheduled_after``), so that ``eval_every_n_steps=25`` with loops of 10 evaluates
        at 25, 50, 75. Merged (``merge``), it runs on to the first due step instead, at most to
        the next multiple of ``MAX_MERGED_STEPS``. Every replica computes the same ends: they
        follow from the global step and the hooks' settings only."""
        iterations = self.config.iterations_per_loop
        end = (step // iterations + 1) * iterations
        if merge:
            due = runner.first_due_step()
            if due is not None and due > end:
                end = max(end, min(due, (step // MAX_MERGED_STEPS + 1) * MAX_MERGED_STEPS))
        if end == step + 1:
            return end  # nothing can fall before it (iterations_per_loop=1 with a hook on every loop)
        scheduled = runner.next_scheduled_step(step)
        return scheduled if scheduled < end else end

    def _mark_finished(self, max_steps: int | None) -> None:
        """Write ``finished.json`` (for a watching evaluator) once ``max_steps`` is reached,
        unless the final checkpoint already wrote it in its commit."""
        state = self.state
        if self._finished_saved:
            return
        if (
            max_steps is not None
            and state.global_step >= max_steps
            and state.checkpoints is not None
            and self.strategy.is_chief
        ):
            state.checkpoints.mark_finished(state.global_step)

    def _train_step(self) -> TrainStep:
        state = self.state
        params = self.inputs.mode_params(ModeKeys.TRAIN)
        if state.cache is not None:
            params["cache"] = state.cache
        assert state.module is not None and state.optimizer is not None
        kwargs = dict(
            module=state.module,
            model_fn=self.model_fn,
            optimizer=state.optimizer,
            schedule=state.schedule,
            precision=state.precision,
            device=self.strategy.device,
            params=params,
            accumulation=self.config.gradient_accumulation_steps,
            clip_norm=self.config.gradient_clip_norm,
        )
        return make_train_step(self.config, self.strategy, kwargs)

    def _run_context(self, max_steps: int | None) -> RunContext:
        state = self.state
        assert state.optimizer is not None and self.inputs.train_batch_size is not None
        return RunContext(
            info=self.info,
            params=state.params,
            model=state.build_model(),
            optimizer=state.optimizer,
            global_step=state.global_step,
            max_steps=max_steps,
            global_batch_size=self.inputs.train_batch_size,
            is_chief=self.strategy.is_chief,
            world_size=self.strategy.world_size,
            # alone, agreeing is the flag itself: hooks call this every loop
            _any_replica=self.strategy.any_replica if self.strategy.world_size > 1 else bool,
            last_checkpoint=state.latest_checkpoint(),
            last_checkpoint_step=state.checkpoints.latest_step() if state.checkpoints else None,
            changed_settings=state.settings.take_changes(),
        )

    def _save(
        self, run: RunContext, runner: HookRunner, infeed: Infeed, step: TrainStep, stop: bool
    ) -> Location | None:
        state, progress = self.state, self.strategy.progress
        if progress is not None:  # the chief writes while the others wait: left to distributed_timeout
            progress.mark("writing a checkpoint", run.global_step, exempt=True)
        state.global_step, state.cache = run.global_step, step.params.get("cache")
        finished = self._max_steps is not None and run.global_step >= self._max_steps
        path = state.save(runner.state_dict(), infeed.state_dict(), run.last_checkpoint, finished=finished, stop=stop)
        self._finished_saved = finished and path is not None
        if path is not None:
            run.last_checkpoint, run.last_checkpoint_step = path, run.global_step
        if progress is not None:
            progress.mark(BETWEEN_LOOPS, exempt=True)
        return path


__all__ = [
    "TrainingRun",
    "check_train_arguments",
    "default_hooks",
    "evaluation_schedule",
    "train_end",
    "train_hooks",
]
