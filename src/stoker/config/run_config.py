"""``RunConfig``: how a run is executed (where, how often to save and log, in what precision).

What the model *is* lives in ``params``; ``RunConfig`` only says how to run it. The fields
TPUEstimator users know (``model_dir``, ``save_checkpoints_steps``, ``iterations_per_loop``,
``log_every_n_steps``, ``seed``, ...) are flat, and stoker's own groups of settings are small
objects (``pipeline``, ``loss_scale``, ``checkpoint_io``, and ``precision`` also as a
``stoker.precision.Precision``).

Inside, ``RunConfig`` is a composition: each component owns a frozen slice that validates
itself, and ``RunConfig`` builds them from its flat fields (``loop_config``, ``input_config``,
``state_config``, ``eval_config``, ``checkpoint_config``, ``distribution_config``,
``make_precision()``; the hooks' ``RunInfo`` is ``run_info(config)``); the Estimator hands each
component its slice, so nothing below the Estimator reads the whole config. What ``RunConfig`` itself
checks is how the slices combine (``_check_across``). A bad value raises ``ConfigError`` (a
``ValueError``) naming the field and the values it accepts.

It is a plain keyword-only dataclass: its fields, their defaults (a fresh group object for each
group) and its ``__init__`` are the dataclass's own.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from ..checkpoint.io_config import CheckpointConfig, CheckpointIO
from ..distributed.config import DistributionConfig
from ..distributed.pipeline import PipelineConfig
from ..distributed.watchdog import StuckReplica
from ..errors import ConfigError
from ..precision import LossScale, Precision, make_precision
from ..resolve import Reason
from .slices import (
    EMA,
    BatchLimits,
    EvalConfig,
    InputConfig,
    LoopConfig,
    RunInfo,
    StateConfig,
    batch_limit,
    compile_mode,
)

PrecisionName = Literal["fp32", "bf16", "fp16", "bf16-sr"]


@dataclass(kw_only=True)
class RunConfig:
    """Execution settings of an ``Estimator``.

    Attributes:
        model_dir: where checkpoints, TensorBoard events and ``metrics.csv`` go. ``None``
            keeps everything in memory (no checkpoints, no resume).
        seed: seeds model initialisation and every RNG stoker manages; resume restores them.
        iterations_per_loop: training steps per host round trip (the device loop). Loss and
            ``host_call`` values stay on the device within a loop; hooks run once per loop, so
            step-based intervals (checkpoints, logging) are honoured at the first loop boundary
            at or after the step they name. In one process, when every hook waits for a due
            step (``Hook.due_step``: the built-in ones do; a hook without it is called after
            every loop), the loops before the first due step run as one, since no hook would
            see them: the host is visited less, the hooks see the same steps.
        save_checkpoints_steps / save_checkpoints_secs: checkpoint interval (set at most one;
            with neither, a checkpoint is written every 600 s). A final checkpoint is always
            written when ``train`` returns.
        keep_checkpoint_max: how many of the newest checkpoints to retain (0 keeps all).
        keep_best: ``(metric, "min" | "max")``: also retain the checkpoint with the best
            evaluation value of ``metric``, apart from the newest ones; ``(metric, mode, k)``:
            the ``k`` best (Lightning's ``save_top_k``).
        log_every_n_steps: interval of the loss / examples-per-second log lines (``None``: no
            log lines and no step counter, e.g. for a harness that prints its own).
        precision: ``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast + loss scaling) keep fp32
            master weights; ``bf16-sr`` keeps the weights and the optimizer state in bf16 and
            rounds every update stochastically (``stoker.memory.stochastic_rounding``, ``docs/memory.md``).
        loss_scale: fp16 only: a ``stoker.precision.LossScale`` (``LossScale(init=2.0**15,
            growth_interval=1000)`` is the default: dynamic scaling starts at ``init``, halves
            (and skips the update) on inf/NaN gradients and doubles after ``growth_interval``
            good steps), or the short forms ``"dynamic"`` (the default ``LossScale()``) and a
            number for a static scale (e.g. ``128``: ``LossScale(dynamic=False, init=128.0)``).
            It is held as a ``LossScale``.
        gradient_accumulation_steps: micro-batches per optimizer step. The global batch is the
            batch of one optimizer step, so each micro-batch holds
            ``train_batch_size / (replicas * gradient_accumulation_steps)`` examples.
        gradient_clip_norm: clip the global gradient norm to this value before each update.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        compile: ``False`` / ``"none"``: eager; ``True`` / ``"module"``: wrap the model in
            ``torch.compile``; ``"step"``: compile the whole training step (forward, loss
            scaling, backward, optimizer update; see ``docs/device_loop.md``).
        fast_linear: which kernel ``nn.Linear`` runs on the CPU (``docs/bench-reference.md``, "Fast linear"):
            ``"off"`` (default: the BLAS, as plain PyTorch), ``"on"`` (oneDNN's inner product for
            the forward and both backward products) or ``"auto"`` (oneDNN for each layer shape
            where it measured >= 5 % faster on this machine; measured once per machine and
            cached). Values agree with ``"off"`` to fp32 rounding; resume is bitwise on one path.
        sgd_in_backward: plain SGD applied inside the weight-gradient product of the
            ``fast_linear`` layers (``stoker.kernels.sgd_in_backward``): ``"off"`` (default),
            ``"auto"`` (where the run allows it, else the ordinary update, the reason logged) or
            ``"on"`` (an error names what stands in the way). It needs ``torch.optim.SGD``
            without momentum, one CPU process, fp32, one micro-batch, no clipping, eager; those
            weights then get no ``.grad`` (hooks reading gradients see none). Same update to
            fp32 rounding, no weight-gradient tensor written; resume is bitwise on one path.
        cuda_graph: CUDA only: capture the training step once as a CUDA graph and replay it
            every step (static input buffers, capturable optimizer, loss scale on the device).
            A step that cannot be captured (an optimizer neither fused nor capturable, several
            replicas, ...) is a ``ConfigError`` naming why when the step is built.
        strategy: how replicas are formed: ``auto`` picks from the torchrun environment.
        ddp_bucket_cap_mb: ``replicated``: the size of DDP's gradient buckets in MiB (``None``:
            DDP's default of 25); gradients are all-reduced one bucket at a time.
        prefetch_depth: batches the infeed prepares ahead (0: fetch in the training thread).
        progress_bar: show progress: a tqdm bar when stderr is a terminal, else a log line every 30 s.
        summaries: write TensorBoard events and ``metrics.csv`` into ``model_dir``.
        distributed_timeout: seconds a collective may wait for a lost replica.
        stuck_replica: ``stoker.distributed.StuckReplica(factor=20.0, min_seconds=20.0)``: during
            training, a replica that has waited in a collective for ``factor`` x its median step
            time (at least ``min_seconds``) names the replicas that have not reached it, where
            they were last seen (step, phase), and exits with status 1; ``None``: wait
            ``distributed_timeout``.
        deterministic: ask torch for deterministic kernels (slower on GPU).
        recompute: activation recompute (``docs/memory.md``): ``None`` (off), ``"all"`` (the
            whole model, or each pipeline stage), or glob patterns on module names such as
            ``"layers.*"`` whose modules drop their activations after the forward pass and
            recompute them in backward (``torch.utils.checkpoint``, non-reentrant; gradients
            are bitwise the same). A pattern that matches no module is an error listing them.
        mlperf_log: write MLPerf-style ``:::MLLOG`` events to ``model_dir/mlperf.log`` (RUN_START,
            EPOCH_START/STOP, RUN_STOP; ``stoker.hooks.MLPerfLogHook`` adds evaluations).
        on_changed_optimizer: a rerun whose optimizer or LR schedule settings (``lr``,
            ``weight_decay``, a ``StepLR``'s ``step_size``, ...) differ from those in the
            checkpoint's state it resumes: ``"refuse"`` (default: a ``ConfigError`` naming each),
            ``"keep"`` (train on with the checkpoint's values) or ``"apply"`` (with the new ones from
            the resumed step). Every other changed setting is applied or refused by its rule and
            said in one log line (``stoker.config.changes``, docs/checkpoints.md).
        pipeline: pipeline parallelism (``docs/model_parallel.md``): ``None`` (no pipeline) or a
            ``stoker.distributed.PipelineConfig``: the module names to split the model before,
            the micro-batches, the schedule and the stages per process. Under torchrun the
            processes form ``replicas x stages``; in one process the model runs unsplit (the
            names are still checked). It runs the eager step in fp32 or bf16, with
            ``strategy`` ``auto`` or ``pipeline`` and ``gradient_accumulation_steps=1``.
        ema: an exponential moving average of the weights kept beside them, in every checkpoint:
            a ``stoker.EMA(decay=0.999, start_step=0, every_n_steps=1, use_for_inference=True)``
            (evaluation, ``keep_best``, export and serving use it); ``None``: none.
        fast_dev_run: ``True`` (or ``N``): a quick run of the code paths, as Lightning's: ``train``
            runs 1 (``N``) step whatever it is asked, ``evaluate`` and ``predict`` read 1 (``N``)
            batch; ``model_dir`` is neither read nor written, trackers are left out.
        limit_train_batches / limit_eval_batches: read the first ``N`` batches (an int) or that
            fraction (a float in (0, 1]) of every epoch of the train input / of each evaluation's
            input (Lightning's; docs/concepts.md "Epochs and quick runs").
        overfit_batches: train on the train input's first ``N`` batches (or fraction), over and
            over, and evaluate on as many of the eval input's.
        checkpoint_io: how checkpoints are written, a ``stoker.checkpoint.CheckpointIO``:
            ``async_save`` (write on a background thread; the loop waits only for a copy of
            the state) and ``retry`` (how storage faults are retried and timed out, a
            ``stoker.storage.RetryPolicy``).
    """

    model_dir: str | os.PathLike[str] | None = None
    seed: int = 0
    iterations_per_loop: int = 10
    save_checkpoints_steps: int | None = None
    save_checkpoints_secs: float | None = None
    keep_checkpoint_max: int = 5
    keep_best: tuple[str, str] | tuple[str, str, int] | None = None
    log_every_n_steps: int | None = 100
    precision: PrecisionName | Precision = "fp32"
    loss_scale: LossScale | float | Literal["dynamic"] = field(default_factory=LossScale)
    gradient_accumulation_steps: int = 1
    gradient_clip_norm: float | None = None
    device: str = "auto"
    compile: bool | Literal["none", "module", "step"] = False
    fast_linear: Literal["auto", "on", "off"] = "off"
    sgd_in_backward: Literal["off", "auto", "on"] = "off"
    cuda_graph: bool = False
    strategy: str = "auto"
    ddp_bucket_cap_mb: float | None = None
    prefetch_depth: int = 2
    progress_bar: bool = True
    summaries: bool = True
    distributed_timeout: float = 1800.0
    stuck_replica: StuckReplica | None = field(default_factory=StuckReplica)
    deterministic: bool = False
    mlperf_log: bool = False
    recompute: str | tuple[str, ...] | None = None
    on_changed_optimizer: Literal["refuse", "keep", "apply"] = "refuse"
    ema: EMA | None = None
    fast_dev_run: bool | int = False
    limit_train_batches: int | float | None = None
    limit_eval_batches: int | float | None = None
    overfit_batches: int | float | None = None
    pipeline: PipelineConfig | None = None
    checkpoint_io: CheckpointIO = field(default_factory=CheckpointIO)

    def __post_init__(self) -> None:
        self.loss_scale = LossScale.of(self.loss_scale)
        if self.model_dir is not None:
            self.model_dir = os.fspath(self.model_dir)
        checkpointing = self.checkpoint_config  # each slice validates its fields as it is built
        self.save_checkpoints_secs = checkpointing.save_checkpoints_secs  # 600 s when neither interval is set
        self.keep_best = checkpointing.keep_best
        self.recompute = self.state_config.recompute
        _ = (self.loop_config, self.input_config, self.eval_config, self.distribution_config)
        _check_precision(self)  # how the slices combine
        _check_across(self)

    # ---------------------------------------------------------------- the slices
    @property
    def loop_config(self) -> LoopConfig:
        """The training loop's slice (``TrainingRun``, ``make_train_step``, the default hooks)."""
        return LoopConfig(
            iterations_per_loop=self.iterations_per_loop,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            gradient_clip_norm=self.gradient_clip_norm,
            compile=compile_mode(self.compile),
            cuda_graph=self.cuda_graph,
            log_every_n_steps=self.log_every_n_steps,
            progress_bar=self.progress_bar,
            summaries=self.summaries,
            mlperf_log=self.mlperf_log,
            stuck_replica=self.stuck_replica,
            fast_dev_run=int(self.fast_dev_run),
        )

    @property
    def input_config(self) -> InputConfig:
        """The input's slice (``InputPlan``)."""
        return InputConfig(
            seed=self.seed,
            prefetch_depth=self.prefetch_depth,
            iterations_per_loop=self.iterations_per_loop,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            microbatches=1 if self.pipeline is None else self.pipeline.microbatches,
            limits=batch_limits(self),
        )

    @property
    def state_config(self) -> StateConfig:
        """How the model and optimizer are built (``ModelState``)."""
        return StateConfig(
            seed=self.seed,
            deterministic=self.deterministic,
            compile=compile_mode(self.compile),
            cuda_graph=self.cuda_graph,
            fast_linear=self.fast_linear,
            sgd_in_backward=self.sgd_in_backward,
            recompute=self.recompute,
            pipeline=self.pipeline,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            gradient_clip_norm=self.gradient_clip_norm,
            async_save=self.checkpoint_io.async_save if isinstance(self.checkpoint_io, CheckpointIO) else False,
            on_changed_optimizer=self.on_changed_optimizer,
            ema=self.ema,
        )

    @property
    def eval_config(self) -> EvalConfig:
        """Evaluation's slice (``EvaluationRun``)."""
        return EvalConfig(
            seed=self.seed, summaries=self.summaries, keep_best=self.checkpoint_config.keep_best, device=self.device
        )

    @property
    def checkpoint_config(self) -> CheckpointConfig:
        """Checkpointing's slice (``stoker.checkpoint.CheckpointConfig``)."""
        return CheckpointConfig(
            model_dir=None if self.model_dir is None or self.fast_dev_run else os.fspath(self.model_dir),
            save_checkpoints_steps=self.save_checkpoints_steps,
            save_checkpoints_secs=self.save_checkpoints_secs,
            keep_checkpoint_max=self.keep_checkpoint_max,
            keep_best=self.keep_best,
            io=self.checkpoint_io,
        )

    @property
    def distribution_config(self) -> DistributionConfig:
        """Distribution's slice (``stoker.distributed.DistributionConfig``)."""
        return DistributionConfig(
            strategy=self.strategy,
            device=self.device,
            distributed_timeout=self.distributed_timeout,
            ddp_bucket_cap_mb=self.ddp_bucket_cap_mb,
            pipeline=self.pipeline,
        )

    def make_precision(self) -> Precision:
        """A fresh ``Precision`` for this run (its own loss scaler): what the Estimator hands the engine."""
        return make_precision(self.precision, self.loss_scale)

    # ---------------------------------------------------------------- derived views
    @property
    def precision_name(self) -> str:
        """``precision`` as its name (``"bf16"``), also when a ``Precision`` was given."""
        return self.precision if isinstance(self.precision, str) else self.precision.name

    @property
    def pipeline_stages(self) -> int:
        """The number of pipeline stages (1: no pipeline)."""
        return 1 if self.pipeline is None else self.pipeline.stages

    @property
    def compile_mode(self) -> str:
        """``compile`` as one of ``"none"``, ``"module"``, ``"step"``."""
        return compile_mode(self.compile)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated again): ``dataclasses.replace``."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        """The fields as plain values (a ``Precision`` given as an object by its name and loss scale)."""
        values = dataclasses.asdict(self)
        if isinstance(self.precision, Precision):
            values["precision"] = self.precision.name
            loss_scale = getattr(self.precision, "loss_scale", None)
            if isinstance(loss_scale, LossScale):
                values["loss_scale"] = dataclasses.asdict(loss_scale)
        return values


def run_info(config: RunConfig) -> RunInfo:
    """What the hooks read of ``config`` (``RunContext.info``): the hooks' slice."""
    model_dir = config.checkpoint_config.model_dir  # None: in memory, or a quick run (fast_dev_run)
    return RunInfo(
        model_dir=model_dir,
        seed=config.seed,
        log_every_n_steps=config.log_every_n_steps,
        precision=config.precision_name,
    )


def batch_limits(config: RunConfig) -> BatchLimits:
    """How much of each input ``config`` reads: ``fast_dev_run`` over ``overfit_batches`` over the
    ``limit_*_batches``, as in Lightning."""
    for name in ("limit_train_batches", "limit_eval_batches", "overfit_batches"):
        batch_limit(name, getattr(config, name))
    quick = config.fast_dev_run
    if not isinstance(quick, int) or quick < 0:
        raise ConfigError(f"RunConfig.fast_dev_run must be True, False or a positive integer; got {quick!r}")
    if quick:
        return BatchLimits(eval=int(quick), predict=int(quick))  # train: fast_dev_run steps (LoopConfig)
    overfit = config.overfit_batches
    if overfit is not None:
        return BatchLimits(overfit=overfit, eval=overfit)
    return BatchLimits(train=config.limit_train_batches, eval=config.limit_eval_batches)


# -------------------------------------------------------------------- how the slices combine
def _check_precision(config: RunConfig) -> None:
    """The precision (a name or a ``Precision``) and how it combines with the loss scale and the step."""
    given = config.precision
    own = getattr(given, "loss_scale", None)  # an FP16Precision's
    if own is not None and config.loss_scale not in (LossScale(), own):
        raise ConfigError(
            f"RunConfig: loss_scale={config.loss_scale!r} and precision={given!r} both set fp16's loss "
            "scale; give it once, as FP16Precision(loss_scale=...)"
        )
    precision = make_precision(given, config.loss_scale)
    precision.check_run(
        loss_scale=LossScale.of(config.loss_scale), compile_mode=config.compile_mode, cuda_graph=config.cuda_graph
    )


def _check_across(config: RunConfig) -> None:
    """Rules between slices: the CUDA graph and the device, the pipeline and the loop and precision."""
    if config.cuda_graph and config.device == "cpu":  # an auto device is checked when the step is built
        raise ConfigError(
            Reason(
                lambda n: (
                    f"{n('cuda_graph')} needs a CUDA device; {n('device', 'cpu')} (use "
                    f"{n('device', 'cuda')} or drop {n('cuda_graph')})"
                )
            )
        )
    if config.pipeline is None:
        return
    if config.gradient_accumulation_steps != 1:
        raise ConfigError(
            "RunConfig: with a pipeline, micro-batches are PipelineConfig.microbatches; set "
            f"gradient_accumulation_steps=1 (got {config.gradient_accumulation_steps})"
        )
    if not config.make_precision().pipeline_ok or config.compile_mode != "none" or config.cuda_graph:
        raise ConfigError(
            "RunConfig: a pipeline runs the eager step in fp32 or bf16; fp16 loss scaling, bf16-sr "
            f"weights, compile and cuda_graph are not supported with it (got precision={config.precision_name!r}, "
            f"compile={config.compile!r}, cuda_graph={config.cuda_graph})"
        )


__all__ = ["PipelineConfig", "PrecisionName", "RunConfig", "run_info"]
