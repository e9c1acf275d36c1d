"""The training, forward-only and evaluation benchmarks: a user of ``stoker.Estimator``.

The harness never runs a step itself. It builds an Estimator from the flags and watches it:

- **training** runs ``Estimator.train`` once for the warm-up and the timed steps, so the
  timed steps start with the input pipeline warm (its workers started, its prefetch queue
  full), as tf_cnn_benchmarks' timed steps continue the warm-up's session and iterator; a
  :class:`StepTimer` hook times the loops after the warm-up. The device loop runs
  ``--iterations_per_loop`` steps per host round trip (default 1, so every step is timed on
  its own, as tf_cnn_benchmarks does); the timer
  reads each loop's wall time and losses from the ``LoopResult`` the loop hands to hooks, so
  timing adds no host synchronisation and no work inside the loop. The loop's own end (the
  one read of the losses) is the only synchronisation point on CUDA.
- **forward-only** and **evaluation** iterate ``Estimator.predict`` one batch at a time and
  time each batch as it arrives; the predictions are per-example top-1 / top-5 hits, so
  reading them back costs two small vectors per batch (tf_cnn_benchmarks fetches the logits).
- **training + evaluation** adds the engine's :class:`~stoker.estimator.EvaluationHook`, which calls
  ``Estimator.evaluate`` (exact top-1 / top-5 on the device) every N steps.

``total images/sec`` is images over the wall time of the timed steps, from the start of the
first timed loop to the end of the last, hooks between loops included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

import torch

from ..checkpoint.manager import CheckpointManager
from ..config.changes import distinct
from ..errors import CheckpointError
from ..estimator import Estimator, EvaluationHook
from ..hooks import Hook, LoopResult, ProfilerHook, RunContext
from ..kernels.linear import reset_choices
from ..kernels.sgd_in_backward import updating_in_backward
from .config import (
    MODE_EVAL,
    MODE_FORWARD_ONLY,
    BenchConfig,
)
from .inference import run_inference
from .inputs import InputFn
from .model import (  # re-exported: they were defined here
    ModelFactory,
    bench_model_fn,
    l2_loss,
    model_fn_for,
    zoo_model,
)
from .optim import optimizer_and_schedule
from .outputs import mlperf_hook, summary_hook
from .plan import TRAINING_FLOPS_FACTOR, BenchPlan, build_plan, flops_per_image, model_params, setting_names
from .report import (
    base_result,
    efficiency_peak,
    header_lines,
    linear_lines,
    update_line,
)
from .run_spec import write_zoo_run_spec  # and, imported, the builder of kind zoo is registered
from .stats import display_due, format_accuracy, format_step_line, perf_timing, step_header
from .workload import Workload

LogFn = Callable[[str], None]


# ==================================================================== hooks
class StepTimer(Hook):
    """Collects each loop's per-step time, loss and accuracy; prints progress lines.

    Runs first among the hooks (phase ``timing``), so the end time of the timed steps is taken
    before any other hook's work at the last loop boundary.
    """

    phase = "timing"

    def __init__(
        self,
        *,
        batch_size: int,
        display_every: int,
        with_accuracy: bool,
        log: LogFn,
        ewma: float | None = None,
        first_step: int = 0,
    ) -> None:
        #: The global step timing starts at (the end of the warm-up): earlier loops are not timed.
        self.first_step = first_step
        self.batch_size = batch_size
        self.display_every = display_every
        self.with_accuracy = with_accuracy
        self.log = log
        self.ewma_weight = ewma  # --display_perf_ewma: progress lines show this moving average
        self.ewma: float | None = None
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.accuracy: tuple[float, float] | None = None
        self.steps = 0
        self.start: float | None = None
        self.end_time: float | None = None

    def before_loop(self, run: RunContext, steps: int) -> None:
        if self.start is None and run.global_step >= self.first_step:
            self.start = time.perf_counter()

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.start is None:  # a warm-up loop
            return
        self.end_time = time.perf_counter()
        if result.steps == 0:
            return
        before = self.steps
        self.steps += result.steps
        # One sample per loop: with one step per loop, exactly tf_cnn_benchmarks' step times.
        self.step_times.append(result.seconds / result.steps)
        self.losses.extend(result.losses)
        if self.ewma_weight is not None:
            speed = self.batch_size / self.step_times[-1]
            self.ewma = speed if self.ewma is None else self.ewma_weight * speed + (1 - self.ewma_weight) * self.ewma
        if self.with_accuracy and "top_1_accuracy" in result.values:
            self.accuracy = (result.values["top_1_accuracy"][-1], result.values["top_5_accuracy"][-1])
        if display_due(before, self.steps, self.display_every):
            timing = perf_timing(self.batch_size, self.step_times)
            if self.ewma is not None:
                timing = dataclasses.replace(timing, mean=self.ewma)
            self.log(
                format_step_line(self.steps, timing, result.losses[-1], self.accuracy if self.with_accuracy else None)
            )

    @property
    def elapsed(self) -> float:
        return 0.0 if self.start is None or self.end_time is None else self.end_time - self.start


class WarmUpEnd(Hook):
    """Calls ``on_end`` once: at the loop boundary where the warm-up ends (global step
    ``at_step``), or at :meth:`finish` if that comes first. Warm-up and timed steps run in one
    ``train`` call, so the harness prints its "Done warm up" lines from here."""

    phase = "timing"  # with the timer (which times nothing at the boundary where this acts)

    def __init__(self, at_step: int, on_end: Callable[[], None]) -> None:
        self.due_step = at_step
        self.on_end = on_end

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self.finish()  # the runner calls it only once the global step reached due_step

    def finish(self) -> None:
        """Call ``on_end`` unless it was called already."""
        if self.due_step != sys.maxsize:
            self.due_step = sys.maxsize  # never due again
            self.on_end()


class ChangedSettings(Hook):
    """Prints the lines of a resumed run's changed settings (``stoker.config.changes``) as the
    harness's own: it keeps stoker's INFO log quiet."""

    def __init__(self, names: dict[str, str], log: LogFn) -> None:
        self.names, self.log = names, log

    def after_setup(self, run: RunContext) -> None:
        checkpoint = str(run.last_checkpoint).rstrip("/").rsplit("/", 1)[-1]
        for change in distinct(run.changed_settings, self.names):
            self.log(change.line(checkpoint, run.global_step, self.names))


class EvaluationLines(Hook):
    """tf_cnn_benchmarks' lines about each evaluation during training (``Running evaluation at
    global_step N``, the accuracy, then ``Resuming training``; ``Running final evaluation`` at the
    end), and the stop once top-1 reaches ``stop_at`` (``--stop_at_top_1_accuracy``)."""

    phase = "decisions"  # after the evaluation, as the engine's early stopping

    def __init__(self, *, examples: int, stop_at: float | None, log: LogFn) -> None:
        self.examples, self.stop_at, self.log = examples, stop_at, log

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        ended = run.max_steps is not None and run.global_step >= run.max_steps
        self.log(f"Running {'final ' if ended else ''}evaluation at global_step {run.global_step}")
        self.log(format_accuracy(metrics["top_1_accuracy"], metrics["top_5_accuracy"], self.examples))
        if ended:
            return
        if self.stop_at is not None and metrics["top_1_accuracy"] >= self.stop_at:
            self.log(f"Stopping, as eval accuracy at least {self.stop_at} was reached")
            run.request_stop("eval accuracy target reached")
        else:
            self.log("Resuming training")


# ==================================================================== building
def build_estimator(plan: BenchPlan) -> Estimator:
    """The Estimator of ``plan``: its model and ``RunConfig``, tf_cnn_benchmarks' optimizer and
    learning rate (:mod:`stoker.bench.optim`), the global batch sizes."""
    cfg, workload = plan.cfg, plan.workload
    optimizer_fn, schedule_fn = optimizer_and_schedule(
        cfg,
        workload.train_examples / workload.batch_size,
        default_lr=workload.default_learning_rate,
        model_rate=workload.model_rate,
    )
    return Estimator(
        model=plan.model,
        model_fn=model_fn_for(workload),
        optimizer=optimizer_fn,
        lr_schedule=schedule_fn,
        config=plan.run_config,
        params=model_params(cfg),
        train_batch_size=workload.batch_size,
        eval_batch_size=workload.eval_batch_size,
        setting_names=setting_names(cfg),
    )


# ==================================================================== runner
def run_benchmark(
    cfg: BenchConfig | BenchPlan,
    *,
    model: ModelFactory | None = None,
    num_classes: int | None = None,
    input_fn: InputFn | None = None,
    eval_input_fn: InputFn | None = None,
    log: LogFn = print,
) -> dict[str, Any]:
    """Run the benchmark ``cfg`` describes (the flags, or the :class:`~stoker.bench.plan.BenchPlan`
    ``stoker bench`` built of them); stream progress lines to ``log``; return the results.

    ``model`` (a factory ``params -> nn.Module`` with ``num_classes`` logits) and the input
    functions replace the zoo model and the data the flags name (for tests and scripts).
    The closing summary is not printed: pass the result to :func:`report.summary_lines`.
    """
    plan = cfg if isinstance(cfg, BenchPlan) else build_plan(cfg, model=model, num_classes=num_classes)
    cfg, workload = plan.cfg, plan.workload
    if cfg.mode == "inference":
        return run_inference(plan, log=log)
    train_input = input_fn or plan.input_fn(train=True)
    # --eval reads --num_batches batches (repeating the data if needed); an evaluation during
    # training reads --num_eval_batches batches, or one exact pass over real data.
    repeat = cfg.benchmark_mode == MODE_EVAL or workload.eval_batches is not None
    eval_input = eval_input_fn or input_fn or plan.input_fn(train=False, repeat=repeat)
    if cfg.variable_update == "parameter_server":
        log("Note: --variable_update=parameter_server runs as replicated: one process has no parameter server")
    if cfg.model == "mobilenet" and workload.model_info is not None:
        log(
            "Note: --model=mobilenet is MobileNet v1 here; tf_cnn_benchmarks' mobilenet (MobileNet v2 with two "
            "logits layers) is --model=mobilenet_v2_tf_cnn"
        )
    if workload.device.type == "cuda" and cfg.gpu_memory_frac_for_testing:
        torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_frac_for_testing, workload.device)
    # The MFU's peak, measured before the run (cached per machine) so the header can say which kernel set it;
    # a custom model has no FLOP count, hence no MFU. Replicas sharing a machine would measure each other's
    # load: there the chief measures after the run (stoker.bench.cli).
    alone = workload.model_info is not None and workload.num_devices == 1
    peak = efficiency_peak(cfg.peak_tflops, workload.device, cfg.precision) if alone else None
    reset_choices()  # the "Linear:" lines list this run's layer shapes
    est = build_estimator(plan)
    for line in header_lines(plan, est.choices, peak=peak):
        log(line)
    result = base_result(cfg, workload, plan.model_name)
    _run_mode(plan, est, train_input, eval_input, result, log)
    if workload.model_info is not None:
        forward = flops_per_image(cfg.model, workload.dataset, workload.num_classes)
        factor = TRAINING_FLOPS_FACTOR if plan.trains else 1.0
        result.update(gflop_per_image_forward=forward, gflop_per_image=forward * factor)
    return result


def _run_mode(
    plan: BenchPlan, est: Estimator, train_input: InputFn, eval_input: InputFn, result: dict[str, Any], log: LogFn
) -> None:
    """Run the mode the flags ask for and add its results to ``result``."""
    cfg, workload = plan.cfg, plan.workload
    mode = cfg.benchmark_mode
    # The run spec rebuilds an image classifier for `stoker export`; the others take other inputs.
    classifier = workload.model_info is not None and workload.model_info.is_classifier
    if cfg.train_dir and classifier and plan.trains and est.strategy.is_chief:
        _write_run_spec(cfg, workload)
    if mode == MODE_EVAL and cfg.eval_interval_secs > 0:
        result.update(_watch_checkpoints(cfg, workload, est, eval_input, log))
    elif mode == MODE_EVAL:
        result.update(_evaluate_checkpoint(cfg, workload, est, eval_input, log))
    elif mode == MODE_FORWARD_ONLY:
        result.update(_forward_only(cfg, workload, est, train_input, log))
    else:
        result.update(_train(cfg, workload, est, train_input, eval_input, log))


def _write_run_spec(cfg: BenchConfig, workload: Workload) -> None:
    """Record in ``--train_dir`` how to rebuild the model, so ``stoker export TRAIN_DIR`` works."""
    assert cfg.train_dir is not None
    write_zoo_run_spec(
        cfg.train_dir,
        model=cfg.model,
        dataset=workload.dataset,
        num_classes=workload.num_classes,
        image_size=workload.image_size,
    )


# -------------------------------------------------------------------- training
def _train(
    cfg: BenchConfig, workload: Workload, est: Estimator, train_input: InputFn, eval_input: InputFn, log: LogFn
) -> dict[str, Any]:
    """Train for the warm-up and the timed steps (from where ``--train_dir`` stopped); return the timings."""
    start = (CheckpointManager(cfg.train_dir, writer=False).latest_step() or 0) if cfg.train_dir else 0
    # The run from step 0 sets where timing (and evaluations) start and where it ends; a process
    # resuming it from --train_dir continues that run, whatever step it was stopped at.
    loop = max(1, cfg.iterations_per_loop)
    origin = -(-cfg.num_warmup_batches // loop) * loop if workload.num_batches else cfg.num_warmup_batches
    target = origin + workload.num_batches
    remaining = max(0, target - start)
    if start:
        log(f"Resuming from global step {start} in {cfg.train_dir}: {remaining} steps to global step {target}")
    if remaining == 0:
        log(f"Nothing to run: {cfg.train_dir} is already at global step {start} (warm-up + --num_batches = {target})")
        return {"num_steps": 0, "global_step": start, "images_per_sec": 0.0}
    warm, timed = _warm_up_and_timed(cfg, start, remaining, log)
    first_timed = start + warm
    trace = _trace_hook(cfg, first_step=start + max(0, warm - 2))
    log("Running warm up")
    timer = StepTimer(
        batch_size=workload.batch_size,
        display_every=cfg.display_every,
        with_accuracy=cfg.print_training_accuracy,
        log=log,
        ewma=cfg.display_perf_ewma,
        first_step=first_timed,
    )
    hooks: list[Hook] = [timer, *(h for h in (summary_hook(cfg), mlperf_hook(cfg, workload)) if h is not None)]
    hooks.append(ChangedSettings(setting_names(cfg), log))
    warm_up_end = WarmUpEnd(first_timed, lambda: _log_warm_up_end(cfg, workload, est, log, warm=warm, trace=trace))
    if warm:
        hooks.append(warm_up_end)
    else:
        warm_up_end.finish()
    if trace:
        hooks.append(trace)
    evaluation = _evaluator(cfg, workload, est, eval_input, log, first_step=origin)
    if evaluation is not None:
        hooks += evaluation
    # One train call for the warm-up and the timed steps: one input pipeline (see the module docstring).
    est.train(train_input, max_steps=first_timed + timed, hooks=hooks)
    warm_up_end.finish()  # if training stopped within the warm-up (its data ended, a stop hook)
    if trace and not warm and trace.written is not None:
        log(f"Dumping trace to {trace.written}")
    return _training_results(est, workload, timer, evaluation[0] if evaluation is not None else None)


def _warm_up_and_timed(cfg: BenchConfig, start: int, remaining: int, log: LogFn) -> tuple[int, int]:
    """Split the ``remaining`` steps of this run, from global step ``start``, into ``(warm-up,
    timed)`` steps.

    A resumed process warms up again (allocator, caches, compilation) before timing.
    """
    warm = min(cfg.num_warmup_batches, remaining)
    # The timed steps start at a loop boundary: a warm-up that ends inside a loop of
    # --iterations_per_loop steps (loops end on its multiples, counted from step 0) is rounded up
    # to the end of that loop. From step 0 the run's last step counts the rounding (_train), so it
    # adds warm-up steps and never takes timed ones (tf_cnn_benchmarks times --num_batches
    # steps); a resumed process times what is left.
    loop = max(1, cfg.iterations_per_loop)
    rounded = min(-(-(start + warm) // loop) * loop - start, remaining)
    if rounded != warm and remaining > rounded:
        log(
            f"Note: warm-up of {warm} step(s) rounded up to {rounded}, whole loops of "
            f"--iterations_per_loop={loop}; {remaining - rounded} step(s) timed"
        )
        warm = rounded
    return warm, remaining - warm


def _log_warm_up_end(
    cfg: BenchConfig, workload: Workload, est: Estimator, log: LogFn, *, warm: int, trace: ProfilerHook | None
) -> None:
    """The lines between the warm-up and the timed steps: the kernels chosen, then the step table's header."""
    if warm and trace and trace.written is not None:
        log(f"Dumping trace to {trace.written}")
    log("Done warm up")
    if warm:
        for line in linear_lines(cfg, workload.device):
            log(line)
        ran = updating_in_backward(est.model, ran=True)
        for line in update_line(cfg, workload.device, ran, est.state.sgd_in_backward_refusal):
            log(line)
    elif workload.device.type == "cpu" and (cfg.fast_linear != "off" or cfg.sgd_in_backward != "off"):
        # Both are settled by the first step; before it, "nothing ran" would read as "nothing will".
        log(
            "Note: no warm-up steps: the linear kernels and the in-backward update are chosen in the first "
            "timed step (which pays for measuring them; a warm-up step shows the choices here)"
        )
    if trace and not warm:
        log("Note: no warm-up steps, so the traced step is the first timed one")
    log(step_header(cfg.print_training_accuracy, cfg.loss_type_to_report))


