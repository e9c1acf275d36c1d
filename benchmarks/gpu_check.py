"""``make gpu-check``: the CUDA tests and a GPU benchmark set in one command, on one NVIDIA GPU.

Runs with the Python it is started by (a CUDA build of torch already installed, ``PYTHONPATH=src``,
no venv, no network, no downloads)::

    PYTHONPATH=src python3 benchmarks/gpu_check.py                 # what `make gpu-check PY=python3` runs
    PYTHONPATH=src python3 benchmarks/gpu_check.py --dry-run       # the plan: every command, nothing run
    PYTHONPATH=src python3 benchmarks/gpu_check.py --quick         # fewer batches per row

Steps, each in its own process with a timeout (a failure or a timeout is recorded in its row
and the run goes on):

1. every test marked ``cuda`` (``python -m pytest -q -m cuda tests``);
2. resnet50 training, batch 256, NHWC (channels_last), AMP fp16 and bf16, a hand-written
   PyTorch loop (``gpu_check.py plain``, below) and ``stoker bench``, each eager, compiled
   (``torch.compile`` of the model / ``--compile=module``) and with a CUDA graph (the plain
   loop captures forward + backward + optimizer step in one ``torch.cuda.graph``; stoker runs
   ``--cuda_graph=true``); one more row with ``--compile=step`` (bf16);
3. resnet20 on CIFAR-10 shapes, batch 128, bf16, plain and stoker, eager and CUDA graph;
   stoker compiled (``--compile=module``);
4. ``stoker bench --mode=inference`` (resnet50, bf16, NHWC) at batch 1 and 64;
5. two-GPU rows (``torchrun --nproc_per_node=2``, replicated and sharded), recorded as
   ``skipped: 1 device`` where fewer than two devices are visible;
6. resnet50 ``stoker bench`` without ``--data_format`` (its default, NHWC on CUDA), bf16, eager;
7. real JPEGs (``--data_dir``: 1,280 generated ImageNet-shaped 500x375 files, made once in parallel
   beside ``--out``): trivial (the input pipeline is the work) and resnet50, bf16, decoded by the
   CPU workers (uint8 batches in pinned memory; the default worker kind, then decoding threads,
   ``--data_worker_kind=thread``) and by nvJPEG on the GPU (``--decode_on_device``).

``--select REGEX`` keeps the rows whose name matches (``re.search``), for a short lease.

Every ``stoker bench`` row must report the NHWC (channels_last) data format it was given or
defaults to on CUDA; a row that ran another is recorded as failed.

MFU = images/sec x GFLOP per image (forward counted by ``torch.utils.flop_counter`` through
``stoker.bench.report.flops_per_image``; x3 for training) / the device's dense bf16 peak from
``stoker.kernels.datasheet`` (``--peak_tflops`` overrides; unknown devices print ``n/a``).

Writes ``--out`` (default ``gpu-check.json``: device, versions, date, the test step and every
row with its command and result), ``<out>.md`` (the table printed at the end) and per-row logs
and ``stoker bench`` results files under ``<out stem>.rows/``.

Exit status: 0 all ran and passed (skipped rows allowed); 1 a test or a row failed or timed
out; 2 bad arguments; 3 no CUDA device visible to this Python (the Makefile target turns this
one into status 0 with the message); 4 this Python cannot import torch or stoker.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_CUDA, EXIT_NO_TORCH = 0, 1, 2, 3, 4
ROOT = Path(__file__).resolve().parents[1]
PYTEST_ARGS = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests"]
DEFAULT_BUDGET_S = 570.0  # the issue: within 10 minutes on one H100
DEFAULT_STEP_TIMEOUT_S = 300.0
MIN_ROW_S = 20.0  # a row is not started with less budget than this left


def peak_bf16_tflops(device_name: str) -> tuple[float | None, str]:
    """(TFLOP/s, which entry) for a ``torch.cuda.get_device_name()``; ``(None, 'unknown peak')``
    (the data-sheet table, :data:`stoker.kernels.datasheet.PEAK_BF16_TFLOPS`)."""
    from stoker.kernels.datasheet import peak_bf16_tflops as lookup

    return lookup(device_name)


# ----------------------------------------------------------------------------- the plan
@dataclass
class Row:
    """One benchmark row: what it is, and the command that measures it."""

    name: str
    impl: str  # plain | stoker
    variant: str  # eager | compiled | cuda_graph | compile_step | replicated | sharded | inference
    model: str
    dataset: str
    batch_size: int
    precision: str
    argv: list[str]
    training: bool = True
    nproc: int = 1
    results_file: str | None = None
    data_format: str | None = "NHWC"  # what the command passes (None: stoker's default, NHWC on CUDA)
    real_images: bool = False  # reads the generated JPEG folder (made before the first such row)
    est_s: float = 60.0  # the plan's estimate of the row's wall time on an H100/H200 (process start included)
    flops_per_example: float | None = None  # training FLOPs of one example, where the zoo does not count them
    scratch: str | None = None  # a directory the row writes (a recipe's model_dir): emptied before and after it
    steady_from_step: int | None = None  # real data: the rate of the timed steps from this one on (see STEADY)
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "-", self.name).strip("-").lower()

    @property
    def command(self) -> str:
        return "PYTHONPATH=src " + shlex.join(self.argv)


@dataclass(frozen=True)
class Sizes:
    num_batches: int
    num_warmup_batches: int
    iterations: int  # inference calls


FULL = Sizes(num_batches=50, num_warmup_batches=10, iterations=200)
QUICK = Sizes(num_batches=10, num_warmup_batches=5, iterations=50)
ITERATIONS_PER_LOOP = 10  # stoker reads the losses back every 10 steps; the plain loop once per run


def pytest_argv(python: str, paths: list[str] | None = None) -> list[str]:
    """The cuda-marked tests: of ``tests`` (the full plan), or of ``paths`` (the targets plan)."""
    return [python, *PYTEST_ARGS[:-1], *(paths or PYTEST_ARGS[-1:])]


def _plain(
    python: str,
    model: str,
    dataset: str,
    batch: int,
    precision: str,
    variant: str,
    sizes: Sizes,
    optimizer: str = "momentum",
) -> list[str]:
    return [
        python,
        "benchmarks/gpu_check.py",
        "plain",
        f"--model={model}",
        f"--data_name={dataset}",
        f"--batch_size={batch}",
        f"--precision={precision}",
        f"--variant={variant}",
        f"--num_batches={sizes.num_batches}",
        f"--num_warmup_batches={sizes.num_warmup_batches}",
        *([f"--optimizer={optimizer}"] if optimizer != "momentum" else []),
    ]


def _stoker_train(
    python: str,
    model: str,
    dataset: str,
    batch: int,
    precision: str,
    sizes: Sizes,
    extra: list[str],
    results: str,
    nproc: int = 1,
    data_format: str | None = "NHWC",
    optimizer: str | None = "momentum",
) -> list[str]:
    launch = (
        [python, "-m", "stoker"]
        if nproc == 1
        else [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "stoker"]
    )
    return [
        *launch,
        "bench",
        "--device=cuda",
        f"--model={model}",
        f"--data_name={dataset}",
        f"--batch_size={batch}",
        *([f"--data_format={data_format}"] if data_format else []),
        f"--precision={precision}",
        *([f"--optimizer={optimizer}"] if optimizer else []),  # None: the bench's default (sgd)
        "--init_learning_rate=0.005",  # the plain loop's constant rate, not the model's schedule
        f"--num_batches={sizes.num_batches}",
        f"--num_warmup_batches={sizes.num_warmup_batches}",
        f"--iterations_per_loop={ITERATIONS_PER_LOOP}",
        *extra,
        f"--results_file={results}",
    ]


REAL_IMAGES = 1280  # as the CPU input figures (benchmarks/input_pipeline.py, docs/data.md)


def make_images(root: Path, count: int = REAL_IMAGES, classes: int = 10, workers: int | None = None) -> float:
    """``count`` ImageNet-shaped JPEGs under ``root`` (the recipe of ``input_pipeline.py``'s
    ``make_imagenet_like``, one seed per image so processes can share the work); seconds taken.
    A marker file says the folder is complete; a complete folder is kept."""
    from concurrent.futures import ProcessPoolExecutor

    marker = root / f".complete-{count}x{classes}"
    if marker.exists():
        return 0.0
    start = time.perf_counter()
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    jobs = [(str(root / f"class_{k % classes:03d}" / f"{k:05d}.jpg"), k) for k in range(count)]
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        list(pool.map(_make_image, jobs, chunksize=16))
    marker.touch()
    return time.perf_counter() - start


def _make_image(job: tuple[str, int]) -> None:
    import numpy as np
    from PIL import Image

    path, k = job
    rng = np.random.default_rng(k)
    small = rng.integers(0, 256, (375 // 6, 500 // 6, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC), dtype=np.int16)
    noisy = np.clip(smooth + rng.integers(-12, 12, smooth.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(path, quality=90)


def plan(
    python: str = "python3",
    quick: bool = False,
    rows_dir: str = "gpu-check.rows",
    images_dir: str = "gpu-check.images",
) -> list[Row]:
    """Every benchmark row, in the order they run (the cheapest and most telling first)."""
    sizes = QUICK if quick else FULL
    rows: list[Row] = []

    def results(name: str) -> str:
        return f"{rows_dir}/{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()}.json"

    def train(
        model: str,
        dataset: str,
        batch: int,
        precision: str,
        impl: str,
        variant: str,
        stoker_flags: list[str],
        nproc: int = 1,
        data_format: str | None = "NHWC",
        real_images: bool = False,
    ) -> None:
        where = f"{model} {dataset} b{batch}{'/GPU' if nproc > 1 else ''} {data_format or 'default-format'} {precision}"
        name = f"{where} {impl} {variant}" + (f" x{nproc} GPUs" if nproc > 1 else "")
        if impl == "plain":
            argv = _plain(python, model, dataset, batch, precision, variant, sizes)
            rows.append(Row(name, impl, variant, model, dataset, batch, precision, argv))
        else:
            res = results(name)
            argv = _stoker_train(python, model, dataset, batch, precision, sizes, stoker_flags, res, nproc, data_format)
            rows.append(
                Row(
                    name,
                    impl,
                    variant,
                    model,
                    dataset,
                    batch,
                    precision,
                    argv,
                    nproc=nproc,
                    results_file=res,
                    data_format=data_format,
                    real_images=real_images,
                )
            )

    variants = {
        "eager": ["--compile=false"],
        "cuda_graph": ["--compile=false", "--cuda_graph=true"],
        "compiled": ["--compile=module"],
    }
    for variant in ("eager", "cuda_graph"):
        for precision in ("fp16", "bf16"):
            for impl in ("plain", "stoker"):
                train("resnet50", "imagenet", 256, precision, impl, variant, variants[variant])
    for variant in ("eager", "cuda_graph"):
        for impl in ("plain", "stoker"):
            train("resnet20", "cifar10", 128, "bf16", impl, variant, variants[variant])
    real_variants = (  # real JPEGs: the CPU workers' uint8 batches (the default kind, then threads), then nvJPEG
        ("real-cpu-decode", []),
        ("real-cpu-threads", ["--data_worker_kind=thread"]),
        ("real-nvjpeg", ["--decode_on_device"]),
    )
    for model in ("trivial", "resnet50"):
        for variant, flags in real_variants:
            extra = ["--compile=false", f"--data_dir={images_dir}", *flags]
            train(model, "imagenet", 256, "bf16", "stoker", variant, extra, real_images=True)
    for batch in (1, 64):
        name = f"resnet50 imagenet b{batch} NHWC bf16 stoker inference"
        res = results(name)
        argv = [
            python,
            "-m",
            "stoker",
            "bench",
            "--mode=inference",
            "--device=cuda",
            "--model=resnet50",
            "--data_name=imagenet",
            f"--batch_size={batch}",
            "--data_format=NHWC",
            "--precision=bf16",
            f"--iterations={sizes.iterations}",
            f"--results_file={res}",
        ]
        rows.append(
            Row(
                name,
                "stoker",
                "inference",
                "resnet50",
                "imagenet",
                batch,
                "bf16",
                argv,
                training=False,
                results_file=res,
            )
        )
    for precision in ("fp16", "bf16"):  # compiling resnet50 costs a minute or more each: after the rest
        for impl in ("plain", "stoker"):
            train("resnet50", "imagenet", 256, precision, impl, "compiled", variants["compiled"])
    train("resnet50", "imagenet", 256, "bf16", "stoker", "compile_step", ["--compile=step"])
    train("resnet20", "cifar10", 128, "bf16", "stoker", "compiled", variants["compiled"])
    for update in ("replicated", "sharded"):
        train("resnet50", "imagenet", 256, "bf16", "stoker", update, [f"--variable_update={update}"], nproc=2)
    train("resnet50", "imagenet", 256, "bf16", "stoker", "eager", variants["eager"], data_format=None)
    rows += restart_rows(python, rows_dir)
    return rows


def restart_rows(python: str, rows_dir: str) -> list[Row]:
    """Issue 49: time to full speed of resnet20 (bf16, batch 32) restarted on a fresh machine (empty
    compiler caches) / its first start (``benchmarks/restart.py``), step-compiled (the compiled
    artifacts carried by the checkpoint) and with a CUDA graph (captured again at every start)."""
    rows = []
    for variant, flags in (("compile_step", []), ("cuda_graph", ["--cuda_graph"])):
        name = f"resnet20 cifar10 b32 bf16 stoker restart {variant}"
        out = f"{rows_dir}/{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()}.json"
        argv = [python, "benchmarks/restart.py", "--device=cuda", "--workloads", "resnet20", "--steps", "20"]
        argv += [*flags, "--no_bitwise", "--out", out]
        rows.append(Row(name, "restart", variant, "resnet20", "cifar10", 32, "bf16", argv, data_format=None,
                        results_file=out, est_s=150.0))  # fmt: skip
    return rows


def parse_restart_output(text: str) -> dict[str, float]:
    """``benchmarks/restart.py``'s summary line: the fresh-machine restart's ratio to the first start."""
    m = re.search(r"restart on a fresh machine ([\d.]+)x of the first start", text)
    return {} if m is None else {"restart_ratio": float(m.group(1))}


# ----------------------------------------------------------------------------- the targets plan
#: Issue 41's targets, each a ratio of two rows (or one row's MFU) and its threshold:
#: (what, numerator row, denominator row or None for MFU, threshold).
TARGETS_BUDGET_S = 540.0  # one run of the targets plan: under 9 minutes, the tests included
# The rows' estimates (Row.est_s) are not measurements: process start (torch import, CUDA
# initialisation) of ~10 s, the timed steps at the rates of the 2026-11-26 H200 runs
# (docs/bench-reference.md), about a minute to compile resnet50 or the 24-layer BERT on a 16-core host.
# A run records each row's elapsed_s: replace them with those.
TARGET_TESTS = [  # the cuda-marked tests it runs: the CUDA paths and issue 41's capturable optimizers
    "tests/test_cuda.py",
    "tests/bench/test_bench_cuda_paths.py",
    "tests/bench/test_bench_cuda_graph.py",
]  # the cuda-marked tests it runs
TARGET_TESTS_EST_S = 60.0
BERT_LARGE = {"hidden": 1024, "layers": 24, "heads": 16, "intermediate": 4096, "seq_len": 512, "batch": 32}
#: Real JPEG rows: timed steps, and the step from which their rate counts. Before it, batches the
#: workers decoded during the warm-up (and compilation) can still be in the queues: at most the
#: prefetch depth plus a few per worker, far fewer than STEADY_FROM (100 batches, 25,600 images),
#: so the rate after it is the decoding's own. Fewer steps than STEADY_FROM + 100: "not measured".
REAL_TIMED_STEPS = 300
STEADY_FROM = 100

R20_PLAIN = "resnet20 cifar10 b128 bf16 plain cuda_graph (sgd)"
R20_STOKER = "resnet20 cifar10 b128 bf16 stoker --cuda_graph=true (default optimizer)"
BERT_PLAIN = "bert-large shape b32 s512 bf16 plain TransformerEncoder + fused AdamW eager"
BERT_EAGER = "bert-large shape b32 s512 bf16 stoker train bert eager"
BERT_COMPILED = "bert-large shape b32 s512 bf16 stoker train bert --compile=module"
R50 = "resnet50 imagenet b256 NHWC bf16"
TARGETS: tuple[tuple[str, str, str | None, float], ...] = (
    ("resnet20 stoker --cuda_graph=true / plain CUDA graph", R20_STOKER, R20_PLAIN, 0.95),
    ("BERT-large shape: stoker train bert eager / plain eager", BERT_EAGER, BERT_PLAIN, 1.0),
    ("BERT-large shape: stoker train bert compiled, MFU", BERT_COMPILED, None, 0.40),
    ("resnet50 compiled: real JPEGs / synthetic", f"{R50} stoker compiled real JPEGs", f"{R50} stoker compiled", 0.95),
    ("resnet50 eager: stoker / plain", f"{R50} stoker eager", f"{R50} plain eager", 0.98),
    ("resnet50 compiled: stoker / plain", f"{R50} stoker compiled", f"{R50} plain compiled", 0.98),
)


def _bert_recipe(python: str, rows_dir: str, name: str, compile_mode: str, sizes: Sizes) -> Row:
    """``stoker train bert`` at the BERT-large shape: the first loop of 10 steps (compilation) is
    not counted by the recipe's examples/sec line, the next ``num_batches`` are."""
    from_slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    model_dir = f"{rows_dir}/{from_slug}.model"
    b = BERT_LARGE
    argv = [python, "-m", "stoker", "train", "bert", "--model_dir", model_dir, "--device", "cuda"]
    argv += ["--precision", "bf16", "--hidden_size", str(b["hidden"]), "--num_layers", str(b["layers"])]
    argv += ["--num_heads", str(b["heads"]), "--intermediate_size", str(b["intermediate"])]
    argv += ["--seq_len", str(b["seq_len"]), "--batch_size", str(b["batch"]), "--compile", compile_mode]
    argv += ["--max_steps", str(ITERATIONS_PER_LOOP + sizes.num_batches), "--iterations_per_loop", "10"]
    argv += ["--eval_every_n_steps", "0", "--save_checkpoints_steps", "1000000", "--log_every_n_steps", "1000"]
    variant = "eager" if compile_mode == "none" else "compiled"
    est = 35.0 if variant == "eager" else 100.0  # compiling 24 layers: about a minute; the final checkpoint: 4 GB
    return Row(name, "stoker", variant, "bert", "text", b["batch"], "bf16", argv, data_format=None, est_s=est,
               flops_per_example=bert_flops(), scratch=model_dir)  # fmt: skip


