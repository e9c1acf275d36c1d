"""The declarations of ``stoker bench``'s flags: one keyword-only dataclass per ``--help`` group.

Each field is one flag, declared once with :func:`~stoker.flags.option` (every command's
flag helper): its default, its help, its ``--help`` group, its allowed values and range, and
(``docs``) what docs/bench-reference.md adds.
:class:`~stoker.bench.config.BenchConfig` joins these dataclasses and validates them; the
parser, ``--help`` and docs/bench-reference.md's flag lists are made from them (:mod:`stoker.bench.flags`).
A new flag is a new field here, in the group its ``--help`` shows it in.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..flags import option
from ..kernels.linear import FAST_LINEAR_MODES
from ..kernels.sgd_in_backward import SGD_IN_BACKWARD_MODES
from ..precision import precision_names
from .flags import AMOUNT, EVALUATION, INFERENCE, INPUT, MORE, OPTIMIZER, OUTPUTS, RUN, WHERE

DATA_NAMES: tuple[str, ...] = ("imagenet", "cifar10", "movielens", "librispeech", "coco")
DATA_FORMATS: tuple[str, ...] = ("NCHW", "NHWC")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "gpu")
#: the precisions over fp32 master weights (``stoker.precision``'s modes that autocast or not)
PRECISIONS: tuple[str, ...] = precision_names(master_weights="fp32")
OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "rmsprop", "adam")
VARIABLE_UPDATES: tuple[str, ...] = ("independent", "replicated", "sharded", "parameter_server")
RUN_MODES: tuple[str, ...] = ("training", "inference")

# tf_cnn_benchmarks' BenchmarkMode values, printed on the ``Mode:`` line.
MODE_TRAIN = "training"
MODE_EVAL = "evaluation"
MODE_TRAIN_AND_EVAL = "training + evaluation"
MODE_FORWARD_ONLY = "forward-only"
MODE_INFERENCE = "inference"

DEFAULT_NUM_BATCHES = 100
DEFAULT_BATCH_SIZE = 0  # the model's default (its registry entry's, stoker.models)
#: What a model without defaults of its own (a custom model) trains with: the base ``Model`` class's
#: of tf_cnn_benchmarks.
FALLBACK_BATCH_SIZE = 32
DEFAULT_LEARNING_RATE = 0.005
DEFAULT_FP16_LOSS_SCALE = 128.0
DEFAULT_INFERENCE_ITERATIONS = 100


@dataclass(kw_only=True)
class RunFlags:
    """What to run: the model, the data and the mode."""

    model: str = option("trivial", "zoo model name (--list_models)", group=RUN)
    data_name: str | None = option(
        None,
        "the data set; movielens, librispeech and coco are synthetic only",
        group=RUN,
        choices=DATA_NAMES,
        default_text="the only one --model exists for, else guessed from --data_dir, else imagenet",
        docs="CIFAR-10 binaries in --data_dir are recognised.",
    )
    data_dir: str | None = option(
        None,
        "real data: tf_cnn_benchmarks' ImageNet TFRecord shards (train-*-of-*, evaluation from "
        "validation-*-of-*), an image folder (root/<class>/<image>) or CIFAR-10 binaries",
        group=RUN,
        default_text="none: synthetic data",
        docs="TFRecord shards are picked when the folder holds `train-*-of-*` files; an image folder may "
        "have train/ and validation/ (or val/) subfolders; the header's Dataset: line says which; a "
        "folder with both shards and class folders, or neither, exits 2 naming both layouts.",
    )
    mode: str = option("training", "training (tf_cnn_benchmarks) or inference (latency)", group=RUN, choices=RUN_MODES)
    forward_only: bool = option(False, "time the forward pass only", group=RUN)
    eval: bool = option(False, "evaluate the newest checkpoint in --train_dir", group=RUN)


@dataclass(kw_only=True)
class AmountFlags:
    """How much: batch size, step counts, progress and the device loop."""

    batch_size: int = option(
        DEFAULT_BATCH_SIZE,
        "batch size per device",
        group=AMOUNT,
        minimum=0,
        default_text="0: the model's default batch size (docs/bench-reference.md, Per-model defaults)",
        docs="The header prints the global batch too.",
    )
    num_batches: int | None = option(
        None,
        "timed batches",
        group=AMOUNT,
        minimum=1,
        default_text=f"{DEFAULT_NUM_BATCHES}",
        docs="Timed steps (training, forward-only) or batches (evaluation).",
    )
    num_epochs: float | None = option(
        None,
        "timed epochs instead of --num_batches",
        group=AMOUNT,
        above=0,
        default_text="none: --num_batches",
        docs="ceil(epochs x examples / batch) steps.",
    )
    num_eval_batches: int | None = option(
        None, "batches per evaluation", group=AMOUNT, minimum=1, default_text="--num_batches"
    )
    num_warmup_batches: int = option(
        10,
        "untimed batches first (rounded up to whole --iterations_per_loop loops: more warm-up, never fewer timed "
        "steps)",
        group=AMOUNT,
        minimum=0,
        docs="In the same training run as the timed ones.",
    )
    display_every: int = option(
        10,
        "print progress every N steps",
        group=AMOUNT,
        minimum=1,
        docs="A progress line after step 1 and every N steps.",
    )
    iterations_per_loop: int = option(
        1,
        "steps per host round trip; 1 times every step, N > 1 times loops of N steps",
        group=AMOUNT,
        minimum=1,
        docs="See *Timing without per-step synchronisation*.",
    )


@dataclass(kw_only=True)
class DeviceFlags:
    """Where and how: replicas, device, data format, precision, compilation, kernels, threads."""

    num_gpus: int = option(
        1,
        "replicas on this machine (one per CUDA device, or CPU processes sharing the cores), launched as "
        "torchrun --nproc_per_node=N would (under torchrun: WORLD_SIZE)",
        group=WHERE,
        minimum=1,
        docs="See *Several replicas*.",
    )
    device: str = option(
        "auto", "cpu, cuda (or gpu), or auto (CUDA when torch sees it)", group=WHERE, choices=DEVICES, case="lower"
    )
    data_format: str | None = option(
        None,
        "NCHW, or NHWC (the channels_last memory format)",
        group=WHERE,
        choices=DATA_FORMATS,
        case="upper",
        default_text="NHWC for image models (but the few measured faster in NCHW on a CPU), NCHW for the "
        "others; the header's Defaults: line says which",
        docs="See *Speed notes*.",
    )
    precision: str = option(
        "fp32",
        f"{', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]} (autocast; fp32 master weights)",
        group=WHERE,
        choices=PRECISIONS,
    )
    fp16_loss_scale: float | None = option(
        None,
        "fp16 loss scale (static, or the initial dynamic scale)",
        group=WHERE,
        above=0,
        default_text=f"{DEFAULT_FP16_LOSS_SCALE:g}",
    )
    fp16_enable_auto_loss_scale: bool = option(
        False,
        "dynamic fp16 loss scaling",
        group=WHERE,
        docs="Halve and skip on inf/NaN, double after --fp16_inc_loss_scale_every_n good steps.",
    )
    fp16_inc_loss_scale_every_n: int | None = option(
        None, "double the dynamic loss scale after N good steps", group=WHERE, minimum=1, default_text="1000"
    )
    variable_update: str = option(
        "replicated",
        "replicated (DDP), sharded (FSDP2), independent, or parameter_server (runs as replicated)",
        group=WHERE,
        choices=VARIABLE_UPDATES,
    )
    compile: bool | str = option(
        False,
        "true or module: torch.compile the model; step: compile the whole training step",
        group=WHERE,
        docs='step is RunConfig(compile="step"); see '
        "[device_loop.md](device_loop.md#eager-compiled-step-and-cuda-graph-loops).",
    )
    cuda_graph: bool = option(
        False,
        "CUDA only: capture the training step once as a CUDA graph and replay it (every --optimizer is built "
        "capturable on CUDA); flags whose step cannot be captured exit 2 naming why",
        group=WHERE,
        docs="RunConfig(cuda_graph=True); see *GPU check*.",
    )
    fast_linear: str = option(
        "auto",
        "CPU: nn.Linear on oneDNN's inner product: auto (per layer shape, where it measured >= 5% faster than "
        "the BLAS here; cached per machine), on, or off (the BLAS)",
        group=WHERE,
        choices=FAST_LINEAR_MODES,
        docs="RunConfig(fast_linear=...); see *Fast linear*.",
    )
    sgd_in_backward: str = option(
        "auto",
        "CPU, --optimizer=sgd: apply the update inside the fast linear layers' weight-gradient product (no "
        "gradient written): auto (where the run allows it), on (an error says what stands in the way) or off",
        group=WHERE,
        choices=SGD_IN_BACKWARD_MODES,
        docs="See *SGD inside the backward*.",
    )
    tf_random_seed: int = option(1234, "seed of the weights and the synthetic data", group=WHERE)
    num_intra_threads: int | None = option(
        None,
        "torch intra-op threads",
        group=WHERE,
        minimum=1,
        default_text="the cores idle just before the run (1 where the input is the work: the header says so)",
        docs='See *How "auto" is resolved*.',
    )
    num_inter_threads: int | None = option(
        None, "torch inter-op threads", group=WHERE, minimum=1, default_text="torch's"
    )
    keep_host_memory: bool = option(
        True,
        "keep freed host memory for reuse instead of returning it to the OS every step (glibc; resnet50 on "
        "CPU: 1.5x faster, peak memory kept)",
        group=WHERE,
        docs="See *Speed notes*; false keeps the C library's defaults.",
    )
    gpu_indices: str = option("", "CUDA device of each replica, comma-separated", group=WHERE, default_text="0..N-1")


@dataclass(kw_only=True)
class InputFlags:
    """Real data (``--data_dir``): decoding, workers, preprocessing and prefetching."""

    decode_on_device: bool = option(
        False,
        "CUDA only, JPEG data: decode batches with nvJPEG on the GPU (needs torchvision) and crop there",
        group=INPUT,
        docs="On an H200 slower than 16 CPU workers (*GPU check*).",
    )
    image_decoder: str = option(
        "auto",
        "JPEG decoder on the CPU: auto (libjpeg-crop or simplejpeg, whichever builds this run's crops faster, "
        "timed on 16 of its examples: their pixels are the same; Pillow where neither works), libjpeg-crop, "
        "simplejpeg or pillow",
        group=INPUT,
        choices=("auto", "libjpeg-crop", "simplejpeg", "pillow"),
        docs="libjpeg-crop builds on first use where a C compiler and the libjpeg-turbo headers are installed; "
        "the header's `Resolved:` line prints auto's timings ([docs/data.md](data.md#choosing-the-decoder)).",
    )
    data_worker_kind: str = option(
        "auto",
        "what decodes real data beside the training step: threads of this process or worker processes (auto: "
        "threads with libjpeg-crop, up to 4, training on a CPU; else processes; the header says which and why)",
        group=INPUT,
        choices=("auto", "thread", "process"),
        docs="thread: threads of the training process; process: worker processes, batches through shared "
        "memory ([docs/data.md, Workers](data.md#workers)).",
    )
    batch_group_size: int = option(
        1, "batches the input pipeline prepares per group (the infeed's prefetch depth)", group=INPUT, minimum=1
    )
    distortions: bool = option(
        False,
        "tf_cnn's colour distortions on top of its random crop and flip (TF 2's tf_cnn: crop and flip only)",
        group=INPUT,
        docs="Brightness, saturation, hue and contrast, applied on the device; evaluation always uses "
        "tf_cnn's eval_image box. CIFAR-10: pad-crop-flip, or none with --nodistortions.",
    )
    resize_method: str = option(
        "bilinear",
        "resizing of real images",
        group=INPUT,
        choices=("bilinear", "nearest", "bicubic", "area", "round_robin", "crop"),
        docs="area is Pillow's box filter; round_robin takes the four by position in the batch; crop does "
        "not resize (a random or central crop; images must be at least the model's size).",
    )
    use_datasets: bool = option(True, "decode real data in workers (false: in the training process)", group=INPUT)
    datasets_use_prefetch: bool = option(True, "prepare batches ahead in the infeed's thread", group=INPUT)
    datasets_prefetch_buffer_size: int = option(
        1,
        "batches prepared ahead per device",
        group=INPUT,
        minimum=0,
        docs="The infeed prepares this times --batch_group_size batches ahead (the engine's default, 2, "
        "when both are 1).",
    )
    datasets_num_private_threads: int | None = option(
        None,
        "workers decoding real data (--data_worker_kind says of which kind)",
        group=INPUT,
        minimum=0,
        default_text="one per usable core, fewer where the header says why",
        docs="One per core in this process's CPU affinity, shared among the replicas of a machine; on CUDA two "
        "fewer per replica; on a CPU none when a step per image lasts >= 20 decodes (resnet50: decoding then "
        'runs in the input thread); see *How "auto" is resolved*.',
    )
    datasets_repeat_cached_sample: bool = option(
        False, "read one batch of the real data and repeat it forever", group=INPUT
    )


@dataclass(kw_only=True)
class OptimizerFlags:
    """The optimizer and the learning rate."""

    optimizer: str = option(
        "sgd",
        "sgd, momentum (Nesterov), rmsprop or adam",
        group=OPTIMIZER,
        choices=OPTIMIZERS,
        docs="momentum is Nesterov's, as TensorFlow's; rmsprop uses TensorFlow's formula.",
    )
    init_learning_rate: float | None = option(
        None,
        "initial learning rate",
        group=OPTIMIZER,
        above=0,
        default_text="the model's rate or schedule (docs/bench-reference.md, Per-model defaults; "
        "the header's Defaults: line says which)",
    )
    piecewise_learning_rate_schedule: str | None = option(
        None,
        "LR0;E1;LR1;...;En;LRn: rate LRi from epoch Ei",
        group=OPTIMIZER,
        default_text="none",
        docs="Excludes the other rate flags.",
    )
    num_epochs_per_decay: float = option(
        0.0,
        "epochs between decays (with --learning_rate_decay_factor)",
        group=OPTIMIZER,
        minimum=0,
        default_text="0: no decay",
        docs="Staircase exponential decay: both decay flags, with --init_learning_rate.",
    )
    learning_rate_decay_factor: float = option(
        0.0, "decay factor every --num_epochs_per_decay", group=OPTIMIZER, minimum=0, default_text="0: no decay"
    )
    num_learning_rate_warmup_epochs: float = option(0.0, "linear warm-up from 0", group=OPTIMIZER, minimum=0)
    minimum_learning_rate: float = option(0.0, "floor of the decayed rate", group=OPTIMIZER, minimum=0)
    momentum: float = option(0.9, "momentum", group=OPTIMIZER, minimum=0)
    rmsprop_decay: float = option(0.9, "RMSProp decay", group=OPTIMIZER, minimum=0)
    rmsprop_momentum: float = option(0.9, "RMSProp momentum", group=OPTIMIZER, minimum=0)
    rmsprop_epsilon: float = option(1.0, "RMSProp epsilon", group=OPTIMIZER, minimum=0)
    adam_beta1: float = option(0.9, "Adam beta1", group=OPTIMIZER, minimum=0)
    adam_beta2: float = option(0.999, "Adam beta2", group=OPTIMIZER, minimum=0)
    adam_epsilon: float = option(1e-8, "Adam epsilon", group=OPTIMIZER, minimum=0)
    weight_decay: float = option(
        4e-5, "L2 factor", group=OPTIMIZER, minimum=0, docs="total_loss includes weight_decay x sum(w^2) / 2."
    )
    gradient_clip: float | None = option(
        None, "clip each gradient element to [-c, c]", group=OPTIMIZER, above=0, default_text="none"
    )
    resnet_base_lr: float | None = option(
        None,
        "ResNet models: the learning rate at batch 256, scaled with the batch",
        group=OPTIMIZER,
        above=0,
        default_text="0.128",
    )


@dataclass(kw_only=True)
class EvaluationFlags:
    """Evaluation beside or during training."""

    eval_interval_secs: float = option(
        0.0,
        "with --eval: look for new checkpoints in --train_dir every N seconds and evaluate the newest (older "
        "pending ones are recorded as superseded), beside the training process, until training has finished",
        group=EVALUATION,
        minimum=0,
        default_text="0: evaluate the newest once",
    )
    eval_during_training_every_n_steps: int | None = option(
        None, "evaluate every N timed steps", group=EVALUATION, minimum=1, default_text="none"
    )
    stop_at_top_1_accuracy: float | None = option(
        None,
        "stop once an evaluation reaches this top-1",
        group=EVALUATION,
        above=0,
        maximum=1,
        default_text="none",
    )
    print_training_accuracy: bool = option(False, "print the training batch's top-1 / top-5", group=EVALUATION)


@dataclass(kw_only=True)
class OutputFlags:
    """Checkpoints, traces, results and benchmark logs."""

    train_dir: str | None = option(
        None,
        "checkpoints; rerunning the same command resumes from the newest",
        group=OUTPUTS,
        default_text="none: no checkpoints",
        docs="Rerunning the same command resumes (*Checkpoints and resume*).",
    )
    save_model_steps: int | None = option(
        None, "checkpoint every N steps", group=OUTPUTS, minimum=1, default_text="only at the end"
    )
    save_model_secs: float | None = option(
        None, "checkpoint every N seconds", group=OUTPUTS, above=0, default_text="only at the end"
    )
    max_ckpts_to_keep: int = option(5, "checkpoints kept (0 keeps all)", group=OUTPUTS, minimum=0)
    trace_file: str | None = option(
        None,
        "Chrome trace of one warm-up step",
        group=OUTPUTS,
        default_text="none",
        docs="Open it in chrome://tracing or Perfetto.",
    )
    results_file: str | None = option(
        None,
        "write the results: .json (replaced) or .csv (a row appended)",
        group=OUTPUTS,
        default_text="none",
        docs="A new .csv file gets a header row.",
    )
    peak_tflops: float | None = option(
        None,
        "one device's peak TFLOP/s for MFU",
        group=OUTPUTS,
        above=0,
        default_text="measured: the fastest of three kernels in the compute dtype (the BLAS gemm, oneDNN's "
        "linear, a channels_last 3x3 convolution; cuDNN on CUDA), measured once per machine and cached",
        docs="Times the replicas under torchrun; see *The peak and MFU*.",
    )
    benchmark_log_dir: str | None = option(
        None,
        "write benchmark_run.log and metric.log (JSON lines) into this folder",
        group=OUTPUTS,
        default_text="none",
        docs="benchmark_run.log says what ran, where, every flag and the test id; metric.log gets "
        "average_examples_per_sec, the loss and accuracies appended.",
    )
    benchmark_test_id: str | None = option(
        None,
        "a test id recorded in --benchmark_log_dir's files and the results file",
        group=OUTPUTS,
        default_text="none",
    )


@dataclass(kw_only=True)
class InferenceFlags:
    """The inference latency benchmark (``--mode=inference``)."""

    num_inference_threads: int | None = option(
        None, "threads calling the model", group=INFERENCE, minimum=1, default_text="1"
    )
    iterations: int | None = option(
        None, "calls per thread", group=INFERENCE, minimum=1, default_text=f"{DEFAULT_INFERENCE_ITERATIONS}"
    )
    exported: str | None = option(
        None,
        "a directory written by `stoker export` (or Estimator.export) to benchmark instead of the zoo model; "
        "DIR/model.aoti.pt2 for its AOT package (stoker export --aot)",
        group=INFERENCE,
        default_text="none: the zoo model",
        docs="Not with --compile, --train_dir or a --precision.",
    )


@dataclass(kw_only=True)
class MoreTfFlags:
    """tf_cnn_benchmarks' other implemented flags (evaluation schedules, summaries, XLA, ...)."""

    eval_batch_size: int = option(
        0, "evaluation batch size per device", group=MORE, minimum=0, default_text="0: --batch_size"
    )
    num_eval_epochs: float | None = option(
        None,
        "epochs of evaluation data per evaluation, instead of --num_eval_batches",
        group=MORE,
        above=0,
        default_text="none",
    )
    eval_during_training_every_n_epochs: float | None = option(
        None, "evaluate every N epochs of training", group=MORE, above=0, default_text="none"
    )
    eval_during_training_at_specified_steps: tuple[int, ...] = option(
        (), "evaluate at these timed steps (comma-separated)", group=MORE, minimum=1, default_text="none"
    )
    eval_during_training_at_specified_epochs: tuple[float, ...] = option(
        (), "evaluate at these epochs (comma-separated)", group=MORE, above=0, default_text="none"
    )
    display_perf_ewma: float | None = option(
        None,
        "progress lines show an exponentially weighted moving average of images/sec with this weight on the "
        "newest step (0 < w <= 1)",
        group=MORE,
        above=0,
        maximum=1,
        default_text="none: the mean",
    )
    gradient_repacking: int = option(
        0,
        "all-reduce the gradients in N DDP buckets of equal size",
        group=MORE,
        minimum=0,
        default_text="0: DDP's 25 MB buckets",
        docs="RunConfig.ddp_bucket_cap_mb.",
    )
    xla: bool = option(
        False, "torch.compile the model (TensorFlow: XLA auto-jit)", group=MORE, docs="Not with --compile."
    )
    xla_compile: bool = option(
        False, "torch.compile the whole training step (TensorFlow: compile the graph with XLA)", group=MORE
    )
    fp16_vars: bool = option(False, "with fp16, keep the weights in fp16 too (no fp32 master copy)", group=MORE)
    summary_verbosity: int = option(
        0,
        "TensorBoard summaries in --train_dir: 1 scalars (loss, learning rate, images/sec), 2 also histograms of "
        "the weights, 3 also of the gradients",
        group=MORE,
        choices=(0, 1, 2, 3),
        default_text="0: none",
        docs="Written to --train_dir/events; gradients as the optimizer applies them.",
    )
    save_summaries_steps: int = option(
        0, "write summaries every N steps", group=MORE, minimum=0, default_text="0: every --display_every"
    )
    ml_perf: bool = option(
        False,
        "MLPerf :::MLLOG lines (to --train_dir/mlperf.log, else standard output)",
        group=MORE,
        docs="Run start and stop, epochs, batch size and seed (stoker.hooks.mlperf).",
    )
    loss_type_to_report: str = option(
        "total_loss",
        "total_loss (with the L2 term) or base_loss (without)",
        group=MORE,
        choices=("total_loss", "base_loss"),
        docs="On progress lines, summaries and results.",
    )
    gpu_memory_frac_for_testing: float = option(
        0.0,
        "CUDA: cap this process's memory at this fraction (torch.cuda.set_per_process_memory_fraction)",
        group=MORE,
        minimum=0,
        maximum=1,
        default_text="0: no cap",
    )


__all__ = [
    "DATA_FORMATS",
    "DATA_NAMES",
    "DEVICES",
    "OPTIMIZERS",
    "PRECISIONS",
    "RUN_MODES",
    "VARIABLE_UPDATES",
    "AmountFlags",
    "DeviceFlags",
    "EvaluationFlags",
    "InferenceFlags",
    "InputFlags",
    "MoreTfFlags",
    "OptimizerFlags",
    "OutputFlags",
    "RunFlags",
]
