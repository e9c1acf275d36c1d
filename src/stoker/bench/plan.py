"""The resolved plan of a ``stoker bench`` run: each "auto" choice about the machine, with its reason.

:func:`resolve_plan` turns a ``BenchConfig``, its :class:`~stoker.bench.workload.Workload` and
the machine's facts (:class:`~stoker.resolve.MachineFacts`) into a frozen
:class:`ResolvedPlan`; the decisions themselves are the rules of :mod:`stoker.resolve`, so
every threshold lives in one place. The run header prints the plan (``Resolved:`` lines), and
the parts of the harness that act on a choice (the thread count, the input pipeline) read it
from the plan instead of deciding again.

Facts that take time to gather are gathered once per process: the busy cores are sampled by
``stoker bench`` just before a run (:func:`machine_facts` with ``sample_busy=True``; later
calls return those facts), and how many JPEG decodes a model's training step lasts (its counted
FLOPs over this machine's measured peak) is kept per model, data set and precision.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ..data.images.decoders import DECODERS, get_decoder
from ..distributed import torchrun_world_size
from ..kernels.machine import busy_cores, usable_cores
from ..models import create_model, example_flops, get_model_info
from ..resolve import (
    DECODE_MS_PER_IMAGE,
    Choice,
    MachineFacts,
    data_workers,
    decode_inline,
    image_threads_suffice,
    input_bound,
    intra_threads,
    worker_kind,
)
from .checks import sgd_in_backward_blockers
from .config import MODE_TRAIN, MODE_TRAIN_AND_EVAL, BenchConfig
from .cuda_graph import cuda_graph_refusals
from .inputs import ImageOptions, auto_decoder_choice

NOTHING_TO_DECODE = "synthetic data: nothing to decode"
TRAINING_FLOPS_FACTOR = 3.0  # a training image: the forward pass and a backward pass of twice its FLOPs


@dataclass(frozen=True)
class ResolvedPlan:
    """Every "auto" choice of one run, each a :class:`~stoker.resolve.Choice` (value, reason)."""

    threads: Choice[int]
    data_workers: Choice[int]
    worker_kind: Choice[str]
    decoder: Choice[str]
    training_thread_decodes: Choice[bool]
    decode_inline: Choice[bool]
    fast_linear: Choice[str]
    sgd_in_backward: Choice[str]
    peak: Choice[str]
    cuda_graph: Choice[bool]

    def lines(self) -> list[str]:
        """``name: value (reason)`` for each choice, in field order (the input's five as one
        line where there is nothing to decode)."""
        lines = []
        for f in fields(self):
            choice = getattr(self, f.name)
            if choice.reason == NOTHING_TO_DECODE:
                if f.name == "data_workers":
                    lines.append(f"input: none ({NOTHING_TO_DECODE})")
                continue
            lines.append(f"{f.name.replace('_', ' ')}: {_value(choice.value)} ({choice.reason})")
        return lines


def _value(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


# (busy cores, torch's threads) sampled by the last run of `stoker bench`, before it set the threads
_sampled: tuple[float | None, int] | None = None


def machine_facts(*, sample_busy: bool = False, world: int | None = None) -> MachineFacts:
    """This process's :class:`~stoker.resolve.MachineFacts`. ``sample_busy`` samples the cores
    other processes keep busy (0.2 s; not under several replicas, which would count each
    other) and torch's threads before any choice; later calls report that sample (the busy
    cores are unknown until a run samples them)."""
    global _sampled
    world = torchrun_world_size() if world is None else world
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or 1)
    if sample_busy:
        _sampled = (busy_cores() if local_world <= 1 else None, torch.get_num_threads())
    busy, threads = _sampled if _sampled is not None else (None, torch.get_num_threads())
    return MachineFacts(
        usable_cores=usable_cores(),
        cpu_count=os.cpu_count() or 1,
        default_threads=threads,
        busy_cores=busy,
        local_world_size=local_world,
    )


# (model, dataset, classes, precision) -> decodes one image's training step lasts, at the peak (this process)
_decodes_per_step: dict[tuple[str, str, int | None, str], float | None] = {}


def flops_per_image(model_name: str, dataset: str, num_classes: int | None = None) -> float:
    """Forward GFLOP per image of a zoo model, counted on the meta device (no arithmetic)."""
    info = get_model_info(model_name, dataset)
    with torch.device("meta"):
        model = create_model(model_name, dataset=dataset, num_classes=num_classes)
    return example_flops(model, info) / 1e9


def step_in_decodes(cfg: BenchConfig, dataset: str, num_classes: int | None, device: torch.device) -> float | None:
    """On a CPU, with ImageNet-shaped JPEG data: how many decodes one image's training step lasts
    (its counted FLOPs over this machine's measured peak, against
    :data:`~stoker.resolve.DECODE_MS_PER_IMAGE`); ``None`` elsewhere, or for a model whose FLOPs
    cannot be counted. A fact about the model on this machine, measured once per process."""
    if dataset != "imagenet" or device.type != "cpu":
        return None
    key = (cfg.model, dataset, num_classes, cfg.precision)
    if key not in _decodes_per_step:
        from ..kernels.peak import measured_peak

        try:
            gflop = TRAINING_FLOPS_FACTOR * flops_per_image(cfg.model, dataset, num_classes)
            peak = measured_peak(device, cfg.precision).gflops
        except Exception:  # noqa: BLE001 - a model the counter cannot trace: no opinion
            _decodes_per_step[key] = None
        else:
            _decodes_per_step[key] = gflop / peak * 1000.0 / DECODE_MS_PER_IMAGE
    return _decodes_per_step[key]


def input_bound_choice(cfg: BenchConfig, dataset: str, device: torch.device) -> Choice[bool]:
    """Whether the decoding is the work of this run: training on a CPU with real JPEG data whose
    step per image is shorter than a decode (the trivial model). ``dataset`` and ``device`` as
    the flags resolve them (the thread count is set before the run's workload is built)."""
    if cfg.data_dir is None or cfg.benchmark_mode not in (MODE_TRAIN, MODE_TRAIN_AND_EVAL) or cfg.mode == "inference":
        return input_bound(None)
    return input_bound(step_in_decodes(cfg, dataset, None, device))


def resolve_threads(cfg: BenchConfig, facts: MachineFacts, dataset: str, device: torch.device) -> Choice[int]:
    """torch's intra-op threads for this run (:func:`stoker.resolve.intra_threads`)."""
    return intra_threads(given=cfg.num_intra_threads, input_bound=input_bound_choice(cfg, dataset, device), facts=facts)


def trains_on_cuda(cfg: BenchConfig) -> bool:
    """The flags ask for a CUDA device (``auto`` where torch sees one)."""
    return (
        cfg.device in ("cuda", "gpu")
        or cfg.device.startswith("cuda:")
        or (cfg.device == "auto" and torch.cuda.is_available())
    )


def resolve_worker_kind(cfg: BenchConfig, workers: int, decoder: str | None = None) -> Choice[str]:
    """``thread`` or ``process`` for ``workers`` decoding workers (:func:`stoker.resolve.worker_kind`;
    as the image source decides it: pinned batches on CUDA) decoding with ``decoder`` (a name of
    :data:`~stoker.data.images.decoders.DECODERS`; else ``--image_decoder``'s fixed-order pick)."""
    named = decoder if decoder in DECODERS else cfg.image_decoder  # "raw" (CIFAR-10), "nvjpeg": as the flag says
    suffice = image_threads_suffice(
        releases_gil=get_decoder(named).releases_gil,
        decode_on_device=cfg.decode_on_device,
        pin_memory=trains_on_cuda(cfg),
    )
    return worker_kind(cfg.data_worker_kind, suffice, workers)


def _decoder(cfg: BenchConfig, workload: Any) -> Choice[str]:
    if cfg.decode_on_device:
        return Choice("nvjpeg", "--decode_on_device")
    if cfg.image_decoder != "auto":
        return Choice(get_decoder(cfg.image_decoder).name, f"--image_decoder={cfg.image_decoder}")
    assert cfg.data_dir is not None
    train = cfg.benchmark_mode in (MODE_TRAIN, MODE_TRAIN_AND_EVAL) and not cfg.eval
    options = image_options(cfg, workload, train=train, epochs=None if train else 1)
    return _measured_decoder(cfg.data_dir, workload.data_layout, workload.num_classes, options)


@functools.lru_cache(maxsize=8)
def _measured_decoder(data_dir: str, data_layout: str, num_classes: int, options: ImageOptions) -> Choice[str]:
    # Once per process and setting: the plan is resolved for the header and again for each source.
    return auto_decoder_choice(Path(data_dir), data_layout, num_classes, options)


def image_options(
    cfg: BenchConfig,
    workload: Any,
    *,
    train: bool,
    epochs: int | None,
    num_workers: int = 0,
    worker_kind: str = "auto",
    decoder: str = "auto",
) -> ImageOptions:
    """The :class:`~stoker.bench.inputs.ImageOptions` of a run's JPEG source (training or
    evaluation data): what the flags and the workload say, with the workers and the decoder given."""
    return ImageOptions(
        image_size=workload.image_size,
        train=train,
        seed=cfg.tf_random_seed,
        num_epochs=epochs,
        num_workers=num_workers,
        worker_kind=worker_kind,
        resize_method=cfg.resize_method,
        distortions=train and cfg.distortions,
        decoder=decoder,
        decode_on_device=cfg.decode_on_device,
        pin_memory=workload.device.type == "cuda",
    )


def _input_choices(cfg: BenchConfig, workload: Any, facts: MachineFacts) -> dict[str, Choice[Any]]:
    """The data workers, their kind, the decoder, and whether decoding stays in the input thread."""
    if workload.synthetic or cfg.mode == "inference":
        none = Choice(0, NOTHING_TO_DECODE)
        return {
            "data_workers": none,
            "worker_kind": Choice("none", none.reason),
            "decoder": Choice("none", none.reason),
            "training_thread_decodes": Choice(False, none.reason),
            "decode_inline": Choice(False, none.reason),
        }
    cifar, on_cuda = workload.dataset == "cifar10", trains_on_cuda(cfg)
    decoder = Choice("raw", "CIFAR-10 binaries") if cifar else _decoder(cfg, workload)

    def training_thread_helps(workers: int) -> bool:
        kind = resolve_worker_kind(cfg, workers, decoder.value).value
        return workers > 0 and not cifar and not on_cuda and kind == "thread"

    ratio = step_in_decodes(cfg, workload.dataset, workload.num_classes, workload.device)
    inline = decode_inline(None if cfg.datasets_num_private_threads is not None else ratio)
    workers = data_workers(
        use_datasets=cfg.use_datasets,
        decode_on_device=cfg.decode_on_device,
        given=cfg.datasets_num_private_threads,
        inline=inline,
        on_cuda=on_cuda,
        facts=facts,
        training_thread_helps=training_thread_helps,
    )
    helps = training_thread_helps(workers.value)
    return {
        "data_workers": workers,
        "worker_kind": resolve_worker_kind(cfg, workers.value, decoder.value),
        "decoder": decoder,
        "training_thread_decodes": Choice(
            helps, "threads decode for a CPU step" if helps else "workers or the input thread decode"
        ),
        "decode_inline": inline,
    }


def _kernel_choices(cfg: BenchConfig, device: torch.device, replicas: int) -> dict[str, Choice[Any]]:
    """Fast linear, SGD in the backward, the MFU peak and the CUDA graph."""
    cpu = device.type == "cpu"
    if not cpu:
        fast = Choice("off", "CPU only")
    elif cfg.fast_linear == "auto":
        fast = Choice("auto", "per layer shape, oneDNN or the BLAS, whichever measured faster here; cached")
    else:
        fast = Choice(cfg.fast_linear, f"--fast_linear={cfg.fast_linear}")
    blockers = sgd_in_backward_blockers(cfg)
    if not cpu or cfg.sgd_in_backward == "off":
        sgd = Choice("off", "CPU only" if not cpu else "--sgd_in_backward=off")
    elif blockers:
        sgd = Choice("off", f"it needs {blockers[0][1]}")
    else:
        sgd = Choice(cfg.sgd_in_backward, "in the fast linear layers that allow it, chosen at the first step")
    if cfg.peak_tflops is not None:
        peak = Choice(f"{cfg.peak_tflops:g} TFLOP/s", "--peak_tflops")
    else:
        peak = Choice("measured", "the fastest of three kernels in the compute dtype, measured once per machine")
    if cfg.cuda_graph:
        graph = Choice(True, "--cuda_graph")
    elif device.type != "cuda":
        graph = Choice(False, "CUDA only")
    elif refusals := cuda_graph_refusals(cfg, device.type, replicas=replicas):
        graph = Choice(False, f"not asked, and it could not capture this step: {refusals[0]}")
    else:
        graph = Choice(False, "not asked: --cuda_graph would capture this step")
    return {"fast_linear": fast, "sgd_in_backward": sgd, "peak": peak, "cuda_graph": graph}


def resolve_plan(cfg: BenchConfig, workload: Any, facts: MachineFacts | None = None) -> ResolvedPlan:
    """The plan of a run of ``cfg`` on ``workload`` (a :class:`~stoker.bench.workload.Workload`)
    with ``facts`` (default: this process's, :func:`machine_facts`)."""
    facts = machine_facts() if facts is None else facts
    return ResolvedPlan(
        threads=resolve_threads(cfg, facts, workload.dataset, workload.device),
        **_input_choices(cfg, workload, facts),
        **_kernel_choices(cfg, workload.device, getattr(workload, "num_devices", 1)),
    )


__all__ = [
    "TRAINING_FLOPS_FACTOR",
    "ResolvedPlan",
    "flops_per_image",
    "image_options",
    "input_bound_choice",
    "machine_facts",
    "resolve_plan",
    "resolve_threads",
    "resolve_worker_kind",
    "step_in_decodes",
    "trains_on_cuda",
]