def _training_results(
    est: Estimator, workload: Workload, timer: StepTimer, evaluator: EvaluationHook | None
) -> dict[str, Any]:
    """The timings, losses and accuracy of the timed steps; with an evaluator, the last evaluation's
    accuracy (the evaluator's last, at the end of training)."""
    out = _timing_fields(timer.steps, timer.elapsed, workload.batch_size, timer.step_times)
    out.update(
        global_step=est.global_step, losses=timer.losses, last_average_loss=timer.losses[-1] if timer.losses else None
    )
    if timer.accuracy is not None:
        out.update(top_1_accuracy=timer.accuracy[0], top_5_accuracy=timer.accuracy[1])
    if evaluator is not None and evaluator.last_results is not None:
        out.update(
            top_1_accuracy=evaluator.last_results["top_1_accuracy"],
            top_5_accuracy=evaluator.last_results["top_5_accuracy"],
        )
    return out


def _evaluator(
    cfg: BenchConfig, workload: Workload, est: Estimator, eval_input: InputFn, log: LogFn, first_step: int
) -> tuple[EvaluationHook, EvaluationLines] | None:
    """``--eval_during_training_*``: the engine's evaluation hook on tf_cnn_benchmarks' schedule
    (timed steps counted from ``first_step``; epochs become steps), and the bench's lines about
    each evaluation (:class:`EvaluationLines`); ``None`` without those flags."""
    if not cfg.evaluates_during_training:
        return None
    batches = workload.eval_batches
    per_epoch = workload.train_examples / workload.batch_size  # epochs become timed steps, as tf_cnn_benchmarks
    every = [] if cfg.eval_during_training_every_n_steps is None else [cfg.eval_during_training_every_n_steps]
    if cfg.eval_during_training_every_n_epochs is not None:
        every.append(max(1, int(cfg.eval_during_training_every_n_epochs * per_epoch)))
    at = [
        *cfg.eval_during_training_at_specified_steps,
        *(max(1, int(e * per_epoch)) for e in cfg.eval_during_training_at_specified_epochs),
    ]
    examples = batches * workload.eval_batch_size if batches else workload.eval_examples
    return (
        EvaluationHook(est, eval_input, every, batches, at_steps=sorted(set(at)), first_step=first_step),
        EvaluationLines(examples=examples, stop_at=cfg.stop_at_top_1_accuracy, log=log),
    )


