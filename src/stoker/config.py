"""``RunConfig``: how a run is executed (where, how often to save and log, in what precision).

What the model *is* lives in ``params``; ``RunConfig`` only says how to run it. Every field is
validated when the config is built, and a bad value raises ``ConfigError`` (a ``ValueError``) naming the field and
the values it accepts.

The fields TPUEstimator users know (``model_dir``, ``save_checkpoints_steps``,
``iterations_per_loop``, ``log_every_n_steps``, ``seed``, ...) are flat. stoker's own groups of
settings are small config objects that live beside the component they configure and validate
themselves: ``pipeline`` (``stoker.distributed.PipelineConfig``), ``loss_scale``
(``stoker.precision.LossScale``) and ``checkpoint_io`` (``stoker.checkpoint.CheckpointIO``).
``RunConfig`` checks how they combine with the rest of the run.

The flat spellings of those groups before 0.2 (``pipeline_split=``, ``loss_scale_init=``,
``async_checkpoints=``, ... see ``DEPRECATED``) still work for one release, as keywords and as
attributes, with a ``DeprecationWarning`` naming the new spelling.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from .checkpoint.io_config import CheckpointIO
from .distributed.pipeline import PIPELINE_SCHEDULES, PipelineConfig, check_schedule  # noqa: F401 - re-exported
from .distributed.watchdog import StuckReplica
from .errors import ConfigError
from .kernels.linear import FAST_LINEAR_MODES
from .kernels.sgd_in_backward import SGD_IN_BACKWARD_MODES
from .precision import PRECISIONS, LossScale, Precision, make_precision  # noqa: F401 - PRECISIONS re-exported

PrecisionName = Literal["fp32", "bf16", "fp16", "bf16-sr"]
STRATEGIES: tuple[str, ...] = ("auto", "single", "replicated", "sharded", "independent", "pipeline")
COMPILE_MODES: tuple[str, ...] = ("none", "module", "step")  # also True (= "module") and False (= "none")

#: the groups' defaults; a field that still holds its default object was not given (see ``_new_spelling``)
_DEFAULT_LOSS_SCALE = LossScale()
_DEFAULT_CHECKPOINT_IO = CheckpointIO()
_DEFAULT_STUCK_REPLICA = StuckReplica()
_GROUPS: dict[str, type] = {"pipeline": PipelineConfig, "loss_scale": LossScale, "checkpoint_io": CheckpointIO}
_GROUP_DEFAULTS: dict[str, object] = {
    "pipeline": None,
    "loss_scale": _DEFAULT_LOSS_SCALE,
    "checkpoint_io": _DEFAULT_CHECKPOINT_IO,
}

#: the flat spellings before 0.2 (keywords and attributes) -> (the RunConfig field, the group's field);
#: they go away in the release after 0.2
DEPRECATED: dict[str, tuple[str, str]] = {
    "pipeline_split": ("pipeline", "split"),
    "pipeline_microbatches": ("pipeline", "microbatches"),
    "pipeline_schedule": ("pipeline", "schedule"),
    "pipeline_stages_per_process": ("pipeline", "stages_per_process"),
    "loss_scale_init": ("loss_scale", "init"),
    "loss_scale_growth_interval": ("loss_scale", "growth_interval"),
    "async_checkpoints": ("checkpoint_io", "async_save"),
    "storage_retry": ("checkpoint_io", "retry"),
}


def _old_attribute(name: str) -> property:
    """The flat attribute ``name`` before 0.2: reads its group's field with a ``DeprecationWarning``."""
    group, attr = DEPRECATED[name]
    where = f"RunConfig.{group}.{attr}" + (
        " (RunConfig.pipeline is None without a pipeline)" if group == "pipeline" else ""
    )

    def read(config: RunConfig) -> Any:
        warnings.warn(
            f"RunConfig.{name} is deprecated; read {where}; the old attribute goes away after 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        value = getattr(config, group)
        if value is None:  # no pipeline: what the flat fields held then
            return {"split": None, "microbatches": 1, "schedule": "1f1b", "stages_per_process": 1}[attr]
        return getattr(LossScale.of(value) if group == "loss_scale" else value, attr)

    return property(read, doc=f"Deprecated: read {where}.")


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
            evaluation value of ``metric``, apart from the newest ones.
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
        fast_linear: which kernel ``nn.Linear`` runs on the CPU (``docs/bench.md``, "Fast linear"):
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
        progress_bar: show a tqdm bar when stderr is a terminal.
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
        pipeline: pipeline parallelism (``docs/model_parallel.md``): ``None`` (no pipeline) or a
            ``stoker.distributed.PipelineConfig``: the module names to split the model before,
            the micro-batches, the schedule and the stages per process. Under torchrun the
            processes form ``replicas x stages``; in one process the model runs unsplit (the
            names are still checked). It runs the eager step in fp32 or bf16, with
            ``strategy`` ``auto`` or ``pipeline`` and ``gradient_accumulation_steps=1``.
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
    keep_best: tuple[str, str] | None = None
    log_every_n_steps: int | None = 100
    precision: PrecisionName | Precision = "fp32"
    loss_scale: LossScale | float | Literal["dynamic"] = _DEFAULT_LOSS_SCALE
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
    stuck_replica: StuckReplica | None = _DEFAULT_STUCK_REPLICA
    deterministic: bool = False
    mlperf_log: bool = False
    recompute: str | tuple[str, ...] | None = None
    pipeline: PipelineConfig | None = None
    checkpoint_io: CheckpointIO = _DEFAULT_CHECKPOINT_IO

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_io, CheckpointIO):
            raise ConfigError(
                "RunConfig.checkpoint_io must be a stoker.checkpoint.CheckpointIO(async_save=..., retry=...); "
                f"got {self.checkpoint_io!r}"
            )
        if self.stuck_replica is not None and not isinstance(self.stuck_replica, StuckReplica):
            raise ConfigError(
                "RunConfig.stuck_replica must be a stoker.distributed.StuckReplica(factor=..., min_seconds=...) or "
                f"None; got {self.stuck_replica!r}"
            )
        self.loss_scale = LossScale.of(self.loss_scale)
        if self.model_dir is not None:
            self.model_dir = os.fspath(self.model_dir)
        _positive_int("iterations_per_loop", self.iterations_per_loop)
        _positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        if self.log_every_n_steps is not None:
            _positive_int("log_every_n_steps", self.log_every_n_steps)
        if self.keep_checkpoint_max < 0:
            raise ConfigError(
                f"RunConfig.keep_checkpoint_max must be >= 0 (0 keeps all), got {self.keep_checkpoint_max}"
            )
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise ConfigError(
                "RunConfig: set at most one of save_checkpoints_steps and save_checkpoints_secs "
                f"(got {self.save_checkpoints_steps} and {self.save_checkpoints_secs})"
            )
        if self.save_checkpoints_steps is not None:
            _positive_int("save_checkpoints_steps", self.save_checkpoints_steps)
        if self.save_checkpoints_secs is not None and not self.save_checkpoints_secs > 0:
            raise ConfigError(f"RunConfig.save_checkpoints_secs must be > 0, got {self.save_checkpoints_secs}")
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            self.save_checkpoints_secs = 600.0
        self._check_precision()
        if self.keep_best is not None:
            if (
                not isinstance(self.keep_best, (tuple, list))
                or len(self.keep_best) != 2
                or self.keep_best[1] not in ("min", "max")
            ):
                raise ConfigError(f"RunConfig.keep_best must be (metric_name, 'min' | 'max'); got {self.keep_best!r}")
            self.keep_best = (str(self.keep_best[0]), str(self.keep_best[1]))
        if self.gradient_clip_norm is not None and not self.gradient_clip_norm > 0:
            raise ConfigError(f"RunConfig.gradient_clip_norm must be > 0; got {self.gradient_clip_norm}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"RunConfig.strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        if self.ddp_bucket_cap_mb is not None and not self.ddp_bucket_cap_mb > 0:
            raise ConfigError(f"RunConfig.ddp_bucket_cap_mb must be > 0; got {self.ddp_bucket_cap_mb}")
        if self.prefetch_depth < 0:
            raise ConfigError(f"RunConfig.prefetch_depth must be >= 0; got {self.prefetch_depth}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"RunConfig.device must be auto, cpu, cuda or cuda:N; got {self.device!r}")
        if not (isinstance(self.compile, bool) or self.compile in COMPILE_MODES):
            raise ConfigError(
                f"RunConfig.compile must be True, False, {', '.join(map(repr, COMPILE_MODES))}; got {self.compile!r}"
            )
        if self.fast_linear not in FAST_LINEAR_MODES:
            raise ConfigError(
                f"RunConfig.fast_linear must be one of {', '.join(FAST_LINEAR_MODES)}; got {self.fast_linear!r}"
            )
        if self.sgd_in_backward not in SGD_IN_BACKWARD_MODES:
            raise ConfigError(
                f"RunConfig.sgd_in_backward must be one of {', '.join(SGD_IN_BACKWARD_MODES)}; "
                f"got {self.sgd_in_backward!r}"
            )
        if not isinstance(self.cuda_graph, bool):
            raise ConfigError(f"RunConfig.cuda_graph must be True or False; got {self.cuda_graph!r}")
        if self.cuda_graph and self.device == "cpu":
            raise ConfigError(
                "RunConfig.cuda_graph=True needs a CUDA device; device is 'cpu' (set device='cuda' or cuda_graph=False)"
            )
        if self.cuda_graph and self.compile_mode == "step":
            raise ConfigError("RunConfig: cuda_graph=True and compile='step' are two ways to run the step; pick one")
        self.recompute = _recompute_spec(self.recompute)
        self._check_pipeline()
        if not self.distributed_timeout > 0:
            raise ConfigError(f"RunConfig.distributed_timeout must be > 0; got {self.distributed_timeout}")

    def _check_precision(self) -> None:
        """The precision (a name or a ``Precision``) and how it combines with the loss scale and the step."""
        given = self.precision
        if isinstance(given, Precision) and given.name == "fp16" and self.loss_scale != LossScale():
            if self.loss_scale != getattr(given, "loss_scale", None):
                raise ConfigError(
                    f"RunConfig: loss_scale={self.loss_scale!r} and precision={given!r} both set fp16's loss "
                    "scale; give it once, as FP16Precision(loss_scale=...)"
                )
        precision = make_precision(given, self.loss_scale)
        precision.check_run(
            loss_scale=LossScale.of(self.loss_scale), compile_mode=self.compile_mode, cuda_graph=self.cuda_graph
        )

    @property
    def precision_name(self) -> str:
        """``precision`` as its name (``"bf16"``), also when a ``Precision`` was given."""
        return self.precision if isinstance(self.precision, str) else self.precision.name

    def make_precision(self) -> Precision:
        """A fresh ``Precision`` for this run (its own loss scaler): what the Estimator hands the engine."""
        return make_precision(self.precision, self.loss_scale)

    def _check_pipeline(self) -> None:
        """How ``pipeline`` combines with the rest of the run (``PipelineConfig`` checks itself)."""
        pipeline = self.pipeline
        if pipeline is None:
            if self.strategy == "pipeline":
                raise ConfigError(
                    "RunConfig.strategy='pipeline' needs pipeline=PipelineConfig(split=...) (the module names to "
                    "split before)"
                )
            return
        if not isinstance(pipeline, PipelineConfig):
            raise ConfigError(
                "RunConfig.pipeline must be None or a stoker.distributed.PipelineConfig(split=..., ...); "
                f"got {pipeline!r}"
            )
        if self.strategy not in ("auto", "pipeline"):
            raise ConfigError(f"RunConfig.pipeline needs strategy 'auto' or 'pipeline'; got {self.strategy!r}")
        if self.gradient_accumulation_steps != 1:
            raise ConfigError(
                "RunConfig: with a pipeline, micro-batches are PipelineConfig.microbatches; set "
                f"gradient_accumulation_steps=1 (got {self.gradient_accumulation_steps})"
            )
        if not self.make_precision().pipeline_ok or self.compile_mode != "none" or self.cuda_graph:
            raise ConfigError(
                "RunConfig: a pipeline runs the eager step in fp32 or bf16; fp16 loss scaling, bf16-sr "
                f"weights, compile and cuda_graph are not supported with it (got precision={self.precision_name!r}, "
                f"compile={self.compile!r}, cuda_graph={self.cuda_graph})"
            )

    @property
    def pipeline_stages(self) -> int:
        """The number of pipeline stages (1: no pipeline)."""
        return 1 if self.pipeline is None else self.pipeline.stages

    @property
    def compile_mode(self) -> str:
        """``compile`` as one of ``"none"``, ``"module"``, ``"step"``."""
        if isinstance(self.compile, bool):
            return "module" if self.compile else "none"
        return self.compile

    def replace(self, **changes: object) -> RunConfig:
        """A copy with some fields changed (validated again).

        A deprecated flat name (``pipeline_microbatches=8``) changes that setting of the group
        this config holds, with a ``DeprecationWarning`` (``dataclasses.replace`` passes every
        field, so there a deprecated name collides with its group).
        """
        return dataclasses.replace(self, **_new_spelling(changes, base=self))

    # The flat attributes before 0.2, read with a DeprecationWarning naming the new one.
    pipeline_split = _old_attribute("pipeline_split")
    pipeline_microbatches = _old_attribute("pipeline_microbatches")
    pipeline_schedule = _old_attribute("pipeline_schedule")
    pipeline_stages_per_process = _old_attribute("pipeline_stages_per_process")
    loss_scale_init = _old_attribute("loss_scale_init")
    loss_scale_growth_interval = _old_attribute("loss_scale_growth_interval")
    async_checkpoints = _old_attribute("async_checkpoints")
    storage_retry = _old_attribute("storage_retry")

    def to_dict(self) -> dict[str, object]:
        """The fields as plain values (a ``Precision`` given as an object by its name and loss scale)."""
        values = dataclasses.asdict(self)
        if isinstance(self.precision, Precision):
            values["precision"] = self.precision.name
            loss_scale = getattr(self.precision, "loss_scale", None)
            if isinstance(loss_scale, LossScale):
                values["loss_scale"] = dataclasses.asdict(loss_scale)
        return values


_dataclass_init = RunConfig.__init__


@functools.wraps(_dataclass_init)
def _init(self: RunConfig, **kwargs: Any) -> None:
    _dataclass_init(self, **_new_spelling(kwargs))


RunConfig.__init__ = _init  # type: ignore[method-assign]  # the deprecated flat keywords, then the dataclass's


# ==================================================================== the spellings before 0.2
_CLASS_NAMES = {"pipeline": "PipelineConfig", "loss_scale": "LossScale", "checkpoint_io": "CheckpointIO"}


def _new_spelling(kwargs: dict[str, Any], base: RunConfig | None = None) -> dict[str, Any]:
    """``kwargs`` with the deprecated flat keywords folded into their groups (a warning each).

    Building a config (``base`` is ``None``), an old keyword beside its group given as an object
    (anything but the default) is a ``ConfigError``; the short forms ``loss_scale="dynamic"`` /
    ``128`` are not group objects and take ``loss_scale_init`` / ``loss_scale_growth_interval``
    as before. Replacing (``base`` given), the old keywords change ``base``'s group, and an old
    keyword beside its group is an error.
    """
    old = {name: kwargs[name] for name in kwargs if name in DEPRECATED}
    if not old:
        return kwargs
    new = {k: v for k, v in kwargs.items() if k not in DEPRECATED}
    by_group: dict[str, dict[str, Any]] = {}
    for name, value in old.items():
        group, attr = DEPRECATED[name]
        by_group.setdefault(group, {})[attr] = value
    for group, values in by_group.items():
        names = [n for n in old if DEPRECATED[n][0] == group]
        given = group in new and (base is not None or _is_group_object(group, new[group]))
        if given:
            spelled = ", ".join(f"{n}=" for n in names)
            raise ConfigError(
                f"RunConfig: {spelled} and {group}= both given; {spelled} is the deprecated spelling of "
                f"{group}={_CLASS_NAMES[group]}(...): pass only {group}={_new_form(group, values)}"
            )
    for name in old:
        group, attr = DEPRECATED[name]
        warnings.warn(
            f"RunConfig({name}=...) is deprecated; use RunConfig({group}={_CLASS_NAMES[group]}({attr}=...)) "
            f"(stoker.{_CLASS_NAMES[group]}); the old keyword goes away after 0.2",
            DeprecationWarning,
            stacklevel=3,  # the caller of RunConfig(...) or RunConfig.replace(...)
        )
    for group, values in by_group.items():
        start = getattr(base, group) if base is not None else new.get(group, _GROUP_DEFAULTS[group])
        new[group] = _merge(group, start, values)
    return new


def _is_group_object(group: str, value: object) -> bool:
    """Whether ``value`` is a group object someone passed (not the field's default)."""
    return isinstance(value, _GROUPS[group]) and value is not _GROUP_DEFAULTS[group]


def _merge(group: str, start: Any, values: dict[str, Any]) -> Any:
    """``start`` (the group, its default or a short form) with the deprecated keywords' ``values`` set."""
    if group == "loss_scale":
        scale = LossScale.of(start)
        if not scale.dynamic:  # as before 0.2: a static scale has no initial scale to set
            values = {k: v for k, v in values.items() if k != "init"}
        return dataclasses.replace(scale, **values)
    if group == "checkpoint_io":
        return dataclasses.replace(start, **values)
    # pipeline: the split makes a pipeline; the other keywords without one are checked and have no effect
    current = {} if start is None else {f.name: getattr(start, f.name) for f in dataclasses.fields(start)}
    settings = {**current, **values}
    if settings.get("split") is None:
        check_schedule(
            settings.get("microbatches", 1), settings.get("schedule", "1f1b"), settings.get("stages_per_process", 1)
        )
        return None
    return PipelineConfig(**settings)


def _new_form(group: str, values: dict[str, Any]) -> str:
    """How the deprecated keywords' ``values`` are spelled now, e.g. ``LossScale(init=1048576.0)``."""
    return f"{_CLASS_NAMES[group]}({', '.join(f'{k}={v!r}' for k, v in values.items())})"


def _recompute_spec(value: object) -> str | tuple[str, ...] | None:
    """``None``, ``"all"`` or a tuple of non-empty glob patterns (a single pattern or a list is accepted)."""
    if value is None or value == "all":
        return value
    patterns = [value] if isinstance(value, str) else value
    if (
        not isinstance(patterns, (list, tuple))
        or not patterns
        or not all(isinstance(p, str) and p.strip() for p in patterns)
    ):
        raise ConfigError(
            "RunConfig.recompute must be None, 'all', or module-name patterns (a string or a list of "
            f"strings such as 'layers.*'); got {value!r}"
        )
    return tuple(p.strip() for p in patterns)


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"RunConfig.{name} must be a positive integer; got {value!r}")
