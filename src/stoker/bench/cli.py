"""``stoker bench``: tf_cnn_benchmarks' flags on the command line, parsed into a ``BenchConfig``.

Flags keep tf_cnn_benchmarks' names and meanings (``--model=resnet50 --batch_size=32
--data_format=NHWC``). Boolean flags accept ``--flag``, ``--flag=true`` and ``--flag=false``.
Any bad value or contradictory combination exits with status 2 and a message naming the
flags (argparse's ``error``); runtime failures (a missing checkpoint, a data error) exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from ..distributed import torchrun_rank, torchrun_world_size
from ..errors import StokerError
from ..kernels.linear import FAST_LINEAR_MODES
from ..kernels.sgd_in_backward import SGD_IN_BACKWARD_MODES
from .config import (
    DATA_FORMATS,
    DATA_NAMES,
    DEVICES,
    MODE_TRAIN,
    MODE_TRAIN_AND_EVAL,
    OPTIMIZERS,
    PRECISIONS,
    RUN_MODES,
    BenchConfig,
    BenchFlagError,
)
from .flags import NOTED, TABLE, format_value
from .launch import check_num_gpus, launch_replicas, should_launch
from .tf_checks import gpu_indices

_TRUE = ("1", "true", "t", "yes", "y")
_FALSE = ("0", "false", "f", "no", "n")


def _compile_mode(text: str) -> bool | str:
    value = text.strip().lower()
    if value in ("module", "step", "none"):
        return value
    try:
        return _bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected true, false, module or step, got {text!r}") from None


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand and its flags on ``subparsers``."""
    p = subparsers.add_parser(
        "bench",
        help="tf_cnn_benchmarks-compatible CNN benchmark (training, eval, forward-only, inference latency)",
        description="Benchmark a zoo CNN with tf_cnn_benchmarks' flags and output. See docs/bench.md.",
        allow_abbrev=False,  # --mod must not silently mean --model or --mode
    )

    def flag(name: str, **kw: Any) -> None:
        p.add_argument(f"--{name}", **kw)

    def switch(name: str, help: str) -> None:
        p.add_argument(f"--{name}", type=_bool, nargs="?", const=True, default=False, metavar="BOOL", help=help)

    d = BenchConfig()  # the defaults, for the help text
    g = p.add_argument_group("what to run")
    flag("model", default=d.model, help="zoo model name (--list_models); default %(default)s")
    flag(
        "data_name",
        choices=DATA_NAMES,
        help="the data set (default: the only one --model exists for, else guessed "
        "from --data_dir, else imagenet); movielens, librispeech and coco are synthetic only",
    )
    flag("data_dir", help="an image folder or CIFAR-10 binaries; synthetic data when not given")
    flag(
        "mode",
        choices=RUN_MODES,
        default=d.mode,
        help="training (tf_cnn_benchmarks) or inference (latency); default %(default)s",
    )
    switch("forward_only", "time the forward pass only")
    switch("eval", "evaluate the newest checkpoint in --train_dir")
    switch("list_models", "print every registered model with its parameters and GFLOP per image, then exit")
    g = p.add_argument_group("how much")
    g.add_argument("--batch_size", type=int, default=d.batch_size, help="batch size per device; default %(default)s")
    g.add_argument("--num_batches", type=int, help="timed batches (default 100)")
    g.add_argument("--num_epochs", type=float, help="timed epochs instead of --num_batches")
    g.add_argument("--num_eval_batches", type=int, help="batches per evaluation (default --num_batches)")
    g.add_argument(
        "--num_warmup_batches",
        type=int,
        default=d.num_warmup_batches,
        help="untimed batches first; default %(default)s",
    )
    g.add_argument(
        "--display_every", type=int, default=d.display_every, help="print progress every N steps; default %(default)s"
    )
    g.add_argument(
        "--iterations_per_loop",
        type=int,
        default=d.iterations_per_loop,
        help="steps per host round trip; 1 times every step, N > 1 times loops of N steps; default %(default)s",
    )
    g = p.add_argument_group("where and how")
    g.add_argument(
        "--num_gpus",
        type=int,
        default=d.num_gpus,
        help="replicas on this machine (one per CUDA device, or CPU processes sharing the cores), "
        "launched as torchrun --nproc_per_node=N would; default %(default)s",
    )
    g.add_argument(
        "--device",
        type=str.lower,
        choices=DEVICES,
        default=d.device,
        help="cpu, cuda (gpu) or auto; default %(default)s",
    )
    g.add_argument(
        "--data_format",
        type=str.upper,
        choices=DATA_FORMATS,
        default=d.data_format,
        help="NCHW or NHWC (channels_last memory format); default: NHWC for image models "
        "(but the few measured faster NCHW on a CPU), NCHW for the others (docs/bench.md)",
    )
    g.add_argument(
        "--precision", choices=PRECISIONS, help="fp32 (default), bf16 or fp16 (autocast; fp32 master weights)"
    )
    g.add_argument(
        "--use_fp16", type=_bool, nargs="?", const=True, default=False, metavar="BOOL", help="same as --precision=fp16"
    )
    g.add_argument("--fp16_loss_scale", type=float, help="fp16 loss scale (default 128)")
    g.add_argument(
        "--fp16_enable_auto_loss_scale",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="dynamic loss scaling",
    )
    g.add_argument(
        "--fp16_inc_loss_scale_every_n",
        type=int,
        help="double the dynamic loss scale after N good steps (default 1000)",
    )
    g.add_argument(
        "--variable_update",
        default=d.variable_update,
        help="independent, replicated, sharded, or parameter_server (runs as replicated); default %(default)s",
    )
    g.add_argument(
        "--compile",
        type=_compile_mode,
        nargs="?",
        const=True,
        default=False,
        metavar="MODE",
        help="true/module: torch.compile the model; step: compile the whole training step; false (default)",
    )
    g.add_argument(
        "--fast_linear",
        choices=FAST_LINEAR_MODES,
        default=d.fast_linear,
        help="CPU: nn.Linear on oneDNN's inner product: auto (per layer shape where it measured >= 5%% faster "
        "than the BLAS here; cached per machine), on, or off (the BLAS); default %(default)s",
    )
    g.add_argument(
        "--sgd_in_backward",
        choices=SGD_IN_BACKWARD_MODES,
        default=d.sgd_in_backward,
        help="CPU, --optimizer=sgd: apply the update inside the fast linear layers' weight-gradient product "
        "(no gradient written): auto (where the run allows it), on (an error says what stands in the way) "
        "or off; default %(default)s",
    )
    g.add_argument(
        "--cuda_graph",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="CUDA only: capture the training step once as a CUDA graph and replay it",
    )
    g.add_argument(
        "--decode_on_device",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="CUDA only, real JPEG data: decode batches with nvJPEG on the GPU (needs torchvision) and crop there",
    )
    g.add_argument(
        "--image_decoder",
        choices=("auto", "libjpeg-crop", "simplejpeg", "pillow"),
        default="auto",
        help="JPEG decoder of real data on the CPU (auto: libjpeg-crop, the crop window only, where it builds; "
        "else simplejpeg if installed; else Pillow); default %(default)s",
    )
    g.add_argument(
        "--data_worker_kind",
        choices=("auto", "thread", "process"),
        default="auto",
        help="what decodes real data beside the training step: threads of this process or worker processes "
        "(auto: threads with libjpeg-crop, which releases the GIL for the whole decode, up to 4, training on a CPU; "
        "else processes, measured faster on a CUDA host); "
        "default %(default)s",
    )
    g.add_argument(
        "--tf_random_seed",
        type=int,
        default=d.tf_random_seed,
        help="seed of weights and synthetic data; default %(default)s",
    )
    g.add_argument("--num_intra_threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    g.add_argument("--num_inter_threads", type=int, help="torch inter-op threads (default: torch's)")
    g.add_argument(
        "--keep_host_memory",
        type=_bool,
        nargs="?",
        const=True,
        default=d.keep_host_memory,
        metavar="BOOL",
        help="keep freed host memory for reuse instead of returning it to the OS every step (glibc; "
        "resnet50 on CPU: 1.5x faster, peak memory kept); default %(default)s",
    )
    g = p.add_argument_group("optimizer and learning rate")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer, help="default %(default)s")
    g.add_argument("--init_learning_rate", type=float, help=f"initial learning rate (default {d.learning_rate})")
    g.add_argument("--piecewise_learning_rate_schedule", help="LR0;E1;LR1;...;En;LRn (epochs)")
    g.add_argument(
        "--num_epochs_per_decay",
        type=float,
        default=0.0,
        help="epochs between decays (with --learning_rate_decay_factor)",
    )
    g.add_argument(
        "--learning_rate_decay_factor", type=float, default=0.0, help="decay factor every --num_epochs_per_decay"
    )
    g.add_argument("--num_learning_rate_warmup_epochs", type=float, default=0.0, help="linear warm-up from 0")
    g.add_argument("--minimum_learning_rate", type=float, default=0.0, help="floor of the decayed rate")
    for name in (
        "momentum",
        "rmsprop_decay",
        "rmsprop_momentum",
        "rmsprop_epsilon",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
    ):
        g.add_argument(f"--{name}", type=float, default=getattr(d, name), help="default %(default)s")
    g.add_argument("--weight_decay", type=float, default=d.weight_decay, help="L2 factor; default %(default)s")
    g.add_argument("--gradient_clip", type=float, help="clip each gradient element to [-c, c]")
    g = p.add_argument_group("evaluation during training")
    g.add_argument("--eval_during_training_every_n_steps", type=int, help="evaluate every N timed steps")
    g.add_argument(
        "--eval_interval_secs",
        type=float,
        default=0.0,
        help="with --eval: look for new checkpoints in --train_dir every N seconds and evaluate the newest "
        "(older pending ones are recorded as superseded), "
        "beside the training process, until training has finished; 0 (default) evaluates the newest once",
    )
    g.add_argument("--stop_at_top_1_accuracy", type=float, help="stop once an evaluation reaches this top-1")
    g.add_argument(
        "--print_training_accuracy",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="print the training batch's top-1 / top-5",
    )
    g = p.add_argument_group("checkpoints, traces, results")
    g.add_argument("--train_dir", help="checkpoints; rerunning the same command resumes from the newest")
    g.add_argument("--save_model_steps", type=int, help="checkpoint every N steps (default: only at the end)")
    g.add_argument("--save_model_secs", type=float, help="checkpoint every N seconds (default: only at the end)")
    g.add_argument("--max_ckpts_to_keep", type=int, default=d.max_ckpts_to_keep, help="default %(default)s")
    g.add_argument("--trace_file", help="Chrome trace of one warm-up step")
    g.add_argument("--results_file", help="write the results: .json (replaced) or .csv (a row appended)")
    g.add_argument("--peak_tflops", type=float, help="peak TFLOP/s for MFU (default: measure a 2048x2048 matmul)")
    g = p.add_argument_group("inference latency (--mode=inference)")
    g.add_argument("--num_inference_threads", type=int, help="threads calling the model (default 1)")
    g.add_argument("--iterations", type=int, help="calls per thread (default 100)")
    g.add_argument(
        "--exported",
        help=(
            "a directory written by `stoker export` (or Estimator.export) to benchmark instead of the zoo model; "
            "DIR/model.aoti.pt2 for its AOT package (stoker export --aot)"
        ),
    )
    _add_table_flags(p)
    _add_negations(p)
    p.set_defaults(func=lambda args: run_bench_command(args, p))
    return p


_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": _bool,
    "list": lambda text: tuple(v.strip() for v in text.split(",") if v.strip()),
}