def _trace_hook(cfg: BenchConfig, first_step: int) -> ProfilerHook | None:
    # tf_cnn_benchmarks traces the second-to-last warm-up step, so tracing never slows a timed step.
    return ProfilerHook(start_step=first_step, num_steps=1, trace_file=cfg.trace_file) if cfg.trace_file else None


def _timing_fields(steps: int, elapsed: float, batch_size: int, step_times: list[float]) -> dict[str, Any]:
    timing = perf_timing(batch_size, step_times)
    return {
        "num_steps": steps,
        "elapsed_seconds": elapsed,
        "average_wall_time": elapsed / steps if steps else 0.0,
        "images_per_sec": steps * batch_size / elapsed if elapsed > 0 else 0.0,
        "step_images_per_sec": timing.mean,
        "uncertainty": timing.uncertainty,
        "jitter": timing.jitter,
        "step_times": step_times,
    }


# -------------------------------------------------------------------- forward-only and evaluation
def _forward_only(
    cfg: BenchConfig, workload: Workload, est: Estimator, input_fn: InputFn, log: LogFn
) -> dict[str, Any]:
    # predict() on --train_dir's newest checkpoint, or on the initial weights if there is none.
    est.initialize()
    log("Running warm up")
    batches = _timed_batches(
        est, input_fn, warmup=cfg.num_warmup_batches, steps=workload.num_batches, trace_file=cfg.trace_file, log=log
    )
    step_times: list[float] = []
    top1 = top5 = 0.0
    elapsed = 0.0
    steps = 0
    for i, seconds, preds, since_start in batches:
        if i == 0:
            log("Done warm up")
            log(step_header(True))
        step_times.append(seconds)
        rows = preds["top_1"].numel()
        top1, top5 = preds["top_1"].float().sum().item() / rows, preds["top_5"].float().sum().item() / rows
        steps, elapsed = i + 1, since_start
        if display_due(i, i + 1, cfg.display_every):
            log(format_step_line(i + 1, perf_timing(workload.batch_size, step_times), 0.0, (top1, top5)))
    out = _timing_fields(steps, elapsed, workload.batch_size, step_times)
    out.update(global_step=est.global_step, top_1_accuracy=top1, top_5_accuracy=top5)
    return out


