"""``BenchConfig``: every setting of one ``stoker bench`` run, each declared once, validated once.

Field names are tf_cnn_benchmarks' flag names, so ``--batch_size=32`` becomes
``BenchConfig(batch_size=32)``. ``BenchConfig`` joins the dataclasses of
:mod:`stoker.bench.settings`, one per ``--help`` group, where each flag is declared once: its
default, help, group, allowed values and range, from which the parser, ``--help`` and
docs/bench-reference.md's flag lists are made (:mod:`stoker.bench.flags` says why this shape).
``__post_init__`` checks every value against its declaration and then the combinations
(:func:`stoker.bench.checks.validate`), raising :class:`~stoker.errors.FlagError`, which names the flags
(the command line prints it and exits with status 2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import FlagError
from ..flags import field_flags
from .checks import EVAL_DURING_TRAINING_FLAGS, parse_piecewise_schedule, validate
from .settings import (
    DATA_FORMATS,
    DATA_NAMES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_FP16_LOSS_SCALE,
    DEFAULT_INFERENCE_ITERATIONS,
    DEFAULT_LEARNING_RATE,
    DEFAULT_NUM_BATCHES,
    DEVICES,
    FALLBACK_BATCH_SIZE,
    MODE_EVAL,
    MODE_FORWARD_ONLY,
    MODE_INFERENCE,
    MODE_TRAIN,
    MODE_TRAIN_AND_EVAL,
    OPTIMIZERS,
    PRECISIONS,
    RUN_MODES,
    VARIABLE_UPDATES,
    AmountFlags,
    DeviceFlags,
    EvaluationFlags,
    InferenceFlags,
    InputFlags,
    MoreTfFlags,
    OptimizerFlags,
    OutputFlags,
    RunFlags,
)


@dataclass(kw_only=True)
class BenchConfig(
    MoreTfFlags,
    InferenceFlags,
    OutputFlags,
    EvaluationFlags,
    OptimizerFlags,
    InputFlags,
    DeviceFlags,
    AmountFlags,
    RunFlags,
):
    """Settings of a benchmark run: one field per flag, declared with its help in the dataclass
    of its ``--help`` group (``--help`` and docs/bench-reference.md are made from these declarations; see
    :mod:`stoker.bench.flags`).

    ``None`` means "not given" where the default depends on other settings (``num_batches``,
    ``init_learning_rate``, the fp16 flags, the inference flags), so that a flag given in the
    wrong mode can be refused rather than silently ignored.
    """

    #: noted flags that were given, as (name, value): each prints a ``Note:`` line (flags.py)
    noted_flags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        validate(self, field_flags(type(self)))

    # ------------------------------------------------------------------ derived
    @property
    def benchmark_mode(self) -> str:
        """tf_cnn_benchmarks' name of what runs: training, evaluation, forward-only, ... ."""
        if self.mode == "inference":
            return MODE_INFERENCE
        if self.eval:
            return MODE_EVAL
        if self.forward_only:
            return MODE_FORWARD_ONLY
        if self.evaluates_during_training:
            return MODE_TRAIN_AND_EVAL
        return MODE_TRAIN

    @property
    def evaluates_during_training(self) -> bool:
        """Any of the ``--eval_during_training_*`` flags is given."""
        return any(getattr(self, name) not in (None, ()) for name in EVAL_DURING_TRAINING_FLAGS)

    @property
    def compile_mode(self) -> bool | str:
        """``--compile``, or what ``--xla`` (the model) / ``--xla_compile`` (the step) ask for."""
        if self.xla_compile:
            return "step"
        if self.xla:
            return "module"
        return self.compile

    @property
    def channels_last(self) -> bool:
        """``--data_format=NHWC``. Left out (``None``), :func:`stoker.bench.run_benchmark` first
        replaces it with the model's default on the device (:func:`stoker.resolve.data_format`)."""
        return self.data_format == "NHWC"

    @property
    def learning_rate(self) -> float:
        """The initial learning rate (the first piece of a piecewise schedule, else the flag or default)."""
        if self.piecewise_learning_rate_schedule is not None:
            return parse_piecewise_schedule(self.piecewise_learning_rate_schedule)[1][0]
        return DEFAULT_LEARNING_RATE if self.init_learning_rate is None else self.init_learning_rate

    def replace(self, **changes: Any) -> BenchConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


__all__ = [
    "DATA_FORMATS",
    "DATA_NAMES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_FP16_LOSS_SCALE",
    "DEFAULT_INFERENCE_ITERATIONS",
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_NUM_BATCHES",
    "DEVICES",
    "FALLBACK_BATCH_SIZE",
    "MODE_EVAL",
    "MODE_FORWARD_ONLY",
    "MODE_INFERENCE",
    "MODE_TRAIN",
    "MODE_TRAIN_AND_EVAL",
    "OPTIMIZERS",
    "PRECISIONS",
    "RUN_MODES",
    "VARIABLE_UPDATES",
    "BenchConfig",
    "FlagError",
    "parse_piecewise_schedule",
]
