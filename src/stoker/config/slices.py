"""The engine components' config slices: what each one is handed instead of the whole ``RunConfig``.

Each slice is a frozen keyword-only dataclass that validates itself; its fields keep the flat
``RunConfig`` names the user wrote (so an error names ``RunConfig.iterations_per_loop``, the
spelling the user knows). ``RunConfig`` builds them (``loop_config``, ``input_config``, ...) and
the Estimator hands each to its component:

- ``LoopConfig``: the training loop and its step (``TrainingRun``, ``make_train_step``, the
  default hooks);
- ``InputConfig``: batching and the infeed (``InputPlan``);
- ``StateConfig``: building the model and optimizer (``ModelState``);
- ``EvalConfig``: evaluation (``EvaluationRun``);
- ``RunInfo``: what the hooks read of the run's configuration (``RunContext.info``).

The other components' slices live beside them: ``stoker.checkpoint.CheckpointConfig``,
``stoker.distributed.DistributionConfig`` and the ``stoker.precision.Precision`` objects. The
engine's slices live here rather than in ``stoker.engine`` because the hooks may import the
config, and the hooks must never reach the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..checkpoint.index import KeepBest
from ..distributed.pipeline import PipelineConfig
from ..distributed.watchdog import StuckReplica
from ..errors import ConfigError
from ..kernels.linear import FAST_LINEAR_MODES
from ..kernels.sgd_in_backward import SGD_IN_BACKWARD_MODES
from .changes import ON_CHANGED_OPTIMIZER

COMPILE_MODES: tuple[str, ...] = ("none", "module", "step")  # also True (= "module") and False (= "none")


def positive_int(name: str, value: object) -> None:
    """Raise a ``ConfigError`` naming ``RunConfig.<name>`` unless ``value`` is an int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"RunConfig.{name} must be a positive integer; got {value!r}")


def compile_mode(value: object) -> str:
    """``RunConfig.compile`` as one of ``COMPILE_MODES`` (``True``: ``"module"``, ``False``: ``"none"``)."""
    if isinstance(value, bool):
        return "module" if value else "none"
    if value not in COMPILE_MODES:
        raise ConfigError(
            f"RunConfig.compile must be True, False, {', '.join(map(repr, COMPILE_MODES))}; got {value!r}"
        )
    return str(value)


def _positive_or_none(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ConfigError(f"RunConfig.{name} must be > 0; got {value}")


@dataclass(frozen=True, kw_only=True)
class EMA:
    """An exponential moving average of the weights, kept beside them (``RunConfig.ema``; the
    average itself is ``stoker.engine.ema.EmaWeights``, docs/checkpoints.md "EMA weights").

    Attributes:
        decay: each update keeps ``decay`` of the average and takes ``1 - decay`` of the weights
            (torch's ``get_ema_multi_avg_fn``), in ``[0, 1)``.
        start_step: the first global step the average may be updated at; its first update copies
            the weights.
        every_n_steps: it is updated after each global step from ``start_step`` on that is a
            multiple of this.
        use_for_inference: ``evaluate``, ``predict`` and ``export`` (so ``keep_best`` and ``stoker
            serve`` too) use the average once it has started; ``False``: it is only kept, in every
            checkpoint's ``ema.safetensors``.
    """

    decay: float = 0.999
    start_step: int = 0
    every_n_steps: int = 1
    use_for_inference: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)) or not 0.0 <= self.decay < 1.0:
            raise ConfigError(f"EMA.decay must be a number in [0, 1); got {self.decay!r}")
        if not isinstance(self.start_step, int) or isinstance(self.start_step, bool) or self.start_step < 0:
            raise ConfigError(f"EMA.start_step must be an integer >= 0; got {self.start_step!r}")
        if not isinstance(self.every_n_steps, int) or isinstance(self.every_n_steps, bool) or self.every_n_steps < 1:
            raise ConfigError(f"EMA.every_n_steps must be a positive integer; got {self.every_n_steps!r}")
        if not isinstance(self.use_for_inference, bool):
            raise ConfigError(f"EMA.use_for_inference must be True or False; got {self.use_for_inference!r}")

    def updates_at(self, step: int) -> bool:
        """Whether the average is updated after global step ``step``."""
        return step >= self.start_step and step % self.every_n_steps == 0