def _evaluate_checkpoint(
    cfg: BenchConfig, workload: Workload, est: Estimator, input_fn: InputFn, log: LogFn
) -> dict[str, Any]:
    latest = est.latest_checkpoint()
    if latest is None:
        raise CheckpointError(f"Checkpoint not found in {cfg.train_dir}: train first with the same --train_dir")
    log(f"Successfully loaded model from {latest}.")
    hits1 = hits5 = examples = 0
    step_times: list[float] = []
    window_start = 0.0
    elapsed = 0.0
    steps = 0
    for i, seconds, preds, since_start in _timed_batches(
        est, input_fn, warmup=0, steps=workload.num_batches, trace_file=cfg.trace_file, log=log
    ):
        step_times.append(seconds)
        hits1 += int(preds["top_1"].sum())
        hits5 += int(preds["top_5"].sum())
        examples += preds["top_1"].numel()
        steps, elapsed = i + 1, since_start
        if (i + 1) % cfg.display_every == 0:
            log(f"{i + 1}\t{workload.batch_size * cfg.display_every / (since_start - window_start):.1f} examples/sec")
            window_start = since_start
    top1 = hits1 / examples if examples else 0.0
    top5 = hits5 / examples if examples else 0.0
    log(format_accuracy(top1, top5, examples))
    out = _timing_fields(steps, elapsed, workload.batch_size, step_times)
    # Images actually evaluated: a padded last batch counts only its real rows.
    out["images_per_sec"] = examples / elapsed if elapsed > 0 else 0.0
    out.update(global_step=est.global_step, top_1_accuracy=top1, top_5_accuracy=top5, num_examples=examples)
    return out