def _add_table_flags(p: argparse.ArgumentParser) -> None:
    """tf_cnn_benchmarks' other flags, from ``flags.TABLE``: implemented ones default to their
    value; noted ones default to ``None``, so that a given one can be reported."""
    implemented = p.add_argument_group("more tf_cnn_benchmarks flags (docs/bench.md)")
    noted = p.add_argument_group("accepted with a note: no effect in PyTorch (the run says why)")
    for flag in TABLE:
        group = implemented if flag.implemented else noted
        kw: dict[str, Any] = {
            "type": _TYPES[flag.type],
            "help": flag.help if flag.implemented else f"{flag.help} ({flag.note})",
        }
        if flag.type == "bool":
            kw.update(nargs="?", const=True, metavar="BOOL")
        if flag.choices is not None:
            kw["choices"] = flag.choices
        group.add_argument(f"--{flag.name}", default=flag.default if flag.implemented else None, **kw)


def _add_negations(p: argparse.ArgumentParser) -> None:
    """absl's ``--noflag`` for every boolean flag (``--nodistortions`` is ``--distortions=false``)."""
    for action in list(p._actions):  # the parser's own list: every option registered above
        if action.type in (_bool, _compile_mode) and action.option_strings:
            p.add_argument(
                f"--no{action.dest}", dest=action.dest, action="store_const", const=False, help=argparse.SUPPRESS
            )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The ``BenchConfig`` of parsed flags (raises ``BenchFlagError`` naming bad flags)."""
    if args.use_fp16 and args.precision not in (None, "fp16"):
        raise BenchFlagError(
            ("use_fp16", "precision"), f"--use_fp16 contradicts --precision={args.precision}; give one of them"
        )
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig) if hasattr(args, f.name)}
    values["precision"] = "fp16" if args.use_fp16 else (args.precision or "fp32")
    for name, kind in (
        ("eval_during_training_at_specified_steps", int),
        ("eval_during_training_at_specified_epochs", float),
    ):
        try:
            values[name] = tuple(kind(v) for v in values[name])
        except ValueError:
            raise BenchFlagError(
                (name,), f"--{name}: expected comma-separated {kind.__name__}s, got {','.join(values[name])!r}"
            ) from None
    values["noted_flags"] = tuple(
        (f.name, format_value(getattr(args, f.name))) for f in NOTED if getattr(args, f.name, None) is not None
    )
    return BenchConfig(**values)


def run_bench_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``stoker bench`` with parsed ``args``; 0 on success, 1 on a runtime failure."""
    from .outputs import write_benchmark_logs
    from .report import (
        add_efficiency,
        format_model_table,
        model_table,
        summary_lines,
        write_results,
    )
    from .train import run_benchmark
    from .workload import resolve_device

    if args.list_models:
        for line in format_model_table(model_table(args.data_name)):
            print(line)
        return 0
    world = torchrun_world_size()
    chief = torchrun_rank() == 0
    try:
        cfg = config_from_args(args)
        device = resolve_device(cfg.device, cfg.gpu_indices)
        visible = len(gpu_indices(cfg.gpu_indices)) or torch.cuda.device_count()
        check_num_gpus(cfg.num_gpus, world, visible if device.type == "cuda" else None)
    except BenchFlagError as e:
        parser.error(str(e))
    if max(world, cfg.num_gpus) > 1 and cfg.benchmark_mode not in (MODE_TRAIN, MODE_TRAIN_AND_EVAL):
        many = f"WORLD_SIZE={world}" if world > 1 else f"--num_gpus={cfg.num_gpus}"
        parser.error(
            f"{many}: only training runs on several processes; run --{_mode_flag(cfg)} "
            "in one process (without torchrun or --num_gpus)"
        )
    if should_launch(cfg.num_gpus, world):
        # Each replica parses the same command line again, under the agent's WORLD_SIZE.
        return launch_replicas(getattr(args, "argv", None) or sys.argv[1:], cfg.num_gpus)
    logging.getLogger("stoker").setLevel(logging.WARNING)  # the harness prints its own lines

    def log(line: str) -> None:
        if chief:  # replicas run the same steps; one of them reports
            print(line, flush=True)

    _set_threads(cfg, parser, log, world)

    try:
        result = run_benchmark(cfg, log=log)
    except BenchFlagError as e:
        parser.error(str(e))
    except (StokerError, OSError, RuntimeError, ValueError) as e:
        print(f"stoker bench: error: {e}", file=sys.stderr, flush=True)
        return 1
    if not chief:
        return 0
    add_efficiency(result, peak_tflops=cfg.peak_tflops, device=device, precision=cfg.precision)
    for line in summary_lines(result):
        log(line)
    if cfg.results_file:
        log(f"Results written to {write_results(cfg.results_file, result)}")
    if cfg.benchmark_log_dir:
        log(f"Benchmark logs written to {write_benchmark_logs(cfg.benchmark_log_dir, cfg, result)}")
    return 0


