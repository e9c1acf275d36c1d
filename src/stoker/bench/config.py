"""``BenchConfig``: every setting of one ``stoker bench`` run, validated once.

Field names are tf_cnn_benchmarks' flag names, so ``--batch_size=32`` becomes
``BenchConfig(batch_size=32)``. ``__post_init__`` checks values (tables of flags by kind, below
the class) and combinations (one function per topic) and raises
:class:`BenchFlagError`, which names the flags involved (the command line turns it into an
argparse error, exit status 2). Checks that need the model registry, the data folder or the
devices live in :func:`stoker.bench.workload.resolve_workload`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..kernels.linear import FAST_LINEAR_MODES
from ..kernels.sgd_in_backward import SGD_IN_BACKWARD_MODES
from .errors import BenchFlagError
from .errors import fail as _fail
from .tf_checks import EVAL_DURING_TRAINING_FLAGS, check_tf_flags

DATA_NAMES: tuple[str, ...] = ("imagenet", "cifar10", "movielens", "librispeech", "coco")
DATA_FORMATS: tuple[str, ...] = ("NCHW", "NHWC")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "gpu")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "rmsprop", "adam")
VARIABLE_UPDATES: tuple[str, ...] = ("independent", "replicated", "sharded", "parameter_server")
RUN_MODES: tuple[str, ...] = ("training", "inference")
_MULTI_PROCESS_UPDATES = ("distributed_replicated", "distributed_all_reduce", "collective_all_reduce", "horovod")

# tf_cnn_benchmarks' BenchmarkMode values, printed on the ``Mode:`` line.
MODE_TRAIN = "training"
MODE_EVAL = "evaluation"
MODE_TRAIN_AND_EVAL = "training + evaluation"
MODE_FORWARD_ONLY = "forward-only"
MODE_INFERENCE = "inference"

DEFAULT_NUM_BATCHES = 100
DEFAULT_BATCH_SIZE = 0  # the model's default (bench/defaults.py)
DEFAULT_LEARNING_RATE = 0.005
DEFAULT_FP16_LOSS_SCALE = 128.0
DEFAULT_INFERENCE_ITERATIONS = 100


@dataclass(kw_only=True)
class BenchConfig:
    """Settings of a benchmark run (see ``docs/bench.md`` for each flag).

    ``None`` means "not given" where the default depends on other settings (``num_batches``,
    ``init_learning_rate``, the fp16 flags, the inference flags), so that a flag given in the
    wrong mode can be refused rather than silently ignored.
    """

    # what to run
    model: str = "trivial"
    data_name: str | None = None
    data_dir: str | None = None
    mode: str = "training"
    forward_only: bool = False
    eval: bool = False
    # how much
    batch_size: int = DEFAULT_BATCH_SIZE
    num_batches: int | None = None
    num_epochs: float | None = None
    num_eval_batches: int | None = None
    num_warmup_batches: int = 10
    display_every: int = 10
    iterations_per_loop: int = 1
    # where and how
    num_gpus: int = 1  # local replicas (bench.launch); under torchrun, WORLD_SIZE or 1
    device: str = "auto"
    data_format: str | None = None  # None: per model and device (workload.default_data_format)
    precision: str = "fp32"
    fp16_loss_scale: float | None = None
    fp16_enable_auto_loss_scale: bool = False
    fp16_inc_loss_scale_every_n: int | None = None
    variable_update: str = "replicated"
    compile: bool | str = False  # True/"module": the model; "step": the whole training step
    cuda_graph: bool = False  # replay the training step as a captured CUDA graph (CUDA only)
    decode_on_device: bool = False  # real JPEG data decoded by nvJPEG on the GPU (CUDA only)
    image_decoder: str = "auto"  # the CPU JPEG decoder of real data: auto, libjpeg-crop, simplejpeg or pillow
    data_worker_kind: str = "auto"  # real data decoded by threads or worker processes (auto: threads with libjpeg-crop)
    fast_linear: str = "auto"  # nn.Linear on oneDNN where it measured faster here (stoker.kernels.linear)
    sgd_in_backward: str = "auto"  # plain SGD inside the fast linears' weight-gradient product, where allowed
    tf_random_seed: int = 1234
    num_intra_threads: int | None = None
    num_inter_threads: int | None = None
    keep_host_memory: bool = True
    # optimizer and learning rate
    optimizer: str = "sgd"
    init_learning_rate: float | None = None
    piecewise_learning_rate_schedule: str | None = None
    num_epochs_per_decay: float = 0.0
    learning_rate_decay_factor: float = 0.0
    num_learning_rate_warmup_epochs: float = 0.0
    minimum_learning_rate: float = 0.0
    momentum: float = 0.9
    rmsprop_decay: float = 0.9
    rmsprop_momentum: float = 0.9
    rmsprop_epsilon: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    weight_decay: float = 4e-5
    gradient_clip: float | None = None
    # evaluation during training
    eval_interval_secs: float = 0.0  # --eval: > 0 watches --train_dir and evaluates each new checkpoint
    eval_during_training_every_n_steps: int | None = None
    stop_at_top_1_accuracy: float | None = None
    print_training_accuracy: bool = False
    # checkpoints, traces, results
    train_dir: str | None = None
    save_model_steps: int | None = None
    save_model_secs: float | None = None
    max_ckpts_to_keep: int = 5
    trace_file: str | None = None
    results_file: str | None = None
    peak_tflops: float | None = None
    # inference latency benchmark
    num_inference_threads: int | None = None
    iterations: int | None = None
    exported: str | None = None
    # tf_cnn_benchmarks' other flags (bench/flags.py's implemented rows)
    eval_batch_size: int = 0
    num_eval_epochs: float | None = None
    eval_during_training_every_n_epochs: float | None = None
    eval_during_training_at_specified_steps: tuple[int, ...] = ()
    eval_during_training_at_specified_epochs: tuple[float, ...] = ()
    batch_group_size: int = 1
    display_perf_ewma: float | None = None
    distortions: bool = False
    resize_method: str = "bilinear"
    use_datasets: bool = True
    datasets_use_prefetch: bool = True
    datasets_prefetch_buffer_size: int = 1
    datasets_num_private_threads: int | None = None
    datasets_repeat_cached_sample: bool = False
    gradient_repacking: int = 0
    xla: bool = False
    xla_compile: bool = False
    fp16_vars: bool = False
    summary_verbosity: int = 0
    save_summaries_steps: int = 0
    ml_perf: bool = False
    loss_type_to_report: str = "total_loss"
    benchmark_log_dir: str | None = None
    benchmark_test_id: str | None = None
    gpu_indices: str = ""
    gpu_memory_frac_for_testing: float = 0.0
    resnet_base_lr: float | None = None
    #: noted flags that were given, as (name, value): each prints a ``Note:`` line (flags.py)
    noted_flags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.compile, bool) or self.compile in ("none", "module", "step")):
            raise _fail(
                f"--compile={self.compile!r} is not allowed; allowed values: true, false, module, step", "compile"
            )
        check_tf_flags(self)
        if self.decode_on_device and self.device == "cpu":
            raise _fail(
                "--decode_on_device needs a CUDA device; --device=cpu (use --device=cuda or drop --decode_on_device)",
                "decode_on_device",
                "device",
            )
        if self.cuda_graph and self.device == "cpu":
            raise _fail(
                "--cuda_graph needs a CUDA device; --device=cpu (use --device=cuda or drop --cuda_graph)",
                "cuda_graph",
                "device",
            )
        _check_values(self)
        _check_combinations(self)
        _check_learning_rate(self)

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
        replaces it with the model's default on the device (``workload.default_data_format``)."""
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