def _watch_checkpoints(
    cfg: BenchConfig, workload: Workload, est: Estimator, input_fn: InputFn, log: LogFn
) -> dict[str, Any]:
    """``--eval --eval_interval_secs=N``: evaluate the new checkpoints of ``--train_dir`` (exact
    top-1 / top-5 on ``--num_batches`` batches), looking every N seconds, until the training
    process has finished (or an hour passes without a new checkpoint). As tf_cnn_benchmarks'
    loop, the newest: older pending checkpoints are recorded as superseded."""
    evaluations: list[dict[str, float]] = []
    examples = workload.num_batches * workload.batch_size

    def report(step: int, results: dict[str, float]) -> None:
        log(f"Evaluated checkpoint {cfg.train_dir}/ckpt-{step} (global step {step})")
        log(format_accuracy(results["top_1_accuracy"], results["top_5_accuracy"], examples))
        evaluations.append(
            {
                "global_step": step,
                "top_1_accuracy": results["top_1_accuracy"],
                "top_5_accuracy": results["top_5_accuracy"],
            }
        )

    log(f"Watching {cfg.train_dir} for new checkpoints every {cfg.eval_interval_secs:g} s")
    watched = est.evaluate_continuously(
        input_fn, steps=workload.num_batches, poll_secs=cfg.eval_interval_secs, on_result=report
    )
    if watched.superseded:
        log(f"Superseded (a newer checkpoint was evaluated instead): steps {watched.superseded}")
    log(f"Checkpoints of {cfg.train_dir}: {watched.coverage_line()}")
    log(f"Stopped watching: {watched.stop_reason}")
    out: dict[str, Any] = {
        "evaluations": evaluations,
        "skipped_checkpoints": watched.skipped,
        "superseded_checkpoints": watched.superseded,
        "num_examples": examples,
    }
    if evaluations:
        out.update(evaluations[-1])
    return out


