"""Turning benchmark results into text and files: the header block, the closing summary,
FLOPs and MFU, the results file and the model table. Nothing here runs a model.

MFU (model FLOPs utilisation) is ``achieved / peak``: achieved GFLOP/s is images/sec times
the model's GFLOP per image (forward from ``stoker.models.example_flops``; a training image
costs about 3x forward: the backward pass computes gradients for activations and for
weights, each about as costly as the forward), and the peak is ``--peak_tflops`` or the
fastest kernel torch has for the dtype on the device, measured once per machine and cached
(:func:`stoker.kernels.peak.measured_peak`: the BLAS gemm, oneDNN's linear and a channels_last
3x3 convolution). The header and the summary say which kernel set the peak.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._cache import cache_dir
from .._version import __version__
from ..kernels.fp16_cost import KINDS, fp16_cost, fp16_note, say_once
from ..kernels.linear import LINEAR_FILE, describe_choices
from ..kernels.machine import BF16_FLAGS, cpu_has_fast
from ..kernels.peak import measured_peak
from ..memory.host import host_memory_kept
from ..models import (
    DATASETS,
    count_parameters,
    create_model,
    example_flops,
    get_model_info,
    list_models,
)
from ..precision import compute_dtype
from ..resolve import Choice, spelled
from .config import (
    DEFAULT_FP16_LOSS_SCALE,
    DEFAULT_INFERENCE_ITERATIONS,
    MODE_INFERENCE,
    MODE_TRAIN,
    MODE_TRAIN_AND_EVAL,
    BenchConfig,
)
from .flags import FlagNames, note_lines
from .outputs import mlperf_log_path
from .plan import (  # flops_per_image lives there: the input choice counts FLOPs too (re-exported here)
    BenchPlan,
    InputChoices,
    effective_variable_update,
    flops_per_image,
)
from .stats import DASHES, format_total
from .workload import Workload, prefetch_depth

PEAK_MATMUL_SIZE = 2048
_LABEL_WIDTH = 13  # tf_cnn_benchmarks aligns its header values after "Num batches: "

# Scalar fields of a result, in the order of the CSV columns.
CSV_FIELDS: tuple[str, ...] = (
    "date",
    "model",
    "dataset",
    "mode",
    "device",
    "num_devices",
    "batch_size",
    "batch_size_per_device",
    "num_batches",
    "num_warmup_batches",
    "data_format",
    "precision",
    "optimizer",
    "variable_update",
    "compile",
    "iterations_per_loop",
    "num_threads",
    "host_memory_kept",
    "num_steps",
    "elapsed_seconds",
    "average_wall_time",
    "images_per_sec",
    "step_images_per_sec",
    "uncertainty",
    "jitter",
    "last_average_loss",
    "top_1_accuracy",
    "top_5_accuracy",
    "latency_avg_ms",
    "latency_p99_ms",
    "latency_p999_ms",
    "latency_max_ms",
    "gflop_per_image",
    "achieved_gflops",
    "peak_gflops",
    "peak_source",
    "mfu",
    "global_step",
    "torch_version",
    "stoker_version",
)


def _line(label: str, value: object) -> str:
    return f"{label + ':':<{_LABEL_WIDTH}}{value}"


def header_lines(
    plan: BenchPlan, engine: dict[str, Choice[Any]] | None, *, peak: tuple[float, str] | None = None
) -> list[str]:
    """The block printed before a run of ``plan``, in tf_cnn_benchmarks' layout (only lines that
    apply), after a ``Note:`` line per given flag that has no effect here (``flags.py``) and per
    slow low precision on this CPU (:func:`precision_notes`). ``engine``: what the Estimator chose
    when built (``Estimator.choices``), printed beside the plan's choices as ``Resolved:`` lines
    (``None``: no Estimator runs, an exported program). ``peak``: ``(GFLOP/s, source)`` of
    :func:`efficiency_peak`, printed as the ``Peak:`` line."""
    cfg, workload = plan.cfg, plan.workload
    mode = cfg.benchmark_mode
    lines = [
        *note_lines(cfg.noted_flags),
        *unused_flag_notes(cfg, workload),
        *precision_notes(cfg.precision, workload.device),
        _line("PyTorch", f"{torch.__version__} (stoker {__version__})"),
        _line("Model", plan.model_name if cfg.exported is None else exported_name(cfg.exported)),
        _line("Dataset", workload.dataset_label),
        _line("Mode", mode),
        _line("Batch size", f"{workload.batch_size} global"),
        " " * _LABEL_WIDTH + f"{workload.per_device_batch_size} per device",
    ]
    if mode == MODE_INFERENCE:
        lines.append(_line("Iterations", f"{cfg.iterations or DEFAULT_INFERENCE_ITERATIONS} per thread"))
        lines.append(_line("Callers", f"{cfg.num_inference_threads or 1} thread(s) calling the model"))
    else:
        lines.append(_line("Num batches", workload.num_batches))
        lines.append(_line("Num epochs", f"{workload.num_epochs:.2f}"))
    lines.append(_line("Devices", workload.device_names))
    lines.append(_line("Data format", cfg.data_format))
    if plan.trains:
        lines.append(_line("Optimizer", cfg.optimizer))
        lines.append(_line("Variables", effective_variable_update(cfg)))
    lines.append(_line("Precision", _precision_label(cfg)))
    xla = " (--xla_compile)" if cfg.xla_compile else (" (--xla)" if cfg.xla else "")
    lines.append(_line("Compile", f"{cfg.compile_mode}{xla}"))
    lines.extend(_optional_lines(plan))
    if workload.device.type == "cpu":
        lines.append(_line("Linear", _linear_header(cfg.fast_linear)))
    if peak is not None:
        lines.append(_line("Peak", f"{peak[0]:.1f} GFLOP/s ({peak[1]})"))
    lines.append(_line("Threads", f"{torch.get_num_threads()} intra-op"))
    lines.append(
        _line("Host memory", "kept for reuse (glibc: no mmap, no trim)" if host_memory_kept() else "C library defaults")
    )
    if plan.trains:
        lines.append(_line("Loop", f"{cfg.iterations_per_loop} step(s) per host round trip"))
    resolved = plan.resolved_lines(engine)  # every "auto" choice and why: the plan's and the engine's
    lines += [_line("Resolved", resolved[0]), *(" " * _LABEL_WIDTH + r for r in resolved[1:])]
    lines.append("==========")
    return lines


def exported_name(exported: str) -> str:
    """What ``--exported`` benchmarks, as the header and the results name it."""
    return f"{'AOT package' if str(exported).endswith('.aoti.pt2') else 'exported program'} {exported}"


def _precision_label(cfg: BenchConfig) -> str:
    precision = cfg.precision + (" (loss scale: " + loss_scale_label(cfg) + ")" if cfg.precision == "fp16" else "")
    return precision + (", fp16 weights (--fp16_vars)" if cfg.fp16_vars and cfg.precision == "fp16" else "")


def unused_flag_notes(cfg: BenchConfig, workload: Workload) -> list[str]:
    """``Note:`` lines for implemented flags given where this run has no use for them (so that
    no flag is ignored silently): real-data flags on synthetic data, training-only flags in
    other modes, CUDA flags on the CPU, gradient repacking without replicas to all-reduce."""
    unused: list[tuple[str, str]] = []
    if workload.synthetic:
        given = [
            n
            for n, default in (
                ("distortions", False),
                ("resize_method", "bilinear"),
                ("use_datasets", True),
                ("datasets_num_private_threads", None),
                ("datasets_repeat_cached_sample", False),
            )
            if getattr(cfg, n) != default
        ]
        unused += [(n, "the data is synthetic (give --data_dir for real data)") for n in given]
    training = cfg.benchmark_mode in (MODE_TRAIN, MODE_TRAIN_AND_EVAL)
    if not training:
        given = [
            n
            for n, default in (
                ("display_perf_ewma", None),
                ("loss_type_to_report", "total_loss"),
                ("summary_verbosity", 0),
                ("ml_perf", False),
                ("gradient_repacking", 0),
            )
            if getattr(cfg, n) != default
        ]
        unused += [(n, f"it applies to training; this run is {cfg.benchmark_mode}") for n in given]
    elif cfg.gradient_repacking and (workload.num_devices == 1 or effective_variable_update(cfg) != "replicated"):
        unused.append(("gradient_repacking", "only replicated training over several replicas all-reduces gradients"))
    if cfg.eval_batch_size and training and not cfg.evaluates_during_training:
        unused.append(("eval_batch_size", "this run does not evaluate"))
    if cfg.gpu_memory_frac_for_testing and workload.device.type != "cuda":
        unused.append(("gpu_memory_frac_for_testing", "the device is the CPU"))
    # Combinations tf_cnn_benchmarks accepts and ignores: run, and say so.
    if cfg.fp16_vars and cfg.precision != "fp16":
        unused.append(("fp16_vars", f"it applies to fp16 (--use_fp16); the precision is {cfg.precision}"))
    if training and cfg.summary_verbosity and cfg.train_dir is None:
        unused.append(("summary_verbosity", "summaries are written into --train_dir, which is not given"))
    if cfg.save_summaries_steps and not cfg.summary_verbosity:
        unused.append(("save_summaries_steps", "--summary_verbosity is 0 (no summaries)"))
    if cfg.benchmark_test_id is not None and cfg.benchmark_log_dir is None and cfg.results_file is None:
        unused.append(("benchmark_test_id", "it is recorded in --benchmark_log_dir's files or --results_file"))
    return [f"Note: --{name} has no effect in this run: {why}" for name, why in unused]


def _linear_header(mode: str) -> str:
    if mode == "off":
        return "nn.Linear on the BLAS (--fast_linear=off)"
    if mode == "on":
        return "nn.Linear on oneDNN's inner product where it has the dtype (--fast_linear=on)"
    return (
        "nn.Linear on oneDNN or the BLAS, per layer shape, whichever measured faster on this machine "
        f"(--fast_linear=auto; measured at the first step, cached in {cache_dir() / LINEAR_FILE})"
    )


def linear_lines(cfg: BenchConfig, device: torch.device) -> list[str]:
    """After the first steps: the kernel each ``nn.Linear`` shape runs on, and why."""
    if cfg.fast_linear == "off" or device.type != "cpu":
        return []
    chosen = describe_choices()
    if not chosen:
        return [_line("Linear", "no nn.Linear ran on the CPU")]
    return [_line("Linear", chosen[0]), *(" " * _LABEL_WIDTH + c for c in chosen[1:])]


def update_line(cfg: BenchConfig, device: torch.device, layers: list[str], refusal: str | None) -> list[str]:
    """After the first steps: which layers' SGD update runs inside their backward (``--sgd_in_backward``)."""
    if device.type != "cpu" or cfg.sgd_in_backward == "off":
        return []
    flag = f"--sgd_in_backward={cfg.sgd_in_backward}"
    if layers:
        return [_line("Update", f"SGD inside the weight-gradient product of {', '.join(layers)} ({flag})")]
    why = f"it {spelled(refusal, FlagNames())}" if refusal else "no fast linear layer is eligible"
    return [_line("Update", f"the optimizer's step for every layer ({flag}: {why})")]