def bert_flops() -> float:
    """Training FLOPs of one BERT-large-shape example, as the recipe counts them (no torch needed)."""
    b = BERT_LARGE
    h, t, layers, vocab = b["hidden"], b["seq_len"], b["layers"], 257
    weights = layers * (4 * h * h + 2 * h * b["intermediate"]) + h * h + h * vocab
    return 6.0 * weights * t + 12.0 * layers * t * t * h


def targets_plan(
    python: str = "python3",
    quick: bool = False,
    rows_dir: str = "gpu-check.rows",
    images_dir: str = "gpu-check.images",
) -> list[Row]:
    """The rows that answer issue 41's targets (:data:`TARGETS`), cheapest first, with estimates
    that sum (with the tests) to under :data:`TARGETS_BUDGET_S`."""
    sizes = QUICK if quick else FULL
    rows: list[Row] = []

    def results(name: str) -> str:
        return f"{rows_dir}/{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()}.json"

    def stoker(name: str, model: str, dataset: str, batch: int, flags: list[str], est: float, **kw: Any) -> None:
        res = results(name)
        argv = _stoker_train(python, model, dataset, batch, "bf16", kw.pop("sizes", sizes), flags, res, **kw)
        rows.append(Row(name, "stoker", _variant(flags), model, dataset, batch, "bf16", argv, results_file=res,
                        est_s=est, real_images=any(f.startswith("--data_dir") for f in flags)))  # fmt: skip

    r20 = _plain(python, "resnet20", "cifar10", 128, "bf16", "cuda_graph", sizes, optimizer="sgd")
    rows.append(Row(R20_PLAIN, "plain", "cuda_graph", "resnet20", "cifar10", 128, "bf16", r20, est_s=15.0))
    stoker(R20_STOKER, "resnet20", "cifar10", 128, ["--compile=false", "--cuda_graph=true"], 20.0, optimizer=None)
    bert = [python, "benchmarks/gpu_check.py", "plain", "--model=bert_large", "--precision=bf16", "--variant=eager"]
    bert += [f"--num_batches={sizes.num_batches}", f"--num_warmup_batches={ITERATIONS_PER_LOOP}"]
    rows.append(Row(BERT_PLAIN, "plain", "eager", "bert", "text", 32, "bf16", bert, data_format=None, est_s=25.0,
                    flops_per_example=bert_flops()))  # fmt: skip
    rows.append(_bert_recipe(python, rows_dir, BERT_EAGER, "none", sizes))
    for variant, est in (("eager", 15.0), ("compiled", 60.0)):
        argv = _plain(python, "resnet50", "imagenet", 256, "bf16", variant, sizes)
        rows.append(
            Row(f"{R50} plain {variant}", "plain", variant, "resnet50", "imagenet", 256, "bf16", argv, est_s=est)
        )
    stoker(f"{R50} stoker eager", "resnet50", "imagenet", 256, ["--compile=false"], 20.0)
    stoker(f"{R50} stoker compiled", "resnet50", "imagenet", 256, ["--compile=module"], 65.0)
    real = Sizes(num_batches=REAL_TIMED_STEPS, num_warmup_batches=sizes.num_warmup_batches, iterations=0)
    flags = ["--compile=module", f"--data_dir={images_dir}"]
    stoker(f"{R50} stoker compiled real JPEGs", "resnet50", "imagenet", 256, flags, 75.0, sizes=real)
    rows[-1].steady_from_step = STEADY_FROM
    rows.append(_bert_recipe(python, rows_dir, BERT_COMPILED, "module", sizes))
    return rows


