"""The inference latency benchmark (``stoker bench --mode=inference``).

As the IPU applications' ``inference_run``: one untimed first call (it pays for lazy
initialisation and, with ``--compile``, for compilation), then ``--num_inference_threads``
threads each call the model ``--iterations`` times on the same batch and time every call.
The latencies of all threads are pooled; throughput is ``iterations x threads x batch`` over
the wall time from starting the first thread to joining the last.

One call is the forward pass plus reading the predicted classes back to the host, so on
CUDA a call's latency includes waiting for its kernels (the seed's call also returns its
predictions). The model is built by an Estimator (seeded; weights from ``--train_dir`` when
given) and called directly: a latency benchmark measures one call, not a loop. With
``--exported DIR`` the call is the exported program of ``stoker export`` (``model.pt2``, its
input shape from ``signature.json``), every output read back to the host; ``--exported
DIR/model.aoti.pt2`` runs the export's AOTInductor package instead (``stoker export --aot``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..data import synthetic_images
from ..errors import FlagError
from ..estimator import Estimator
from ..kernels.linear import reset_choices
from ..precision import autocast_context
from ..resolve import Choice
from .config import BenchConfig
from .model import bench_model_fn
from .plan import BenchPlan
from .report import base_result, efficiency_peak, exported_name, flops_per_image, header_lines, linear_lines
from .stats import format_latencies, latency_stats
from .workload import Workload

LogFn = Callable[[str], None]


def run_inference(plan: BenchPlan, *, log: LogFn = print) -> dict[str, Any]:
    """Time single forward calls from ``--num_inference_threads`` threads; return the statistics."""
    workload = plan.workload
    cfg = plan.cfg.replace(
        num_inference_threads=plan.cfg.num_inference_threads or 1, iterations=plan.cfg.iterations or 100
    )
    threads, iterations = int(cfg.num_inference_threads or 1), int(cfg.iterations or 100)
    engine: dict[str, Choice[Any]] | None = None  # an exported program runs without an Estimator
    if cfg.exported is not None:
        model_name = exported_name(cfg.exported)
        call, image_size = _exported_call(cfg, workload)
    else:
        model_name = plan.model_name
        est = Estimator(
            model=plan.model, model_fn=bench_model_fn, config=plan.run_config, warm_start_from=cfg.train_dir
        )
        call, image_size, engine = _eager_call(cfg, workload, est), workload.image_size, est.choices
    alone = workload.model_info is not None and not cfg.exported
    peak = efficiency_peak(cfg.peak_tflops, workload.device, cfg.precision) if alone else None
    for line in header_lines(plan, engine, peak=peak):
        log(line)

    reset_choices()  # the "Linear:" lines list this run's layer shapes
    log("Running warm up")
    start = time.perf_counter()
    with torch.inference_mode(), autocast_context(cfg.precision, workload.device):
        call()
    log(f"Done warm up (first call: {time.perf_counter() - start:.3f} s)")
    for line in linear_lines(cfg, workload.device):
        log(line)

    per_thread: list[list[float]] = [[] for _ in range(threads)]

    def runner(index: int) -> None:
        # Autocast and inference mode are thread-local: each thread enters them itself.
        latencies = per_thread[index]
        with torch.inference_mode(), autocast_context(cfg.precision, workload.device):
            for _ in range(iterations):
                t0 = time.perf_counter()
                call()
                latencies.append(time.perf_counter() - t0)

    workers = [threading.Thread(target=runner, args=(i,), name=f"stoker-bench-{i}") for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    pooled = [t for lat in per_thread for t in lat]
    stats = latency_stats(pooled)
    log(f"Latencies in ms, {stats.count} calls pooled over {threads} thread(s):")
    log(format_latencies(stats))
    result = base_result(cfg, workload, model_name)
    result.update(
        num_steps=len(pooled),
        elapsed_seconds=wall,
        average_wall_time=wall / max(1, iterations),
        images_per_sec=len(pooled) * workload.batch_size / wall if wall > 0 else 0.0,
        num_inference_threads=threads,
        iterations=iterations,
        latency_avg_ms=stats.mean_ms,
        latency_p99_ms=stats.p99_ms,
        latency_p999_ms=stats.p999_ms,
        latency_max_ms=stats.max_ms,
        latencies_ms=[1000.0 * t for t in pooled],
    )
    if alone:
        forward = flops_per_image(cfg.model, workload.dataset, workload.num_classes)
        result.update(gflop_per_image_forward=forward, gflop_per_image=forward)
    result["image_size"] = image_size
    return result


def _eager_call(cfg: BenchConfig, workload: Workload, est: Estimator) -> Callable[[], Any]:
    """One forward call of ``est``'s model (seeded; weights from ``--train_dir`` when given), eager
    or compiled, returning the classes."""
    module = est.model.eval()
    call_model = torch.compile(module) if cfg.compile else module
    images = _images(cfg, workload, workload.image_size)

    def call() -> torch.Tensor:
        return call_model(images).argmax(-1).cpu()

    return call


def _exported_call(cfg: BenchConfig, workload: Workload) -> tuple[Callable[[], Any], int]:
    """One call of an exported program (``stoker export``) on a synthetic batch of its input shape."""
    from ..export.program import load_exported  # only this mode needs the export format

    assert cfg.exported is not None  # the caller runs this for --exported only
    exported = load_exported(cfg.exported)
    inputs = exported.signature["inputs"]
    shape = inputs[0]["shape"] if len(inputs) == 1 else []
    if len(shape) != 4 or shape[1] != 3 or shape[2] != shape[3]:
        raise FlagError(
            ("exported",),
            f"--exported={cfg.exported}: the program's inputs are {inputs}; the "
            "benchmark feeds one image batch [batch, 3, S, S]",
        )
    if not exported.signature.get("dynamic_batch", True) and shape[0] != workload.batch_size:
        raise FlagError(
            ("batch_size", "exported"),
            f"--batch_size={workload.batch_size}, but the program was exported for batches of {shape[0]} only",
        )
    if exported.kind == "aot":
        if exported.device.type != workload.device.type:  # the package's kernels are for one device kind
            raise FlagError(
                ("device", "exported"),
                f"--exported={cfg.exported} is an AOT package compiled for "
                f"{exported.device.type}; run the benchmark with --device={exported.device.type}",
            )
    elif workload.device.type != "cpu":
        assert isinstance(exported.module, nn.Module)  # not an AOT package: the program's nn.Module
        exported.module.to(workload.device)
    images = _images(cfg, workload, int(shape[2]))
    name = inputs[0]["name"]

    def call() -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in exported({name: images}).items()}

    return call, int(shape[2])


def _images(cfg: BenchConfig, workload: Workload, image_size: int) -> torch.Tensor:
    return synthetic_images(
        (3, image_size, image_size),
        workload.num_classes,
        batch_size=workload.batch_size,
        device=workload.device,
        seed=cfg.tf_random_seed,
        channels_last=cfg.channels_last,
    ).images