def _timed_batches(
    est: Estimator, input_fn: InputFn, *, warmup: int, steps: int, trace_file: str | None, log: LogFn
) -> Iterator[tuple[int, float, dict[str, torch.Tensor], float]]:
    """Predict batch by batch: skip ``warmup`` batches, then yield ``(index, seconds, predictions,
    seconds since the first timed batch started)`` for ``steps`` batches (fewer if the data ends)."""
    # predict returns a generator (typed Iterator); closed below
    predictions = cast(
        "Generator[dict[str, torch.Tensor], None, None]", est.predict(input_fn, yield_single_examples=False)
    )
    trace_at = max(0, warmup - 2) if warmup else 0
    try:
        for i in range(warmup):
            with _profile(trace_file if i == trace_at else None, log):
                if next(predictions, None) is None:
                    return
        start = last = time.perf_counter()
        for i in range(steps):
            with _profile(trace_file if not warmup and i == 0 else None, log):
                preds = next(predictions, None)
            if preds is None:
                return
            now = time.perf_counter()
            yield i, now - last, preds, now - start
            last = time.perf_counter()  # the caller's bookkeeping is not part of the next batch
    finally:
        predictions.close()


@contextlib.contextmanager
def _profile(trace_file: str | None, log: LogFn) -> Iterator[None]:
    """A Chrome trace of the block when ``trace_file`` is set (forward-only and eval batches)."""
    if trace_file is None:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        yield
    Path(trace_file).parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(trace_file)
    log(f"Dumping trace to {trace_file}")


__all__ = [
    "StepTimer",
    "bench_model_fn",
    "build_estimator",
    "l2_loss",
    "run_benchmark",
    "zoo_model",
]