def _variant(flags: list[str]) -> str:
    if "--cuda_graph=true" in flags:
        return "cuda_graph"
    return "compiled" if "--compile=module" in flags else "eager"


def plan_estimate(rows: list[Row], with_tests: bool = True) -> float:
    """Seconds the plan is estimated to take: the rows' estimates, the tests', the JPEG folder's."""
    images = 10.0 if any(r.real_images for r in rows) else 0.0
    return sum(r.est_s for r in rows) + (TARGET_TESTS_EST_S if with_tests else 0.0) + images


def target_lines(rows: list[Row]) -> list[str]:
    """Each target with its threshold and what this run measured (or why it did not)."""
    by_name = {r.name: r for r in rows}
    lines = []
    for what, num, den, threshold in TARGETS:
        a, b = by_name.get(num), by_name.get(den) if den else None
        want = f">= {100 * threshold:.0f} % MFU" if den is None else f">= {threshold:.2f}x"
        value = _rate(a)
        if den is None:
            mfu = a.result.get("mfu") if a else None
            got, ok = (f"{100 * mfu:.1f} % MFU", mfu >= threshold) if mfu is not None else (None, False)
        else:
            base = _rate(b)
            got, ok = (f"{value / base:.3f}x", value / base >= threshold) if value and base else (None, False)
        if got is None:
            missing = [r.name for r in (a, b) if r is not None and not _rate(r)] or [num]
            why = "; ".join(f"{n}: {by_name[n].result.get('status', 'not run') if n in by_name else 'not in the plan'}"
                            for n in missing)  # fmt: skip
            lines.append(f"target {what}: {want}: not measured ({why})")
        else:
            lines.append(f"target {what}: {want}: {got} {'MET' if ok else 'MISSED'}")
    return lines