# ---------------------------------------------------------------------- validation
# A new flag usually needs only its field above and, if it is checked on its own, an entry in
# one of these tables; the functions below hold the checks that involve several flags.

#: Flags whose value must be one of a list (checked in this order).
_CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data_format", DATA_FORMATS),
    ("device", DEVICES),
    ("precision", PRECISIONS),
    ("optimizer", OPTIMIZERS),
    ("variable_update", VARIABLE_UPDATES),
    ("mode", RUN_MODES),
    ("fast_linear", FAST_LINEAR_MODES),
    ("sgd_in_backward", SGD_IN_BACKWARD_MODES),
)
#: Of those, the ones that may be left out (None: a default chosen later).
_OPTIONAL_CHOICES: tuple[str, ...] = ("data_format",)
#: Integer flags that always have a value, and their minimum.
_INTS: tuple[tuple[str, int], ...] = (
    ("batch_size", 0),
    ("num_gpus", 1),
    ("display_every", 1),
    ("iterations_per_loop", 1),
    ("max_ckpts_to_keep", 0),
    ("num_warmup_batches", 0),
)
#: Integer flags that may be left out (None); given, they are >= 1.
_OPTIONAL_POSITIVE_INTS: tuple[str, ...] = (
    "num_batches",
    "num_eval_batches",
    "eval_during_training_every_n_steps",
    "save_model_steps",
    "fp16_inc_loss_scale_every_n",
    "num_inference_threads",
    "iterations",
    "num_intra_threads",
    "num_inter_threads",
)
#: Number flags that may be left out (None); given, they are > 0.
_OPTIONAL_POSITIVE: tuple[str, ...] = (
    "num_epochs",
    "fp16_loss_scale",
    "gradient_clip",
    "save_model_secs",
    "peak_tflops",
    "init_learning_rate",
)
#: Number flags that are >= 0.
_NON_NEGATIVE: tuple[str, ...] = (
    "num_epochs_per_decay",
    "learning_rate_decay_factor",
    "num_learning_rate_warmup_epochs",
    "minimum_learning_rate",
    "eval_interval_secs",
    "weight_decay",
    "momentum",
    "rmsprop_decay",
    "rmsprop_momentum",
    "rmsprop_epsilon",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
)
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