def batch_limit(name: str, value: object) -> None:
    """Raise a ``ConfigError`` naming ``RunConfig.<name>`` unless ``value`` is ``None``, an int >= 1
    (batches) or a float in (0, 1] (a fraction of the input's length), as Lightning's ``limit_*``."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return
    raise ConfigError(
        f"RunConfig.{name} must be None, a positive integer (batches) or a fraction in (0, 1]; got {value!r}"
    )


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    """How much of each input a quick run reads (``RunConfig.fast_dev_run``, ``limit_train_batches``,
    ``limit_eval_batches``, ``overfit_batches``: Lightning's flags; ``stoker.engine.limits``).

    Attributes:
        train: batches of every epoch of the train input (then the next epoch).
        overfit: the train input's first batches, read over and over (an epoch is those).
        eval / predict: batches of each evaluation / prediction.

    Each is a count, a fraction of the input's length (a float in (0, 1]) or ``None`` (all).
    """

    train: int | float | None = None
    overfit: int | float | None = None
    eval: int | float | None = None
    predict: int | float | None = None

    def __post_init__(self) -> None:
        for name in ("train", "overfit", "eval", "predict"):
            batch_limit(f"limit_{name}_batches" if name != "overfit" else "overfit_batches", getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The training loop's slice: steps per loop, the step's shape, the default hooks' settings, and
    how long a replica may wait in a collective before it names the stuck ones (``stuck_replica``).
    ``fast_dev_run``: the steps a quick run trains (0: a run as asked).

    ``compile`` is held as its mode (``"none"``, ``"module"``, ``"step"``).
    """

    iterations_per_loop: int = 10
    gradient_accumulation_steps: int = 1
    gradient_clip_norm: float | None = None
    compile: str = "none"
    cuda_graph: bool = False
    log_every_n_steps: int | None = 100
    progress_bar: bool = True
    summaries: bool = True
    mlperf_log: bool = False
    stuck_replica: StuckReplica | None = field(default_factory=StuckReplica)
    fast_dev_run: int = 0

    def __post_init__(self) -> None:
        if self.stuck_replica is not None and not isinstance(self.stuck_replica, StuckReplica):
            raise ConfigError(
                "RunConfig.stuck_replica must be a stoker.distributed.StuckReplica(factor=..., min_seconds=...) or "
                f"None; got {self.stuck_replica!r}"
            )
        positive_int("iterations_per_loop", self.iterations_per_loop)
        positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        if self.log_every_n_steps is not None:
            positive_int("log_every_n_steps", self.log_every_n_steps)
        _positive_or_none("gradient_clip_norm", self.gradient_clip_norm)
        object.__setattr__(self, "compile", compile_mode(self.compile))
        if not isinstance(self.cuda_graph, bool):
            raise ConfigError(f"RunConfig.cuda_graph must be True or False; got {self.cuda_graph!r}")
        if self.cuda_graph and self.compile == "step":
            raise ConfigError("RunConfig: cuda_graph=True and compile='step' are two ways to run the step; pick one")


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What the hooks read of the run's configuration (``RunContext.info``), read-only: the
    hooks are handed this, never the whole ``RunConfig``.

    Attributes:
        model_dir: ``RunConfig.model_dir`` as a string (``None``: a run kept in memory).
        seed: ``RunConfig.seed``.
        log_every_n_steps: the interval of the log line (``None``: no log lines); the default of
            the hooks that act every N steps (trackers, ``source="train"`` checks).
        precision: the precision's name (``"fp32"``, ``"bf16"``, ``"fp16"``, ``"bf16-sr"``).
    """

    model_dir: str | None = None
    seed: int = 0
    log_every_n_steps: int | None = 100
    precision: str = "fp32"


@dataclass(frozen=True, kw_only=True)
class InputConfig:
    """The input's slice: how ``InputPlan`` divides batches and builds infeeds, and how much of each
    input a quick run reads (``limits``)."""

    seed: int = 0
    prefetch_depth: int = 2
    iterations_per_loop: int = 10
    gradient_accumulation_steps: int = 1
    microbatches: int = 1
    limits: BatchLimits = field(default_factory=BatchLimits)

    def __post_init__(self) -> None:
        if not isinstance(self.prefetch_depth, int) or self.prefetch_depth < 0:
            raise ConfigError(f"RunConfig.prefetch_depth must be >= 0; got {self.prefetch_depth}")
        positive_int("iterations_per_loop", self.iterations_per_loop)
        positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ConfigError(f"PipelineConfig.microbatches must be a positive integer; got {self.microbatches!r}")

    @property
    def snapshot_every(self) -> int:
        """Batches between the infeed's position snapshots: one loop's worth."""
        return self.iterations_per_loop * self.gradient_accumulation_steps


@dataclass(frozen=True, kw_only=True)
class StateConfig:
    """``ModelState``'s slice: how the model and optimizer are built.

    The step's shape (accumulation, clipping, compile, CUDA graph) is here too, since whether
    ``sgd_in_backward`` can apply depends on it. ``recompute`` is held as ``None``, ``"all"`` or
    a tuple of patterns. ``on_changed_optimizer``: what a resumed run does with an optimizer or
    schedule setting that differs from its checkpoint's (``stoker.config.changes``). ``ema``:
    the moving average of the weights ``ModelState`` keeps beside them.
    """

    seed: int = 0
    deterministic: bool = False
    compile: str = "none"
    cuda_graph: bool = False
    fast_linear: str = "off"
    sgd_in_backward: str = "off"
    recompute: str | tuple[str, ...] | None = None
    pipeline: PipelineConfig | None = None
    gradient_accumulation_steps: int = 1
    gradient_clip_norm: float | None = None
    async_save: bool = False
    on_changed_optimizer: str = "refuse"
    ema: EMA | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "compile", compile_mode(self.compile))
        if self.ema is not None and not isinstance(self.ema, EMA):
            raise ConfigError(f"RunConfig.ema must be None or a stoker.EMA(decay=...); got {self.ema!r}")
        if self.ema is not None and self.pipeline is not None:
            raise ConfigError("RunConfig: ema is not supported with a pipeline (each stage holds only its layers)")
        if self.on_changed_optimizer not in ON_CHANGED_OPTIMIZER:
            raise ConfigError(
                f"RunConfig.on_changed_optimizer must be one of {', '.join(ON_CHANGED_OPTIMIZER)}; "
                f"got {self.on_changed_optimizer!r}"
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
        object.__setattr__(self, "recompute", recompute_spec(self.recompute))
        positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        _positive_or_none("gradient_clip_norm", self.gradient_clip_norm)
        if self.pipeline is not None and not isinstance(self.pipeline, PipelineConfig):
            raise ConfigError(
                "RunConfig.pipeline must be None or a stoker.distributed.PipelineConfig(split=..., ...); "
                f"got {self.pipeline!r}"
            )


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Evaluation's slice: the seed its input is built with, summaries, what ``keep_best`` watches,
    and the device as configured (``evaluate_continuously(device=...)`` evaluates on a copy elsewhere)."""

    seed: int = 0
    summaries: bool = True
    keep_best: KeepBest | None = None
    device: str = "auto"


def recompute_spec(value: object) -> str | tuple[str, ...] | None:
    """``None``, ``"all"`` or a tuple of non-empty glob patterns (a single pattern or a list is accepted)."""
    if value is None:
        return None
    if value == "all":
        return "all"
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


__all__ = [
    "COMPILE_MODES",
    "EMA",
    "BatchLimits",
    "EvalConfig",
    "InputConfig",
    "LoopConfig",
    "StateConfig",
    "compile_mode",
    "positive_int",
    "recompute_spec",
]