def _rate(row: Row | None) -> float | None:
    """A row's rate for the targets: the steady rate of a real-data row (None if not measured)."""
    if row is None or row.result.get("status") != "ok":
        return None
    if row.steady_from_step is not None:
        return row.result.get("steady_images_per_sec")
    return row.result.get("images_per_sec")


def steady_rate(step_times: list[float], batch: int, loop: int, from_step: int) -> float | None:
    """Images/sec of the timed steps from ``from_step`` on (``step_times``: seconds per step of
    each loop of ``loop`` steps); ``None`` with fewer than ``from_step`` steps after it."""
    skip = -(-from_step // loop)
    later = step_times[skip:]
    if len(later) * loop < from_step:
        return None
    return batch / (sum(later) / len(later))


# ----------------------------------------------------------------------------- output parsing
_TOTAL_RE = re.compile(r"^total images/sec: ([\d.]+)$", re.MULTILINE)
_LATENCY_RE = re.compile(
    r"Latencies - avg: +([\d.]+), 99th percentile: +([\d.]+), 99.9th percentile: +([\d.]+), "
    r"max: +([\d.]+)"
)
_MFU_RE = re.compile(r"^MFU: ([\d.]+) %$", re.MULTILINE)
_RECIPE_RE = re.compile(r"^training: ([\d.]+) examples/sec \(steps [^)]*\)(?:, MFU ([\d.]+) %)?", re.MULTILINE)


def parse_stoker_output(text: str) -> dict[str, float]:
    """images/sec (``total images/sec``), latencies and stoker's own MFU (its measured peak) from
    ``stoker bench`` output; keys are absent where a line is."""
    out: dict[str, float] = {}
    if m := _TOTAL_RE.findall(text):
        out["images_per_sec"] = float(m[-1])
    if m := _LATENCY_RE.findall(text):
        avg, p99, p999, mx = (float(v) for v in m[-1])
        out.update(latency_avg_ms=avg, latency_p99_ms=p99, latency_p999_ms=p999, latency_max_ms=mx)
    if m := _MFU_RE.findall(text):
        out["stoker_mfu_measured_peak"] = float(m[-1]) / 100
    if m := _RECIPE_RE.findall(text):  # a recipe's line (stoker train bert): examples/sec, MFU of its own peak
        speed, mfu = m[-1]
        out["images_per_sec"] = float(speed)
        if mfu:
            out["stoker_mfu"] = float(mfu) / 100
    return out


def parse_plain_output(text: str) -> dict[str, float]:
    """The JSON object the ``plain`` child prints as its last line."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def _pytest_summary(text: str) -> str:
    lines = [
        line.strip("= ")
        for line in text.strip().splitlines()
        if re.search(r"\d+ (passed|failed|skipped|error|deselected)", line)
    ]
    return lines[-1] if lines else (text.strip().splitlines() or [""])[-1]


# ----------------------------------------------------------------------------- running
def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_command(argv: list[str], timeout: float, log: Path | None = None) -> tuple[int | None, str, float]:
    """(exit status or None on timeout, stdout+stderr, seconds). The child runs in its own session
    and the whole group is killed on timeout (torchrun's workers included)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(out)
    return rc, out, time.perf_counter() - start


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def measure_row(
    row: Row, timeout: float, log: Path, gflop_forward: float | None, peak_tflops: float | None
) -> dict[str, Any]:
    if row.scratch:
        shutil.rmtree(ROOT / row.scratch, ignore_errors=True)  # a rerun must not resume the last run's model_dir
    try:
        rc, out, seconds = run_command(row.argv, timeout, log)
    finally:
        if row.scratch:
            shutil.rmtree(ROOT / row.scratch, ignore_errors=True)  # BERT-large's checkpoint: 4 GB
    res: dict[str, Any] = {
        "elapsed_s": round(seconds, 1),
        "log": str(log.relative_to(ROOT) if log.is_relative_to(ROOT) else log),
    }
    if rc is None:
        return {**res, "status": f"timeout after {timeout:.0f} s", "output_tail": _tail(out)}
    if rc != 0:
        return {**res, "status": f"failed: exit {rc}", "output_tail": _tail(out)}
    if row.impl == "restart":  # a ratio of times to full speed, no images/sec
        parsed_restart = parse_restart_output(out)
        if not parsed_restart:
            return {**res, "status": "failed: no restart ratio in the output", "output_tail": _tail(out)}
        return {**res, **parsed_restart, "status": "ok"}
    parsed = parse_plain_output(out) if row.impl == "plain" else parse_stoker_output(out)
    if row.results_file and (ROOT / row.results_file).exists():  # the whole result: more digits than the text
        full = json.loads((ROOT / row.results_file).read_text())
        for key in (
            "images_per_sec",
            "latency_avg_ms",
            "latency_p99_ms",
            "compile",
            "precision",
            "device",
            "data_format",
        ):
            if full.get(key) is not None:
                parsed[key] = full[key]
        if row.steady_from_step is not None:
            steady = steady_rate(
                full.get("step_times") or [], row.batch_size, ITERATIONS_PER_LOOP, row.steady_from_step
            )
            parsed["steady_images_per_sec"] = steady
            if steady is None:
                parsed["steady_note"] = (
                    f"not measured: fewer than {row.steady_from_step} timed steps after step {row.steady_from_step}"
                )
    if not parsed.get("images_per_sec"):
        return {**res, "status": "failed: no images/sec in the output", "output_tail": _tail(out)}
    if row.impl == "stoker" and parsed.get("data_format") not in (None, "NHWC"):
        given = f"--data_format={row.data_format}" if row.data_format else "no --data_format (the CUDA default)"
        return {**res, **parsed, "status": f"failed: ran {parsed['data_format']} with {given}, expected NHWC"}
    res.update(parsed, status="ok")
    if row.flops_per_example:
        res["gflop_per_image"] = row.flops_per_example / 1e9
        if peak_tflops:
            res["mfu"] = res["images_per_sec"] * res["gflop_per_image"] / (peak_tflops * 1000.0 * row.nproc)
    elif gflop_forward:
        res["gflop_per_image"] = gflop_forward * (3.0 if row.training else 1.0)
        if peak_tflops:
            res["mfu"] = res["images_per_sec"] * res["gflop_per_image"] / (peak_tflops * 1000.0 * row.nproc)
    return res


def _mfu_text(row: Row) -> str:
    mfu = row.result.get("mfu")
    if mfu is not None:
        return f"{100 * mfu:.1f} %"
    return "n/a (unknown peak)" if row.result.get("status") == "ok" else "-"


def table(rows: list[Row]) -> str:
    lines = ["| row | images/sec | MFU | status |", "|---|---:|---:|---|"]
    for row in rows:
        ips = row.result.get("images_per_sec")
        lines.append(
            f"| {row.name} | {f'{ips:.1f}' if ips else '-'} | {_mfu_text(row)} | {row.result.get('status', '-')} |"
        )
    return "\n".join(lines)


def _peak_source() -> str:
    from stoker.kernels.datasheet import PEAK_SOURCE

    return PEAK_SOURCE


def no_cuda_message(torch: Any) -> str:
    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
    return (
        f"gpu-check: no CUDA device visible to this Python (torch {torch.__version__}, {built}); "
        "run it on a machine with an NVIDIA GPU: make gpu-check PY=python3"
    )


def print_plan(args: argparse.Namespace, rows: list[Row]) -> None:
    print(
        f"gpu-check plan (dry run: nothing is run). Each step runs from {ROOT} with PYTHONPATH=src in its own "
        f"process, timeout {args.step_timeout:.0f} s (or the budget left); overall budget {args.budget:.0f} s."
    )
    print("tests: PYTHONPATH=src " + shlex.join(pytest_argv(args.python, getattr(args, "test_paths", None))))
    if args.collect:
        rc, out, _ = run_command(
            [*pytest_argv(sys.executable, getattr(args, "test_paths", None)), "--collect-only"], timeout=300
        )
        ids = [line for line in out.splitlines() if "::" in line]
        print(f"  selects {len(ids)} test(s):" if rc == 0 else f"  collection failed (exit {rc}):\n{_tail(out)}")
        for test_id in ids:
            print(f"    {test_id}")
    print(f"rows ({len(rows)}):")
    for i, row in enumerate(rows, 1):
        note = f"   [needs {row.nproc} CUDA devices, else: skipped: 1 device]" if row.nproc > 1 else ""
        print(f"{i:3d}. {row.name}{note}")
        print(f"     {row.command}")
        print(f"     estimate {row.est_s:.0f} s")
    total = plan_estimate(rows, with_tests=not args.skip_tests)
    fits = "within" if total <= args.budget else "OVER"
    print(f"estimated total: {total:.0f} s (tests and JPEG folder included), {fits} the budget of {args.budget:.0f} s")
    if getattr(args, "plan", "full") == "targets":
        print("targets (each printed at the end with what was measured, or 'not measured' and why):")
        for what, num, den, threshold in TARGETS:
            want = f">= {100 * threshold:.0f} % MFU of {num}" if den is None else f">= {threshold:.2f}x"
            print(f"  {what}: {want}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plain"]:
        return plain_main(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="exit status: 0 passed, 1 a test or row failed, 2 usage, 3 no CUDA, 4 no torch/stoker",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the test command and every row's command, run nothing"
    )
    parser.add_argument(
        "--no-collect",
        dest="collect",
        action="store_false",
        help="with --dry-run: do not list the tests the pytest selection collects",
    )
    parser.add_argument(
        "--out", default="gpu-check.json", help="results JSON (a .md table and a .rows/ folder beside it)"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK.num_batches} timed batches per row instead of {FULL.num_batches}"
    )
    parser.add_argument(
        "--step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT_S, help="seconds per step (the tests, each row)"
    )
    parser.add_argument(
        "--plan",
        choices=("targets", "full"),
        default="targets",
        help="targets: the rows that answer issue 41's targets, under 9 minutes (default); full: every row",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for the whole run; rows that do not fit are skipped (default: {TARGETS_BUDGET_S:.0f} for "
        f"the targets plan, {DEFAULT_BUDGET_S:.0f} for the full one)",
    )
    parser.add_argument(
        "--peak_tflops", type=float, help="the device's dense bf16 peak, where the built-in table does not know it"
    )
    parser.add_argument("--skip-tests", action="store_true", help="benchmark rows only")
    parser.add_argument("--select", metavar="REGEX", help="only the rows whose name matches (re.search)")
    parser.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    targets = args.plan == "targets"
    if args.budget is None:
        args.budget = TARGETS_BUDGET_S if targets else DEFAULT_BUDGET_S
    args.test_paths = TARGET_TESTS if targets else None
    out_path = Path(args.out).resolve()
    rows_dir = out_path.with_suffix(".rows")
    rows_rel = os.path.relpath(rows_dir, ROOT)
    images_rel = os.path.relpath(out_path.with_suffix(".images"), ROOT)
    rows = (targets_plan if targets else plan)(args.python, args.quick, rows_rel, images_rel)
    if args.select:
        try:
            pattern = re.compile(args.select)
        except re.error as e:
            parser.error(f"--select: not a regular expression ({e})")
        rows = [r for r in rows if pattern.search(r.name)]
        if not rows:
            parser.error(f"--select: {args.select!r} matches no row (--dry-run --no-collect lists them)")
    if args.dry_run:
        print_plan(args, rows)
        return EXIT_OK

    try:
        import torch
    except ImportError as e:
        print(
            f"gpu-check: this Python ({sys.executable}) cannot import torch ({e}); install a CUDA build of torch, "
            "then: make gpu-check PY=python3",
            flush=True,
        )
        return EXIT_NO_TORCH
    if not torch.cuda.is_available():
        print(no_cuda_message(torch), flush=True)
        return EXIT_NO_CUDA
    try:
        import stoker
        from stoker.bench.report import flops_per_image
    except ImportError as e:
        print(
            f"gpu-check: cannot import stoker from {ROOT / 'src'} ({e}); run from the repository with "
            "PYTHONPATH=src and stoker's dependencies (numpy, safetensors, tensorboard, tqdm) installed",
            flush=True,
        )
        return EXIT_NO_TORCH
    return run_all(args, rows, out_path, rows_dir, torch, stoker.__version__, flops_per_image)


def run_all(
    args: argparse.Namespace,
    rows: list[Row],
    out_path: Path,
    rows_dir: Path,
    torch: Any,
    stoker_version: str,
    flops_per_image: Any,
) -> int:
    start = time.perf_counter()
    name = torch.cuda.get_device_name(0)
    count = torch.cuda.device_count()
    peak, peak_label = (args.peak_tflops, "--peak_tflops") if args.peak_tflops else peak_bf16_tflops(name)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    report: dict[str, Any] = {
        "tool": "stoker gpu-check",
        "format": 1,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": name,
        "device_count": count,
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "stoker_version": stoker_version,
        "git_commit": commit,
        "peak_bf16_tflops": peak,
        "peak_entry": peak_label,
        "peak_source": _peak_source() if peak and not args.peak_tflops else peak_label,
        "quick": args.quick,
        "budget_s": args.budget,
        "step_timeout_s": args.step_timeout,
        "tests": {},
        "rows": [],
    }
    print(
        f"gpu-check: {name} x{count}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"bf16 peak {f'{peak:g} TFLOP/s ({peak_label})' if peak else 'unknown'}",
        flush=True,
    )

    def left() -> float:
        return args.budget - (time.perf_counter() - start)

    def save() -> None:
        report["rows"] = [
            {**{k: v for k, v in asdict(r).items() if k not in ("argv", "result")}, "command": r.command, **r.result}
            for r in rows
        ]
        report["elapsed_s"] = round(time.perf_counter() - start, 1)
        out_path.write_text(json.dumps(report, indent=1) + "\n")

    # 1. the cuda-marked tests
    tests: dict[str, Any] = {
        "command": "PYTHONPATH=src " + shlex.join(pytest_argv(args.python, getattr(args, "test_paths", None)))
    }
    if args.skip_tests:
        tests["status"] = "skipped: --skip-tests"
    elif subprocess.run([args.python, "-c", "import pytest"], capture_output=True).returncode != 0:
        tests["status"] = "skipped: pytest is not installed for this Python"
    else:
        print("tests: " + tests["command"], flush=True)
        timeout = min(args.step_timeout, max(left(), 1.0))
        rc, out, seconds = run_command(
            pytest_argv(args.python, getattr(args, "test_paths", None)), timeout, rows_dir / "tests.log"
        )
        summary = _pytest_summary(out)
        status = "ok" if rc == 0 else (f"timeout after {timeout:.0f} s" if rc is None else f"failed: exit {rc}")
        tests.update(status=status, summary=summary, elapsed_s=round(seconds, 1))
        if rc != 0:
            tests["output_tail"] = _tail(out, 40)
    print(f"tests: {tests['status']}{' (' + tests['summary'] + ')' if tests.get('summary') else ''}", flush=True)
    report["tests"] = tests
    save()

    # 2. the generated JPEG folder the real-image rows read
    if any(r.real_images for r in rows):
        images = out_path.with_suffix(".images")
        try:
            seconds = make_images(images)
            report["images"] = {"dir": str(images), "count": REAL_IMAGES, "generated_s": round(seconds, 1)}
            print(
                f"images: {REAL_IMAGES} JPEGs in {images} ({'kept' if not seconds else f'{seconds:.1f} s'})", flush=True
            )
        except Exception as e:  # noqa: BLE001 - the rows that need them fail with this reason, the rest run
            report["images"] = {"dir": str(images), "error": f"{type(e).__name__}: {e}"}
            print(f"images: could not be generated ({e})", flush=True)
            for r in rows:
                if r.real_images:
                    r.result = {"status": f"failed: the JPEG folder could not be generated ({e})"}
        save()

    # 3. the benchmark rows
    flops: dict[tuple[str, str], float | None] = {}
    for i, row in enumerate(rows, 1):
        if row.result:  # already decided (its input could not be made)
            pass
        elif row.nproc > count:
            row.result = {"status": f"skipped: {count} device{'s' if count != 1 else ''}"}
        elif left() < MIN_ROW_S:
            row.result = {"status": f"skipped: time budget ({args.budget:.0f} s) spent"}
        else:
            key = (row.model, row.dataset)
            if row.flops_per_example:
                flops[key] = None  # the row counts its own
            elif key not in flops:
                try:
                    flops[key] = flops_per_image(row.model, row.dataset)
                except Exception:  # noqa: BLE001 - MFU becomes n/a, the row still runs
                    flops[key] = None
            print(f"[{i}/{len(rows)}] {row.name}", flush=True)
            row.result = measure_row(
                row, min(args.step_timeout, left()), rows_dir / f"{row.slug}.log", flops[key], peak
            )
        ips = row.result.get("images_per_sec")
        print(
            f"[{i}/{len(rows)}] {row.name}: {f'{ips:.1f} images/sec, MFU {_mfu_text(row)}, ' if ips else ''}"
            f"{row.result['status']}",
            flush=True,
        )
        save()

    text = table(rows) + "\n\n" + "\n".join(target_lines(rows))
    report["targets"] = target_lines(rows)
    against = f"{peak:g} TFLOP/s ({peak_label}; {report['peak_source']})" if peak else "n/a (unknown peak)"
    header = (
        f"gpu-check {report['date']}: {name} x{count}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
        f"MFU against {against}"
    )
    print(
        "\n"
        + header
        + "\n"
        + f"tests: {tests['status']}"
        + (f" ({tests['summary']})" if tests.get("summary") else "")
        + "\n\n"
        + text,
        flush=True,
    )
    out_path.with_suffix(".md").write_text(header + "\n\n" + f"tests: {tests['status']}\n\n" + text + "\n")
    failed = not (tests["status"] == "ok" or tests["status"].startswith("skipped")) or any(
        not (r.result["status"] == "ok" or r.result["status"].startswith("skipped")) for r in rows
    )
    report["status"] = "failed" if failed else "ok"
    save()
    print(f"gpu-check: {report['status']}; wrote {out_path} and {out_path.with_suffix('.md')}", flush=True)
    return EXIT_FAILED if failed else EXIT_OK


# ----------------------------------------------------------------------------- the hand-written loop
def plain_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_check.py plain", description="a hand-written PyTorch training loop")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--data_name", default="imagenet")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16")
    p.add_argument("--variant", choices=("eager", "compiled", "cuda_graph"), default="eager")
    p.add_argument("--num_batches", type=int, default=FULL.num_batches)
    p.add_argument("--num_warmup_batches", type=int, default=FULL.num_warmup_batches)
    p.add_argument("--optimizer", choices=("sgd", "momentum"), default="momentum", help="resnet loops: the update")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests run the loop here
    p.add_argument(
        "--bert_shape", default=None, help=argparse.SUPPRESS
    )  # the tests' tiny shape: h,layers,heads,ff,seq,b
    return p


def plain_main(argv: list[str]) -> int:
    """``gpu_check.py plain ...``: one hand-written training loop; prints one JSON line."""
    a = plain_parser().parse_args(argv)
    if a.model == "bert_large":
        shape = dict(BERT_LARGE)
        if a.bert_shape:
            shape = dict(zip(shape, (int(v) for v in a.bert_shape.split(",")), strict=True))
        result = plain_bert_loop(a.precision, a.variant, a.num_batches, a.num_warmup_batches, a.device, shape)
        print(json.dumps(result), flush=True)
        return 0
    print(
        json.dumps(
            plain_loop(
                a.model,
                a.data_name,
                a.batch_size,
                a.precision,
                a.variant,
                a.num_batches,
                a.num_warmup_batches,
                a.device,
                a.optimizer,
            )
        ),
        flush=True,
    )
    return 0


STATIC_LOSS_SCALE = 128.0  # fp16 in the CUDA graph (stoker bench's default static scale too)


def plain_loop(
    model_name: str,
    dataset: str,
    batch: int,
    precision: str,
    variant: str,
    num_batches: int,
    num_warmup: int,
    device: str = "cuda",
    optimizer: str = "momentum",
) -> dict[str, Any]:
    """Images/sec of a hand-written loop: channels_last, AMP, SGD with Nesterov momentum 0.9 and
    weight decay 4e-5 (``stoker bench --optimizer=momentum``'s update; ``optimizer="sgd"``: plain
    SGD with that decay, the bench's default), synthetic data on the device.

    fp16: eager and compiled use ``torch.amp.GradScaler`` (dynamic, as the PyTorch AMP recipe);
    the CUDA graph uses a static loss scale of 128, because GradScaler's skip-the-step check reads
    a flag on the host. ``cuda_graph`` captures forward, backward and the optimizer step in one
    ``torch.cuda.graph`` after three warm-up steps on a side stream (the PyTorch docs' whole-network
    capture), autocast without its weight cache. The host waits for the device once per timed run.
    """
    import torch
    import torch.nn.functional as F

    from stoker.data import synthetic_images
    from stoker.models import create_model, get_model_info

    dev = torch.device(device)
    info = get_model_info(model_name, dataset)
    torch.manual_seed(1234)
    model = create_model(model_name, dataset=dataset).to(dev, memory_format=torch.channels_last).train()
    momentum = {"momentum": 0.9, "nesterov": True} if optimizer == "momentum" else {}
    opt = torch.optim.SGD(model.parameters(), lr=0.005, weight_decay=4e-5, **momentum)
    images, labels = next(
        iter(
            synthetic_images(
                (3, info.image_size, info.image_size), info.num_classes, batch_size=batch, seed=1234, channels_last=True
            )
        )
    )
    images, labels = images.to(dev), labels.to(dev)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    graph = variant == "cuda_graph"

    def autocast() -> Any:
        return torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None, cache_enabled=not graph)

    forward = torch.compile(model) if variant == "compiled" else model
    scaler = torch.amp.GradScaler(dev.type, enabled=precision == "fp16" and not graph)
    static_scale = STATIC_LOSS_SCALE if precision == "fp16" and graph else None

    def step(zero_grad: bool = True) -> torch.Tensor:
        with autocast():
            loss = F.cross_entropy(forward(images), labels)
        if static_scale:
            (loss * static_scale).backward()
            grads = [q.grad for q in model.parameters() if q.grad is not None]
            torch._foreach_mul_(grads, 1.0 / static_scale)
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    first = time.perf_counter()
    if graph:
        if dev.type != "cuda":
            raise SystemExit("gpu_check.py plain --variant=cuda_graph needs CUDA")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # allocates grads and momentum buffers outside the capture
                step()
        torch.cuda.current_stream().wait_stream(side)
        # Gradients are None when the capture starts, so the captured backward writes them
        # afresh (into the graph's pool) on every replay instead of accumulating.
        opt.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = step(zero_grad=False)

        def run() -> torch.Tensor:
            g.replay()
            return static_loss
    else:
        run = step
    loss = run()
    sync()
    first_step_s = time.perf_counter() - first  # compile / capture included
    for _ in range(max(num_warmup - 1, 0)):
        run()
    sync()
    start = time.perf_counter()
    for _ in range(num_batches):
        loss = run()
    sync()
    elapsed = time.perf_counter() - start
    loss_value = float(loss)
    if loss_value != loss_value or loss_value in (float("inf"), float("-inf")):
        raise SystemExit(f"plain loop: loss is {loss_value}")
    return {
        "images_per_sec": num_batches * batch / elapsed,
        "elapsed_s": elapsed,
        "first_step_s": first_step_s,
        "loss": loss_value,
        "device": str(dev),
        "variant": variant,
        "precision": precision,
    }