def parse_piecewise_schedule(text: str) -> tuple[list[int], list[float]]:
    """``"LR0;E1;LR1;...;En;LRn"`` -> (epoch boundaries ``[E1..En]``, rates ``[LR0..LRn]``)."""
    pieces = [p.strip() for p in text.split(";")]
    if len(pieces) % 2 == 0:
        raise ValueError(f"{text!r} must have an odd number of ';'-separated parts (LR0;E1;LR1;...;En;LRn)")
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
            raise ValueError(f"invalid {what} {piece!r} in {text!r}") from None
    if any(b <= a for a, b in zip(epochs, epochs[1:], strict=False)):
        raise ValueError(f"the epochs of {text!r} must increase")
    return epochs, rates


def _check_values(cfg: BenchConfig) -> None:
    """Each flag on its own: allowed values, integers, signs and ranges."""
    for name, allowed in _CHOICES:
        value = getattr(cfg, name)
        if value is None and name in _OPTIONAL_CHOICES:
            continue
        if value not in allowed:
            hint = ""
            if name == "variable_update" and value in _MULTI_PROCESS_UPDATES:
                hint = (
                    " (a TensorFlow cross-machine mode: stoker runs replicas as processes, with --num_gpus=N or "
                    "under torchrun, and --variable_update=replicated or sharded)"
                )
            raise _fail(f"--{name}={value!r} is not allowed{hint}; allowed values: {', '.join(allowed)}", name)
    if cfg.data_name is not None and cfg.data_name not in DATA_NAMES:
        raise _fail(
            f"--data_name={cfg.data_name!r} is not allowed; allowed values: {', '.join(DATA_NAMES)}", "data_name"
        )
    for name, minimum in _INTS:
        _require_int(name, getattr(cfg, name), minimum=minimum)
    for name in _OPTIONAL_POSITIVE_INTS:
        if getattr(cfg, name) is not None:
            _require_int(name, getattr(cfg, name), minimum=1)
    for name in _OPTIONAL_POSITIVE:
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise _fail(f"--{name} must be > 0; got {value}", name)
    for name in _NON_NEGATIVE:
        if getattr(cfg, name) < 0:
            raise _fail(f"--{name} must be >= 0; got {getattr(cfg, name)}", name)
    if cfg.stop_at_top_1_accuracy is not None and not 0 < cfg.stop_at_top_1_accuracy <= 1:
        raise _fail(
            f"--stop_at_top_1_accuracy must be in (0, 1]; got {cfg.stop_at_top_1_accuracy}", "stop_at_top_1_accuracy"
        )


