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
:data:`PEAK_BF16_TFLOPS` (``--peak_tflops`` overrides; unknown devices print ``n/a``).

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
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_CUDA, EXIT_NO_TORCH = 0, 1, 2, 3, 4
ROOT = Path(__file__).resolve().parents[1]
PYTEST_ARGS = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests"]
DEFAULT_BUDGET_S = 570.0  # the issue: within 10 minutes on one H100
DEFAULT_STEP_TIMEOUT_S = 300.0
MIN_ROW_S = 20.0  # a row is not started with less budget than this left

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's data sheets (RTX 4090: the
# Ada architecture whitepaper, bf16 with fp32 accumulation). V100 and T4 have no bf16: their fp16
# tensor peak is given. First match of the device name wins, so specific names come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", 756.0, "H100 PCIe"),
    (r"H100.*NVL", 835.0, "H100 NVL"),
    (r"H200.*NVL", 835.0, "H200 NVL"),
    (r"GH200", 989.0, "GH200"),
    (r"H200", 989.0, "H200 SXM"),
    (r"H100", 989.0, "H100 SXM"),
    (r"A100", 312.0, "A100"),
    (r"L40S", 362.0, "L40S"),
    (r"\bL40\b", 181.0, "L40"),
    (r"\bL4\b", 121.0, "L4"),
    (r"\bA10\b", 125.0, "A10"),
    (r"RTX 4090", 165.2, "RTX 4090"),
    (r"V100.*PCIE", 112.0, "V100 PCIe (fp16 tensor; no bf16)"),
    (r"V100", 125.0, "V100 SXM2 (fp16 tensor; no bf16)"),
    (r"\bT4\b", 65.0, "T4 (fp16 tensor; no bf16)"),
)
PEAK_SOURCE = "NVIDIA data sheets, dense bf16 tensor core (no sparsity)"


def peak_bf16_tflops(device_name: str) -> tuple[float | None, str]:
    """(TFLOP/s, which entry) for a ``torch.cuda.get_device_name()``; ``(None, 'unknown peak')``."""
    for pattern, tflops, label in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return tflops, label
    return None, "unknown peak"


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


def pytest_argv(python: str) -> list[str]:
    return [python, *PYTEST_ARGS]


def _plain(python: str, model: str, dataset: str, batch: int, precision: str, variant: str, sizes: Sizes) -> list[str]:
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
        "--optimizer=momentum",
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
    return rows


# ----------------------------------------------------------------------------- output parsing
_TOTAL_RE = re.compile(r"^total images/sec: ([\d.]+)$", re.MULTILINE)
_LATENCY_RE = re.compile(
    r"Latencies - avg: +([\d.]+), 99th percentile: +([\d.]+), 99.9th percentile: +([\d.]+), "
    r"max: +([\d.]+)"
)
_MFU_RE = re.compile(r"^MFU: ([\d.]+) %$", re.MULTILINE)


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
    rc, out, seconds = run_command(row.argv, timeout, log)
    res: dict[str, Any] = {
        "elapsed_s": round(seconds, 1),
        "log": str(log.relative_to(ROOT) if log.is_relative_to(ROOT) else log),
    }
    if rc is None:
        return {**res, "status": f"timeout after {timeout:.0f} s", "output_tail": _tail(out)}
    if rc != 0:
        return {**res, "status": f"failed: exit {rc}", "output_tail": _tail(out)}
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
    if not parsed.get("images_per_sec"):
        return {**res, "status": "failed: no images/sec in the output", "output_tail": _tail(out)}
    if row.impl == "stoker" and parsed.get("data_format") not in (None, "NHWC"):
        given = f"--data_format={row.data_format}" if row.data_format else "no --data_format (the CUDA default)"
        return {**res, **parsed, "status": f"failed: ran {parsed['data_format']} with {given}, expected NHWC"}
    res.update(parsed, status="ok")
    if gflop_forward:
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
    print("tests: PYTHONPATH=src " + shlex.join(pytest_argv(args.python)))
    if args.collect:
        rc, out, _ = run_command([*pytest_argv(sys.executable), "--collect-only"], timeout=300)
        ids = [line for line in out.splitlines() if "::" in line]
        print(f"  selects {len(ids)} test(s):" if rc == 0 else f"  collection failed (exit {rc}):\n{_tail(out)}")
        for test_id in ids:
            print(f"    {test_id}")
    print(f"rows ({len(rows)}):")
    for i, row in enumerate(rows, 1):
        note = f"   [needs {row.nproc} CUDA devices, else: skipped: 1 device]" if row.nproc > 1 else ""
        print(f"{i:3d}. {row.name}{note}")
        print(f"     {row.command}")


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
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help="seconds for the whole run; rows that do not fit are skipped",
    )
    parser.add_argument(
        "--peak_tflops", type=float, help="the device's dense bf16 peak, where the built-in table does not know it"
    )
    parser.add_argument("--skip-tests", action="store_true", help="benchmark rows only")
    parser.add_argument("--select", metavar="REGEX", help="only the rows whose name matches (re.search)")
    parser.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out_path = Path(args.out).resolve()
    rows_dir = out_path.with_suffix(".rows")
    rows_rel = os.path.relpath(rows_dir, ROOT)
    images_rel = os.path.relpath(out_path.with_suffix(".images"), ROOT)
    rows = plan(args.python, args.quick, rows_rel, images_rel)
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
        "peak_source": PEAK_SOURCE if peak and not args.peak_tflops else peak_label,
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
    tests: dict[str, Any] = {"command": "PYTHONPATH=src " + shlex.join(pytest_argv(args.python))}
    if args.skip_tests:
        tests["status"] = "skipped: --skip-tests"
    elif subprocess.run([args.python, "-c", "import pytest"], capture_output=True).returncode != 0:
        tests["status"] = "skipped: pytest is not installed for this Python"
    else:
        print("tests: " + tests["command"], flush=True)
        timeout = min(args.step_timeout, max(left(), 1.0))
        rc, out, seconds = run_command(pytest_argv(args.python), timeout, rows_dir / "tests.log")
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
            if key not in flops:
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

    text = table(rows)
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
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests run the loop here
    return p


def plain_main(argv: list[str]) -> int:
    """``gpu_check.py plain ...``: one hand-written training loop; prints one JSON line."""
    a = plain_parser().parse_args(argv)
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
) -> dict[str, Any]:
    """Images/sec of a hand-written loop: channels_last, AMP, SGD with Nesterov momentum 0.9 and
    weight decay 4e-5 (``stoker bench --optimizer=momentum``'s update), synthetic data on the device.

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
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, nesterov=True, weight_decay=4e-5)
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


if __name__ == "__main__":
    sys.exit(main())