def precision_notes(precision: str, device: torch.device) -> list[str]:
    """``Note:`` lines for a low precision that is slow on this CPU (the run still runs).

    fp16: always a note with what its forward+backward costs against fp32 and bf16 here
    (:func:`stoker.kernels.fp16_cost.fp16_note`, measured once per machine, cached): the CPU's
    flags do not tell (an Intel Xeon with avx512_fp16 ran a resnet50 fp16 backward 100x slower
    than fp32). bf16 without avx512_bf16/amx_bf16: the kernels convert to fp32 and back on every
    use (an AVX2 EPYC: bf16 matmuls 20 GFLOP/s against fp32's 145); the note gives this
    machine's figures (:func:`measured_peak`, each kernel within a second, cached).
    """
    if device.type != "cpu" or precision == "fp32":
        return []
    if precision == "fp16":
        say_once("fp16")  # the Estimator the run builds says it no second time
        return ["Note: " + fp16_note(fp16_cost(), KINDS, lambda name: f"--precision={name}")[1]]
    if cpu_has_fast(precision):
        return []
    slow, fast = measured_peak(device, "bf16"), measured_peak(device, "fp32")
    figures = f"bf16 kernels reach {slow.gflops:.1f} GFLOP/s here against {fast.gflops:.1f} in fp32"
    return [
        f"Note: bf16 runs emulated on this CPU (no {' or '.join(BF16_FLAGS)} in /proc/cpuinfo): {figures}, "
        "so this run is slower than --precision=fp32 would be"
    ]