def _mode_flag(cfg: BenchConfig) -> str:
    return "mode=inference" if cfg.mode == "inference" else ("eval" if cfg.eval else "forward_only")


def _set_threads(cfg: BenchConfig, parser: argparse.ArgumentParser, log: Callable[[str], None], world: int) -> None:
    """Apply ``--num_intra_threads`` / ``--num_inter_threads``; without the former, use the idle cores.

    An OpenMP pool with more threads than idle cores is much slower than a smaller one: each
    parallel region waits for its slowest thread, and a thread sharing a core with another
    process is slow (measured here: resnet20 at 27 images/sec with 2 threads, 141 with 1, while
    another job kept one of the 2 cores busy). So by default the pool is shrunk to the cores
    that were idle just before the run; under torchrun, the local replicas share the cores.
    """
    from .workload import input_bound_on_cpu

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or 1)
    if cfg.num_intra_threads is not None:
        torch.set_num_threads(cfg.num_intra_threads)
    elif (decodes := input_bound_on_cpu(cfg)) is not None:
        torch.set_num_threads(1)
        log(
            f"Note: the input is the work here (a training step per image lasts ~{decodes:.2f} JPEG decodes): "
            "using 1 intra-op thread and leaving the cores to the decoders (--num_intra_threads overrides)"
        )
    elif local_world > 1:  # the other replicas are starting too: sampling would count them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    else:
        default = torch.get_num_threads()
        busy = busy_cores()
        if busy is not None:
            idle = max(1, min(default, round(default - busy)))
            if idle < default:
                torch.set_num_threads(idle)
                log(
                    f"Note: {busy:.1f} of {os.cpu_count()} cores were busy before the run: using {idle} "
                    f"intra-op thread(s) instead of {default} (--num_intra_threads overrides)"
                )
    if cfg.num_inter_threads is not None:
        try:
            torch.set_num_interop_threads(cfg.num_inter_threads)
        except RuntimeError as e:  # only possible before any inter-op work has started
            parser.error(f"--num_inter_threads: {e}")


def busy_cores(seconds: float = 0.2) -> float | None:
    """How many CPU cores other processes kept busy over ``seconds`` (``/proc/stat``; ``None``
    where it cannot be read). This process sleeps meanwhile, so it counts only the others."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]  # user .. steal: guest time is inside user
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1.0 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)
