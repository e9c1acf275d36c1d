"""``stoker bench``: tf_cnn_benchmarks' flags on the command line, parsed into a ``BenchConfig``.

Flags keep tf_cnn_benchmarks' names and meanings (``--model=resnet50 --batch_size=32
--data_format=NHWC``). Boolean flags accept ``--flag``, ``--flag=true`` and ``--flag=false``.
Any bad value or contradictory combination exits with status 2 and a message naming the
flags (argparse's ``error``); runtime failures (a missing checkpoint, a data error) exit 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..distributed import torchrun_rank, torchrun_world_size
from ..errors import FlagError, StokerError
from ..flags import add_flags, given_values
from .checks import gpu_indices
from .config import MODE_TRAIN, MODE_TRAIN_AND_EVAL, BenchConfig
from .flags import GROUPS, all_flags, check_noted
from .launch import check_num_gpus, launch_replicas, should_launch

if TYPE_CHECKING:
    from .plan import BenchPlan


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand; its flags are made from their declarations
    (:func:`stoker.bench.flags.all_flags`)."""
    p = subparsers.add_parser(
        "bench",
        help="tf_cnn_benchmarks-compatible CNN benchmark (training, eval, forward-only, inference latency)",
        description="Benchmark a zoo CNN with tf_cnn_benchmarks' flags and output. Booleans take --flag, "
        "--noflag or --flag=true|false. See docs/bench.md.",
        usage="stoker bench [--flag=value ...]",
        allow_abbrev=False,  # --mod must not silently mean --model or --mode
    )
    add_flags(p, all_flags(BenchConfig), style="absl", groups=GROUPS)
    p.set_defaults(func=lambda args: run_bench_command(args, p))
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The ``BenchConfig`` of parsed flags (raises ``FlagError`` naming bad flags). A flag
    not given is absent from ``args``: its field keeps the dataclass default."""
    given = vars(args)
    precision = given.get("precision")
    if given.get("use_fp16"):
        if precision not in (None, "fp16"):
            raise FlagError(
                ("use_fp16", "precision"), f"--use_fp16 contradicts --precision={precision}; give one of them"
            )
        precision = "fp16"
    values = given_values(BenchConfig, args)
    if precision is not None:
        values["precision"] = precision
    return BenchConfig(**values, noted_flags=check_noted(given))


def run_bench_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``stoker bench`` with parsed ``args``; 0 on success, 1 on a runtime failure."""
    from .outputs import write_benchmark_logs
    from .plan import build_plan, preflight
    from .report import add_efficiency, format_model_table, model_table, summary_lines, write_results
    from .train import run_benchmark

    if getattr(args, "list_models", False):
        for line in format_model_table(model_table(getattr(args, "data_name", None))):
            print(line)
        return 0
    world = torchrun_world_size()
    chief = torchrun_rank() == 0
    try:
        cfg = config_from_args(args)
        device = preflight(cfg, world)
        visible = len(gpu_indices(cfg.gpu_indices)) or torch.cuda.device_count()
        check_num_gpus(cfg.num_gpus, world, visible if device.value.type == "cuda" else None)
    except FlagError as e:
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

    try:
        plan = build_plan(cfg, sample_busy=True, device=device)
        _set_threads(plan, parser, log)
        result = run_benchmark(plan, log=log)
    except FlagError as e:
        parser.error(str(e))
    except (StokerError, OSError, RuntimeError, ValueError) as e:
        print(f"stoker bench: error: {e}", file=sys.stderr, flush=True)
        return 1
    if not chief:
        return 0
    cfg = plan.cfg
    add_efficiency(result, peak_tflops=cfg.peak_tflops, device=plan.workload.device, precision=cfg.precision)
    for line in summary_lines(result):
        log(line)
    if cfg.results_file:
        log(f"Results written to {write_results(cfg.results_file, result)}")
    if cfg.benchmark_log_dir:
        log(f"Benchmark logs written to {write_benchmark_logs(cfg.benchmark_log_dir, cfg, result)}")
    return 0


def _mode_flag(cfg: BenchConfig) -> str:
    return "mode=inference" if cfg.mode == "inference" else ("eval" if cfg.eval else "forward_only")


def _set_threads(plan: BenchPlan, parser: argparse.ArgumentParser, log: Callable[[str], None]) -> None:
    """Apply the plan's intra-op threads (:func:`stoker.resolve.intra_threads`: given, 1 where the
    input is the work, else the cores idle just before the run; its ``Note:`` when it departs
    from torch's default) and ``--num_inter_threads``."""
    cfg, threads = plan.cfg, plan.threads
    if threads.value != torch.get_num_threads() or cfg.num_intra_threads is not None:
        torch.set_num_threads(threads.value)
    if threads.note:
        log(threads.note)
    if cfg.num_inter_threads is not None:
        try:
            torch.set_num_interop_threads(cfg.num_inter_threads)
        except RuntimeError as e:  # only possible before any inter-op work has started
            parser.error(f"--num_inter_threads: {e}")