def _check_combinations(cfg: BenchConfig) -> None:
    """Flags that need, or exclude, each other."""
    if cfg.forward_only and cfg.eval:
        raise _fail(
            "--forward_only and --eval cannot both be set: forward-only times the forward pass "
            "of training, --eval evaluates a checkpoint",
            "forward_only",
            "eval",
        )
    if cfg.num_batches is not None and cfg.num_epochs is not None:
        raise _fail("at most one of --num_batches and --num_epochs may be given", "num_batches", "num_epochs")
    _check_evaluation(cfg)
    _check_sgd_in_backward(cfg)
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
                raise _fail(
                    f"--{name} does not apply to --exported: the exported program fixes the model, "
                    "its weights and its precision",
                    name,
                    "exported",
                )


def _check_sgd_in_backward(cfg: BenchConfig) -> None:
    """``--sgd_in_backward=on``: what the run must be for the update to move into the backward
    (``auto`` quietly keeps the ordinary update instead; the device is checked by the engine)."""
    if cfg.sgd_in_backward != "on":
        return
    needs = (
        ("optimizer", cfg.optimizer != "sgd", f"--optimizer=sgd (plain SGD; got {cfg.optimizer})"),
        ("gradient_clip", cfg.gradient_clip is not None, "no --gradient_clip (clipping needs every gradient first)"),
        ("fast_linear", cfg.fast_linear == "off", "--fast_linear=auto or on (the update runs in those layers)"),
        ("compile", cfg.compile_mode not in (False, "none", "false"), "no --compile (the update runs eagerly)"),
        ("cuda_graph", cfg.cuda_graph, "no --cuda_graph"),
        ("precision", cfg.precision != "fp32", f"--precision=fp32 (got {cfg.precision})"),
        ("num_gpus", cfg.num_gpus > 1, "one replica (replicas average gradients before the update)"),
    )
    for name, conflict, need in needs:
        if conflict:
            raise _fail(
                f"--sgd_in_backward=on needs {need}; use --sgd_in_backward=auto or off", "sgd_in_backward", name
            )


def _check_evaluation(cfg: BenchConfig) -> None:
    given = [n for n in EVAL_DURING_TRAINING_FLAGS if getattr(cfg, n) not in (None, ())]
    if given:
        for other in ("eval", "forward_only"):
            if getattr(cfg, other):
                raise _fail(f"--{given[0]} cannot be used with --{other}", given[0], other)
    if cfg.stop_at_top_1_accuracy is not None and not given:
        raise _fail(
            "--stop_at_top_1_accuracy needs --eval_during_training_every_n_steps (or another "
            "--eval_during_training_* flag)",
            "stop_at_top_1_accuracy",
            "eval_during_training_every_n_steps",
        )
    if cfg.eval_interval_secs and not cfg.eval:
        raise _fail(
            "--eval_interval_secs applies only with --eval (a second process evaluating the checkpoints "
            "training writes into --train_dir)",
            "eval_interval_secs",
            "eval",
        )
    for name in ("num_eval_batches", "num_eval_epochs"):
        if getattr(cfg, name) is not None and not (cfg.eval or given):
            raise _fail(
                f"--{name} applies only with --eval or --eval_during_training_every_n_steps "
                "(or another --eval_during_training_* flag)",
                name,
            )


