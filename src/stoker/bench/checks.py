"""Checks of a ``BenchConfig``: each flag's value against its declaration, then the combinations.

:func:`validate` (called by ``BenchConfig.__post_init__``) checks every field against its
:class:`~stoker.bench.flags.Flag` (allowed values, integers, ranges), then the flags that need
or exclude each other, one function per topic. Each failure is a :class:`FlagError`
naming the flags and, for a value, the allowed ones (the command line prints it on one line
and exits 2). Checks that need the model registry, the data folder or the devices live in
:func:`stoker.bench.workload.resolve_workload`; what the engine refuses (a CUDA graph that cannot
be captured, an SGD update that cannot move into the backward) is the engine's rule, asked by
:mod:`stoker.bench.plan` and said in the flags' words.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..flags import Flag, check_value, fail
from ..storage import check_dir

#: The flags that turn training into "training + evaluation".
EVAL_DURING_TRAINING_FLAGS: tuple[str, ...] = (
    "eval_during_training_every_n_steps",
    "eval_during_training_every_n_epochs",
    "eval_during_training_at_specified_steps",
    "eval_during_training_at_specified_epochs",
)
#: tf_cnn_benchmarks' cross-machine --variable_update modes: refused with a pointer to stoker's.
_MULTI_PROCESS_UPDATES = ("distributed_replicated", "distributed_all_reduce", "collective_all_reduce", "horovod")
#: What --mode=inference refuses: switches, and flags that are None unless given.
_TRAINING_SWITCHES: tuple[str, ...] = ("eval", "forward_only", "print_training_accuracy")
_TRAINING_ONLY: tuple[str, ...] = (
    "eval_during_training_every_n_steps",
    "num_batches",
    "num_epochs",
    "save_model_steps",
    "save_model_secs",
    "trace_file",
)
#: What only --mode=inference takes.
_INFERENCE_ONLY: tuple[str, ...] = ("num_inference_threads", "iterations", "exported")


def validate(cfg: Any, flags: tuple[Flag, ...]) -> None:
    """Raise :class:`FlagError` for the first bad value (``flags``: ``cfg``'s declared
    fields) or combination."""
    if not (isinstance(cfg.compile, bool) or cfg.compile in ("none", "module", "step")):
        raise fail(f"--compile={cfg.compile!r} is not allowed; allowed values: true, false, module, step", "compile")
    if cfg.variable_update in _MULTI_PROCESS_UPDATES:
        allowed = next(f for f in flags if f.name == "variable_update").choices or ()
        raise fail(
            f"--variable_update={cfg.variable_update!r} is not allowed (a TensorFlow cross-machine mode: stoker "
            "runs replicas as processes, with --num_gpus=N or under torchrun, and --variable_update=replicated "
            f"or sharded); allowed values: {', '.join(allowed)}",
            "variable_update",
        )
    for flag in flags:
        check_value(flag, getattr(cfg, flag.name))
    gpu_indices(cfg.gpu_indices)  # parses or raises
    _check_tf_combinations(cfg)
    _check_devices(cfg)
    _check_combinations(cfg)
    _check_learning_rate(cfg)
    _check_output_dirs(cfg)


def _check_output_dirs(cfg: Any) -> None:
    """--train_dir and --benchmark_log_dir must be directories this user can write (or create):
    refused now, before the header, not at the first checkpoint or after the run."""
    for name in ("train_dir", "benchmark_log_dir"):
        path = getattr(cfg, name)
        if path is not None:
            try:
                check_dir(path, f"--{name}")
            except ConfigError as e:
                raise fail(str(e), name) from None


def _check_devices(cfg: Any) -> None:
    # (--cuda_graph on the CPU is RunConfig's to refuse, and the engine's capture rule's on an auto device)
    if cfg.decode_on_device and cfg.device == "cpu":
        raise fail(
            "--decode_on_device needs a CUDA device; --device=cpu (use --device=cuda or drop --decode_on_device)",
            "decode_on_device",
            "device",
        )


def _check_combinations(cfg: Any) -> None:
    """Flags that need, or exclude, each other."""
    if cfg.forward_only and cfg.eval:
        raise fail(
            "--forward_only and --eval cannot both be set: forward-only times the forward pass "
            "of training, --eval evaluates a checkpoint",
            "forward_only",
            "eval",
        )
    if cfg.num_batches is not None and cfg.num_epochs is not None:
        raise fail("at most one of --num_batches and --num_epochs may be given", "num_batches", "num_epochs")
    _check_evaluation(cfg)
    _check_fp16(cfg)
    _check_checkpoints(cfg)
    _check_mode(cfg)
    if cfg.exported is not None:
        # The export fixes the model, its weights and its arithmetic.
        for name, given in (
            ("compile", cfg.compile),
            ("train_dir", cfg.train_dir is not None),
            ("precision", cfg.precision != "fp32"),
        ):
            if given:
                raise fail(
                    f"--{name} does not apply to --exported: the exported program fixes the model, "
                    "its weights and its precision",
                    name,
                    "exported",
                )


def _check_evaluation(cfg: Any) -> None:
    given = [n for n in EVAL_DURING_TRAINING_FLAGS if getattr(cfg, n) not in (None, ())]
    if given:
        for other in ("eval", "forward_only"):
            if getattr(cfg, other):
                raise fail(f"--{given[0]} cannot be used with --{other}", given[0], other)
    if cfg.stop_at_top_1_accuracy is not None and not given:
        raise fail(
            "--stop_at_top_1_accuracy needs --eval_during_training_every_n_steps (or another "
            "--eval_during_training_* flag)",
            "stop_at_top_1_accuracy",
            "eval_during_training_every_n_steps",
        )
    if cfg.eval_interval_secs and not cfg.eval:
        raise fail(
            "--eval_interval_secs applies only with --eval (a second process evaluating the checkpoints "
            "training writes into --train_dir)",
            "eval_interval_secs",
            "eval",
        )
    for name in ("num_eval_batches", "num_eval_epochs"):
        if getattr(cfg, name) is not None and not (cfg.eval or given):
            raise fail(
                f"--{name} applies only with --eval or --eval_during_training_every_n_steps "
                "(or another --eval_during_training_* flag)",
                name,
            )


def _check_fp16(cfg: Any) -> None:
    fp16_flags = [n for n in ("fp16_loss_scale", "fp16_inc_loss_scale_every_n") if getattr(cfg, n) is not None]
    if cfg.fp16_enable_auto_loss_scale:
        fp16_flags.append("fp16_enable_auto_loss_scale")
    if fp16_flags and cfg.precision != "fp16":
        raise fail(
            f"--{fp16_flags[0]} applies only to fp16 training (--use_fp16 or --precision=fp16); "
            f"the precision is {cfg.precision}",
            fp16_flags[0],
            "precision",
        )
    if cfg.fp16_inc_loss_scale_every_n is not None and not cfg.fp16_enable_auto_loss_scale:
        raise fail(
            "--fp16_inc_loss_scale_every_n needs --fp16_enable_auto_loss_scale",
            "fp16_inc_loss_scale_every_n",
            "fp16_enable_auto_loss_scale",
        )


def _check_checkpoints(cfg: Any) -> None:
    if cfg.save_model_steps is not None and cfg.save_model_secs is not None:
        raise fail(
            "at most one of --save_model_steps and --save_model_secs may be given",
            "save_model_steps",
            "save_model_secs",
        )
    for name in ("save_model_steps", "save_model_secs"):
        if getattr(cfg, name) is not None and cfg.train_dir is None:
            raise fail(f"--{name} needs --train_dir (where checkpoints go)", name, "train_dir")
    if cfg.eval and cfg.train_dir is None:
        raise fail("--eval evaluates the newest checkpoint in --train_dir; give --train_dir", "eval", "train_dir")


def _check_mode(cfg: Any) -> None:
    if cfg.mode == "inference":
        if cfg.data_dir is not None:
            raise fail("--data_dir: the inference benchmark runs on synthetic batches only", "data_dir", "mode")
        for name in _TRAINING_SWITCHES:
            if getattr(cfg, name):
                raise fail(f"--{name} does not apply to --mode=inference", name, "mode")
        for name in _TRAINING_ONLY:
            if getattr(cfg, name) is not None:
                raise fail(f"--{name} does not apply to --mode=inference (use --iterations)", name, "mode")
    else:
        for name in _INFERENCE_ONLY:
            if getattr(cfg, name) is not None:
                raise fail(f"--{name} applies only to --mode=inference", name, "mode")


def _check_learning_rate(cfg: Any) -> None:
    """The learning-rate flags: a piecewise schedule, or an initial rate with its decay."""
    decay = cfg.num_epochs_per_decay > 0 or cfg.learning_rate_decay_factor > 0
    if cfg.piecewise_learning_rate_schedule is not None:
        others = [n for n in ("init_learning_rate",) if getattr(cfg, n) is not None]
        others += [
            n
            for n in ("learning_rate_decay_factor", "minimum_learning_rate", "num_epochs_per_decay")
            if getattr(cfg, n)
        ]
        if others:
            raise fail(
                f"--piecewise_learning_rate_schedule cannot be combined with --{others[0]}",
                "piecewise_learning_rate_schedule",
                others[0],
            )
        try:
            parse_piecewise_schedule(cfg.piecewise_learning_rate_schedule)
        except ConfigError as e:
            raise fail(f"--piecewise_learning_rate_schedule: {e}", "piecewise_learning_rate_schedule") from None
    if decay and not (
        cfg.init_learning_rate is not None and cfg.num_epochs_per_decay > 0 and cfg.learning_rate_decay_factor > 0
    ):
        raise fail(
            "--num_epochs_per_decay and --learning_rate_decay_factor must be given together, with --init_learning_rate",
            "num_epochs_per_decay",
            "learning_rate_decay_factor",
            "init_learning_rate",
        )
    if cfg.minimum_learning_rate and not decay:
        raise fail(
            "--minimum_learning_rate needs --init_learning_rate, --num_epochs_per_decay and "
            "--learning_rate_decay_factor",
            "minimum_learning_rate",
        )


def _check_tf_combinations(cfg: Any) -> None:
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


def parse_piecewise_schedule(text: str) -> tuple[list[int], list[float]]:
    """``"LR0;E1;LR1;...;En;LRn"`` -> (epoch boundaries ``[E1..En]``, rates ``[LR0..LRn]``)."""
    pieces = [p.strip() for p in text.split(";")]
    if len(pieces) % 2 == 0:
        raise ConfigError(f"{text!r} must have an odd number of ';'-separated parts (LR0;E1;LR1;...;En;LRn)")
    rates: list[float] = []
    epochs: list[int] = []
    for i, piece in enumerate(pieces):
        try:
            if i % 2 == 0:
                rates.append(float(piece))
            else:
                epochs.append(int(piece))
        except ValueError:
            what = "learning rate" if i % 2 == 0 else "epoch (an integer)"
            raise ConfigError(f"invalid {what} {piece!r} in {text!r}") from None
    if any(b <= a for a, b in zip(epochs, epochs[1:], strict=False)):
        raise ConfigError(f"the epochs of {text!r} must increase")
    return epochs, rates


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


__all__ = [
    "EVAL_DURING_TRAINING_FLAGS",
    "gpu_indices",
    "parse_piecewise_schedule",
    "validate",
]
