"""Checks of the flags in ``flags.py``'s table (called from ``BenchConfig.__post_init__``).

Values on their own (allowed choices, signs, ranges), then the combinations they need or
exclude. Each failure is a :class:`BenchFlagError` naming the flags, as everywhere in the
harness. Kept apart from ``config.py`` so the dataclass stays a list of fields.
"""

from __future__ import annotations

from typing import Any

from .errors import fail
from .flags import IMPLEMENTED

#: The flags that turn training into "training + evaluation".
EVAL_DURING_TRAINING_FLAGS: tuple[str, ...] = (
    "eval_during_training_every_n_steps",
    "eval_during_training_every_n_epochs",
    "eval_during_training_at_specified_steps",
    "eval_during_training_at_specified_epochs",
)
_NON_NEGATIVE_INTS = (
    "eval_batch_size",
    "gradient_repacking",
    "save_summaries_steps",
    "datasets_prefetch_buffer_size",
    "datasets_num_private_threads",
)
_POSITIVE = ("num_eval_epochs", "eval_during_training_every_n_epochs", "resnet_base_lr")


def check_tf_flags(cfg: Any) -> None:
    """Raise :class:`BenchFlagError` for a bad value or combination of the table's flags."""
    _check_values(cfg)
    _check_combinations(cfg)


def _check_values(cfg: Any) -> None:
    for flag in IMPLEMENTED:
        value = getattr(cfg, flag.name)
        if flag.choices is not None and value not in flag.choices:
            raise fail(f"--{flag.name}={value!r} is not allowed; allowed values: {', '.join(flag.choices)}", flag.name)
    for name in _NON_NEGATIVE_INTS:
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise fail(f"--{name} must be an integer >= 0; got {value!r}", name)
    if not isinstance(cfg.batch_group_size, int) or cfg.batch_group_size < 1:
        raise fail(f"--batch_group_size must be an integer >= 1; got {cfg.batch_group_size!r}", "batch_group_size")
    for name in _POSITIVE:
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise fail(f"--{name} must be > 0; got {value}", name)
    if cfg.display_perf_ewma is not None and not 0 < cfg.display_perf_ewma <= 1:
        raise fail(f"--display_perf_ewma must be in (0, 1]; got {cfg.display_perf_ewma}", "display_perf_ewma")
    if cfg.summary_verbosity not in (0, 1, 2, 3):
        raise fail(
            f"--summary_verbosity={cfg.summary_verbosity!r} is not allowed; allowed values: 0, 1, 2, 3",
            "summary_verbosity",
        )
    if not 0 <= cfg.gpu_memory_frac_for_testing <= 1:
        raise fail(
            f"--gpu_memory_frac_for_testing must be in [0, 1]; got {cfg.gpu_memory_frac_for_testing}",
            "gpu_memory_frac_for_testing",
        )
    if any(s < 1 for s in cfg.eval_during_training_at_specified_steps):
        raise fail(
            "--eval_during_training_at_specified_steps: steps must be >= 1", "eval_during_training_at_specified_steps"
        )
    if any(e <= 0 for e in cfg.eval_during_training_at_specified_epochs):
        raise fail(
            "--eval_during_training_at_specified_epochs: epochs must be > 0", "eval_during_training_at_specified_epochs"
        )
    gpu_indices(cfg.gpu_indices)  # parses or raises


def _check_combinations(cfg: Any) -> None:
    if cfg.num_eval_batches is not None and cfg.num_eval_epochs is not None:
        raise fail(
            "at most one of --num_eval_batches and --num_eval_epochs may be given",
            "num_eval_batches",
            "num_eval_epochs",
        )
    xla = [n for n in ("xla", "xla_compile") if getattr(cfg, n)]
    if xla and cfg.compile not in (False, "none"):
        raise fail(
            f"--{xla[0]} and --compile both choose the compilation; give one of them "
            "(--xla is --compile=module, --xla_compile is --compile=step)",
            xla[0],
            "compile",
        )
    if cfg.mode == "inference":
        for name in ("ml_perf", "summary_verbosity", "fp16_vars", *EVAL_DURING_TRAINING_FLAGS[1:]):
            if getattr(cfg, name) not in (None, (), False, 0):
                raise fail(f"--{name} does not apply to --mode=inference", name, "mode")


def gpu_indices(text: str) -> tuple[int, ...]:
    """``--gpu_indices="0,2"`` -> ``(0, 2)`` (empty: ``()``)."""
    if not text.strip():
        return ()
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise fail(
            f"--gpu_indices={text!r}: expected comma-separated device numbers, e.g. 0,1,2,3", "gpu_indices"
        ) from None
    if any(v < 0 for v in values) or len(set(values)) != len(values):
        raise fail(f"--gpu_indices={text!r}: device numbers must be >= 0 and distinct", "gpu_indices")
    return values


__all__ = ["EVAL_DURING_TRAINING_FLAGS", "check_tf_flags", "gpu_indices"]