def _check_fp16(cfg: BenchConfig) -> None:
    fp16_flags = [n for n in ("fp16_loss_scale", "fp16_inc_loss_scale_every_n") if getattr(cfg, n) is not None]
    if cfg.fp16_enable_auto_loss_scale:
        fp16_flags.append("fp16_enable_auto_loss_scale")
    if fp16_flags and cfg.precision != "fp16":
        raise _fail(
            f"--{fp16_flags[0]} applies only to fp16 training (--use_fp16 or --precision=fp16); "
            f"the precision is {cfg.precision}",
            fp16_flags[0],
            "precision",
        )
    if cfg.fp16_inc_loss_scale_every_n is not None and not cfg.fp16_enable_auto_loss_scale:
        raise _fail(
            "--fp16_inc_loss_scale_every_n needs --fp16_enable_auto_loss_scale",
            "fp16_inc_loss_scale_every_n",
            "fp16_enable_auto_loss_scale",
        )


def _check_checkpoints(cfg: BenchConfig) -> None:
    if cfg.save_model_steps is not None and cfg.save_model_secs is not None:
        raise _fail(
            "at most one of --save_model_steps and --save_model_secs may be given",
            "save_model_steps",
            "save_model_secs",
        )
    for name in ("save_model_steps", "save_model_secs"):
        if getattr(cfg, name) is not None and cfg.train_dir is None:
            raise _fail(f"--{name} needs --train_dir (where checkpoints go)", name, "train_dir")
    if cfg.eval and cfg.train_dir is None:
        raise _fail("--eval evaluates the newest checkpoint in --train_dir; give --train_dir", "eval", "train_dir")


def _check_mode(cfg: BenchConfig) -> None:
    if cfg.mode == "inference":
        if cfg.data_dir is not None:
            raise _fail("--data_dir: the inference benchmark runs on synthetic batches only", "data_dir", "mode")
        for name in _TRAINING_SWITCHES:
            if getattr(cfg, name):
                raise _fail(f"--{name} does not apply to --mode=inference", name, "mode")
        for name in _TRAINING_ONLY:
            if getattr(cfg, name) is not None:
                raise _fail(f"--{name} does not apply to --mode=inference (use --iterations)", name, "mode")
    else:
        for name in _INFERENCE_ONLY:
            if getattr(cfg, name) is not None:
                raise _fail(f"--{name} applies only to --mode=inference", name, "mode")


def _check_learning_rate(cfg: BenchConfig) -> None:
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
            raise _fail(
                f"--piecewise_learning_rate_schedule cannot be combined with --{others[0]}",
                "piecewise_learning_rate_schedule",
                others[0],
            )
        try:
            parse_piecewise_schedule(cfg.piecewise_learning_rate_schedule)
        except ValueError as e:
            raise _fail(f"--piecewise_learning_rate_schedule: {e}", "piecewise_learning_rate_schedule") from None
    if decay and not (
        cfg.init_learning_rate is not None and cfg.num_epochs_per_decay > 0 and cfg.learning_rate_decay_factor > 0
    ):
        raise _fail(
            "--num_epochs_per_decay and --learning_rate_decay_factor must be given together, with --init_learning_rate",
            "num_epochs_per_decay",
            "learning_rate_decay_factor",
            "init_learning_rate",
        )
    if cfg.minimum_learning_rate and not decay:
        raise _fail(
            "--minimum_learning_rate needs --init_learning_rate, --num_epochs_per_decay and "
            "--learning_rate_decay_factor",
            "minimum_learning_rate",
        )


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _fail(f"--{name} must be an integer >= {minimum}; got {value!r}", name)


__all__ = ["BenchConfig", "BenchFlagError", "parse_piecewise_schedule"]