def _optional_lines(plan: BenchPlan) -> list[str]:
    """Header lines of flags that are not always relevant: only when they apply."""
    cfg, workload = plan.cfg, plan.workload
    lines = []
    used = workload.defaults_used if plan.trains else [u for u in workload.defaults_used if "learning rate" not in u]
    for i, phrase in enumerate(used):  # the model's defaults, as tf_cnn_benchmarks applies them
        lines.append(_line("Defaults", phrase) if i == 0 else " " * _LABEL_WIDTH + phrase)
    if plan.trains and cfg.evaluates_during_training:
        lines.append(_line("Eval batch", f"{workload.eval_batch_size} global"))
    if plan.input is not None:
        lines.append(_line("Input", _input_line(plan, plan.input)))
    if plan.trains and plan.bucket_mb is not None:
        buckets = f"{cfg.gradient_repacking} DDP buckets of {plan.bucket_mb:.3f} MiB"
        lines.append(_line("Gradients", f"all-reduced in {buckets} (--gradient_repacking)"))
    if plan.trains and cfg.summary_verbosity and cfg.train_dir:
        every = cfg.save_summaries_steps or cfg.display_every
        lines.append(_line("Summaries", f"level {cfg.summary_verbosity} every {every} steps in {cfg.train_dir}/events"))
    if plan.trains and cfg.ml_perf:
        lines.append(_line("MLPerf log", mlperf_log_path(cfg)))
    return lines