def _plain_bert_model(shape: dict[str, int], vocab: int = 257) -> Any:
    """BERT as a PyTorch user writes it: embeddings, ``nn.TransformerEncoder`` (post-norm, GELU,
    dropout 0.1; its attention is ``scaled_dot_product_attention``) and BERT's MLM head."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    h = shape["hidden"]

    class PlainBert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token = nn.Embedding(vocab, h)
            self.position = nn.Embedding(shape["seq_len"], h)
            self.norm = nn.LayerNorm(h, eps=1e-12)
            layer = nn.TransformerEncoderLayer(
                h, shape["heads"], shape["intermediate"], dropout=0.1, activation="gelu", batch_first=True,
                layer_norm_eps=1e-12,
            )  # fmt: skip
            self.encoder = nn.TransformerEncoder(layer, shape["layers"], enable_nested_tensor=False)
            self.head = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.LayerNorm(h, eps=1e-12), nn.Linear(h, vocab))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = F.dropout(self.norm(self.token(tokens) + self.position(positions)), 0.1, self.training)
            return self.head(self.encoder(x))

    return PlainBert()


def plain_bert_step(precision: str, variant: str, device: str, shape: dict[str, int]) -> Callable[[], Any]:
    """One training step of a hand-written BERT masked-LM loop with the recipe's work per step:
    15 % of each window's positions are targets (the loss over them, in fp32), AdamW (fused on
    CUDA, weight decay 0.01 but not on biases and LayerNorm weights), gradient clipping at 1.0,
    bf16 autocast. Synthetic tokens on the device, one batch for every step; ``compiled``:
    ``torch.compile`` of the model. The step returns the (detached) loss without waiting for it.
    Shared with ``benchmarks/transformer.py`` (the same loop on CPU, beside the recipe)."""
    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    torch.manual_seed(1234)
    model = _plain_bert_model(shape).to(dev).train()
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() > 1], "weight_decay": 0.01},
        {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-4, fused=dev.type == "cuda")
    b, t = shape["batch"], shape["seq_len"]
    tokens = torch.randint(0, 257, (b, t), device=dev)
    targets = torch.rand(b, t, device=dev).argsort(1)[:, : max(1, round(0.15 * t))]
    labels = torch.full((b, t), -100, device=dev).scatter_(1, targets, tokens.gather(1, targets))
    forward = torch.compile(model) if variant == "compiled" else model
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step() -> torch.Tensor:
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            logits = forward(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def plain_bert_loop(
    precision: str, variant: str, num_batches: int, num_warmup: int, device: str, shape: dict[str, int]
) -> dict[str, Any]:
    """Examples/sec of :func:`plain_bert_step` after ``num_warmup`` untimed steps."""
    import torch

    dev = torch.device(device)
    step = plain_bert_step(precision, variant, device, shape)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    first = time.perf_counter()
    for _ in range(max(num_warmup, 1)):
        step()
    sync()
    warm_s = time.perf_counter() - first
    start = time.perf_counter()
    for _ in range(num_batches):
        loss = step()
    sync()
    elapsed = time.perf_counter() - start
    return {
        "images_per_sec": num_batches * shape["batch"] / elapsed,  # examples (windows) per second
        "elapsed_s": elapsed,
        "warm_up_s": warm_s,
        "loss": float(loss),
        "device": str(dev),
        "variant": variant,
        "precision": precision,
    }


if __name__ == "__main__":
    sys.exit(main())