def _input_line(plan: BenchPlan, chosen: InputChoices) -> str:
    """What reads the real data: the workers and their kind, the decoder, the prefetch, the preprocessing."""
    cfg, depth = plan.cfg, prefetch_depth(plan.cfg)
    workers, inline = chosen.data_workers.value, chosen.decode_inline
    why = "" if not inline.value or workers else f"; {inline.reason}"
    if chosen.training_thread_decodes.value:
        why += "; the training thread decodes too while its next batch is not ready"
    kind = chosen.worker_kind.value
    kind = kind if workers == 1 else {"thread": "threads", "process": "processes"}[kind]
    return (
        f"{workers} decoding {kind} ({plan.facts.usable_cores} usable cores{why}), "
        f"{chosen.decoder.value} decoder, "
        f"{'default' if depth is None else depth} batch(es) prefetched, "
        f"distortions {'on' if cfg.distortions else 'off'}, resize {cfg.resize_method}"
        + (", first batch repeated" if cfg.datasets_repeat_cached_sample else "")
    )


def loss_scale_label(cfg: BenchConfig) -> str:
    init = cfg.fp16_loss_scale or DEFAULT_FP16_LOSS_SCALE
    if cfg.fp16_enable_auto_loss_scale:
        return f"dynamic from {init:g}, x2 every {cfg.fp16_inc_loss_scale_every_n or 1000} good steps"
    return f"{init:g}"


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """The closing block: ``total images/sec`` (between dashes) and stoker's FLOP/MFU lines."""
    mode = result.get("mode")
    lines: list[str] = []
    if mode != MODE_TRAIN_AND_EVAL and result.get("num_steps"):
        lines += format_total(result["images_per_sec"])
    gflop = result.get("gflop_per_image")
    if gflop:
        forward = result["gflop_per_image_forward"]
        kind = "training, 3 x forward" if mode in (MODE_TRAIN, MODE_TRAIN_AND_EVAL) else "forward"
        lines.append(f"GFLOP per image: {gflop:.4g} ({kind}; forward {forward:.4g})")
    if result.get("achieved_gflops") is not None and mode != MODE_TRAIN_AND_EVAL:
        lines.append(f"achieved GFLOP/s: {result['achieved_gflops']:.1f}")
        lines.append(f"peak GFLOP/s: {result['peak_gflops']:.1f} ({result['peak_source']})")
        mfu = f"MFU: {100 * result['mfu']:.1f} %"
        if result["mfu"] > 1.0 and str(result.get("device", "")).startswith("cpu"):
            mfu += (
                " (above 100 %: the peak is --peak_tflops, below what this run reached)"
                if result.get("peak_source") == "--peak_tflops"
                else " (above 100 %: the peak is the fastest kernel measured on one problem size; this model's "
                "kernels did better on theirs, or did fewer FLOPs than counted: Winograd convolutions, and "
                "'3 x forward' counts a first layer's input gradient that is never computed)"
            )
        lines.append(mfu)
    return lines


def measure_matmul_peak(
    device: torch.device, precision: str = "fp32", size: int = PEAK_MATMUL_SIZE, repeats: int = 5
) -> float:
    """GFLOP/s of the fastest of ``repeats`` ``size x size`` BLAS matmuls in the compute dtype
    (one of the kernels :func:`efficiency_peak` measures; kept for scripts that want this one)."""
    dtype = compute_dtype(precision)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    flop = 2.0 * size**3
    best = math.inf
    torch.matmul(a, b)  # warm-up: thread pool, kernel selection
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return flop / best / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def efficiency_peak(peak_tflops: float | None, device: torch.device, precision: str) -> tuple[float, str]:
    """``(GFLOP/s, source)`` of one device: ``--peak_tflops``, or this machine's measured peak
    (cached per machine: the first run measures for a few seconds, later ones read it)."""
    if peak_tflops is not None:
        return peak_tflops * 1000.0, "--peak_tflops"
    peak = measured_peak(device, precision)
    return peak.gflops, peak.describe()


def add_efficiency(result: dict[str, Any], *, peak_tflops: float | None, device: torch.device, precision: str) -> None:
    """Add achieved GFLOP/s, the peak (given or measured) and MFU to ``result`` in place."""
    gflop = result.get("gflop_per_image")
    if not gflop or not result.get("images_per_sec"):
        return
    peak, source = efficiency_peak(peak_tflops, device, precision)
    replicas = int(result.get("num_devices", 1))
    if replicas > 1:  # the peak is one device's; the images/sec are all replicas'
        peak *= replicas
        source += f", x {replicas} replicas"
    achieved = result["images_per_sec"] * gflop
    result.update(achieved_gflops=achieved, peak_gflops=peak, peak_source=source, mfu=achieved / peak)


def write_results(path: str | Path, result: Mapping[str, Any]) -> Path:
    """Write ``result`` as JSON (``.json``: the whole dict, replaced) or CSV (``.csv``: one row
    of :data:`CSV_FIELDS` appended, with a header when the file is new)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(dict(result), indent=2, sort_keys=True, default=str) + "\n")
        return path
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow({k: result.get(k, "") for k in CSV_FIELDS})
    return path


def model_table(data_name: str | None = None) -> list[dict[str, Any]]:
    """Every registered model (of one data set, or all): parameters and forward GFLOP per image."""
    rows = []
    for dataset in (data_name,) if data_name else DATASETS:
        for name in list_models(dataset):
            info = get_model_info(name, dataset)
            with torch.device("meta"):
                model = create_model(name, dataset=dataset)
            rows.append(
                {
                    "model": name,
                    "dataset": dataset,
                    "image_size": info.image_size,
                    "params": count_parameters(model),
                    "gflop_per_image": example_flops(model, info) / 1e9,
                    "description": info.description,
                }
            )
    return rows


def format_model_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Aligned text columns: model, data set, input size, parameters, forward GFLOP/image."""
    width = max([len(r["model"]) for r in rows] + [5])
    lines = [f"{'model':<{width}}  {'dataset':<11}  {'input':>7}  {'params':>12}  {'GFLOP/img':>9}  description"]
    lines.append(DASHES)
    for r in rows:
        size = f"{r['image_size']}x{r['image_size']}" if r["image_size"] else "-"  # not an image model
        lines.append(
            f"{r['model']:<{width}}  {r['dataset']:<11}  {size:>7}  {r['params']:>12,}  "
            f"{r['gflop_per_image']:>9.4f}  {r['description']}"
        )
    return lines


def base_result(cfg: BenchConfig, workload: Workload, model_name: str) -> dict[str, Any]:
    """The fields every result has: what ran, where, and with which settings."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "model": model_name,
        "dataset": workload.dataset_label,
        "mode": cfg.benchmark_mode,
        "device": str(workload.device),
        "num_devices": workload.num_devices,
        "batch_size": workload.batch_size,
        "batch_size_per_device": workload.per_device_batch_size,
        "num_batches": workload.num_batches,
        "num_warmup_batches": cfg.num_warmup_batches,
        "num_epochs": workload.num_epochs,
        "data_format": cfg.data_format,
        "precision": cfg.precision,
        "optimizer": cfg.optimizer,
        "variable_update": effective_variable_update(cfg),
        "compile": cfg.compile_mode,
        "fast_linear": cfg.fast_linear,
        "sgd_in_backward": cfg.sgd_in_backward,
        "cuda_graph": cfg.cuda_graph,
        "eval_batch_size": workload.eval_batch_size,
        "loss_type": cfg.loss_type_to_report,
        "test_id": cfg.benchmark_test_id,
        "defaults": list(workload.defaults_used),
        "iterations_per_loop": cfg.iterations_per_loop,
        "num_threads": torch.get_num_threads(),
        "host_memory_kept": host_memory_kept(),
        "torch_version": torch.__version__,
        "stoker_version": __version__,
    }


__all__ = [
    "CSV_FIELDS",
    "add_efficiency",
    "base_result",
    "efficiency_peak",
    "flops_per_image",
    "format_model_table",
    "header_lines",
    "linear_lines",
    "update_line",
    "measure_matmul_peak",
    "model_table",
    "precision_notes",
    "summary_lines",
    "write_results",
]
