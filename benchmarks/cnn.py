r"""``stoker bench`` against a plain PyTorch loop and tf_cnn_benchmarks' figures.

For trivial (ImageNet), resnet20 (CIFAR-10) and resnet50 (ImageNet) (and inception3, vgg16,
ncf and deepspeech2 when ``--models`` names them), batch 32, stoker's default data format
(NHWC, channels_last, for these convnets; the plain loop and TensorFlow run NHWC), synthetic
data, fp32, SGD with weight decay, as the reference figures' runs (docs/results/reference.md),
four configurations each run in a fresh process (the host-memory setting is process-wide and
cannot be undone), interleaved round by round so machine noise hits all alike:

- ``stoker``: ``stoker bench`` as a user runs it (its defaults keep freed host memory);
- ``plain``: the same step written by hand (same zoo model, optimizer, data, weight decay; no
  framework) with the C library's malloc defaults: "plain PyTorch" of docs/results/reference.md;
- ``stoker, C malloc``: ``stoker bench --keep_host_memory=false``;
- ``plain, kept memory``: the hand-written loop after ``stoker.keep_freed_host_memory()``;
- ``tensorflow`` (``--configs`` picks it): TensorFlow's own tf_cnn_benchmarks.py with the same
  model, data set, batch, threads and step counts, run from the peer install of
  ``benchmarks/peers/README.md`` (``$PEERS_DIR``, default ``~/.cache/stoker-peers``), on this
  machine in the same rounds: the side-by-side column of issue 12;
- ``compile=module`` / ``compile=step`` (``--configs`` picks them): ``stoker bench --compile=module``
  and ``--compile=step`` (the whole training step compiled). Compilation happens in the warm-up
  batches, which are not timed; their columns are ratios to ``stoker`` (eager) of the same run.

``stoker / plain`` is what the harness gains over plain PyTorch on this machine; the targets
of issue 4 are stated on the AVX-512 reference machine (docs/results/reference.md) as
images/sec, so the table also gives the speed-up each target asks of plain PyTorch there
(resnet50 11.5 / 7.6, resnet20 710 / 640).
``stoker, C malloc / plain`` and ``stoker / plain, kept memory`` are the harness's own overhead
(target 1.00x) with the allocator equal on both sides.

    python benchmarks/cnn.py                      # all three models, 2 rounds
    python benchmarks/cnn.py --models resnet20 --rounds 3
    python benchmarks/cnn.py --models resnet20 resnet50 --rounds 1 \
        --configs stoker stoker_compile_module stoker_compile_step
    python benchmarks/cnn.py --configs stoker tensorflow      # against TensorFlow on this machine
    python benchmarks/cnn.py --configs stoker tensorflow --rounds 1 \
        --models trivial resnet20 resnet50 inception3 vgg16    # issue 26's five rows and targets
    python benchmarks/cnn.py --models trivial --data_dir DIR --configs stoker plain tensorflow

``--data_dir DIR``: real images instead of synthetic data (issue 25). ``DIR`` is a JPEG folder
(``DIR/<class>/<image>.jpg``); ``--generate N`` first fills it (once) with N ImageNet-shaped
JPEGs (500x375, quality 90, ``benchmarks/input_pipeline.py``'s generator). Then, side by side:
``stoker`` is ``stoker bench --data_dir=DIR`` (the JPEG folder, ``--nodistortions``: tf_cnn's
default training preprocessing); ``stoker_records`` the same on the TFRecords below (once
stoker reads TFRecords); ``plain`` a plain ``DataLoader(num_workers=<cores>)`` with Pillow's
random-resized crop and flip, uint8 batches normalised in the main process, and the same
step; ``tensorflow`` tf_cnn_benchmarks on the same images as its ImageNet TFRecords
(``train-0000k-of-0000n``, written once into ``DIR.tfrecords`` by the TensorFlow peer's own
Python with ``tf.io.TFRecordWriter``: labels 1-based, as tf_cnn's ``ImagenetDataset`` reads them).

With ``stoker`` and ``tensorflow`` both in ``--configs`` and more than one round, each round's
stoker / tensorflow ratio is printed with their median, and the target column's verdict reads
that median: each pair ran a minute apart, so it is the steadier figure on a noisy host. The
``stoker / tensorflow`` column is the ratio of the two medians (it can differ by a few percent).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from stoker.bench import BenchConfig, run_benchmark
from stoker.bench.plan import build_plan
from stoker.bench.train import l2_loss
from stoker.data import synthetic_images
from stoker.kernels.machine import busy_cores
from stoker.memory.host import keep_freed_host_memory
from stoker.models import create_model, get_model_info


@dataclass(frozen=True)
class Case:
    """One row: a model, its data set, how many steps, and tf_cnn_benchmarks' figure."""

    model: str
    dataset: str
    num_batches: int
    num_warmup_batches: int
    tf_images_per_sec: float
    batch: int = 32
    tf_data_name: str | None = None  # where tf_cnn_benchmarks files the model, if not ``dataset``

    def with_batches(self, num_batches: int) -> Case:
        return dataclasses.replace(self, num_batches=num_batches)


CASES = {
    "trivial": Case("trivial", "imagenet", 100, 10, 3614.0),
    "resnet20": Case("resnet20", "cifar10", 30, 5, 647.0),
    "resnet50": Case("resnet50", "imagenet", 5, 2, 10.4),
    # No reference figure either (docs/results/reference.md): the other two convnets of issue 26's targets.
    "inception3": Case("inception3", "imagenet", 5, 2, 0.0),
    "vgg16": Case("vgg16", "imagenet", 3, 1, 0.0),
    # No reference figure (0; docs/results/reference.md); compared with TensorFlow run beside
    # (--configs stoker tensorflow). ncf at its reference batch; deepspeech2's 3,494-frame
    # utterances at a batch this CPU can take.
    "ncf": Case("ncf", "movielens", 50, 5, 0.0, batch=2048, tf_data_name="imagenet"),
    "deepspeech2": Case("deepspeech2", "librispeech", 2, 1, 0.0, batch=2),
}
BATCH = 32
WEIGHT_DECAY = 4e-5  # tf_cnn_benchmarks' default, also in the plain loop


DATA_DIR: str | None = None  # --data_dir: real images (a JPEG folder) instead of synthetic data


def stoker_config(
    case: Case, keep_host_memory: bool = True, compile: bool | str = False, data_dir: str | None = None
) -> BenchConfig:
    """The ``stoker bench`` flags of ``case``: real images from ``data_dir`` (a JPEG folder or
    TFRecords, tf_cnn's default preprocessing) when given, else synthetic data."""
    real = {} if data_dir is None else {"data_dir": data_dir, "distortions": False}
    return BenchConfig(
        **real,
        compile=compile,
        model=case.model,
        data_name=case.dataset,
        batch_size=case.batch,
        data_format=None,  # stoker's default for the model on this device (NHWC for these convnets)
        num_batches=case.num_batches,
        num_warmup_batches=case.num_warmup_batches,
        device="cpu",
        display_every=10**6,
        weight_decay=WEIGHT_DECAY,
        keep_host_memory=keep_host_memory,
        init_learning_rate=0.005,  # the plain loop's constant rate, not the model's schedule
    )


def stoker_images_per_sec(
    case: Case, keep_host_memory: bool = True, compile: bool | str = False, data_dir: str | None = None
) -> float:
    plan = build_plan(stoker_config(case, keep_host_memory, compile, data_dir))
    if plan.threads.value == 1 and plan.cfg.num_intra_threads is None and plan.threads.note:
        torch.set_num_threads(1)  # as `stoker bench` where the input is the work: the decoders get the cores
    return run_benchmark(plan, log=lambda line: None)["images_per_sec"]


def plain_real_images_per_sec(case: Case, data_dir: str) -> float:
    """What a PyTorch user writes for real images: DataLoader + Pillow crop/flip, uint8 batches
    normalised in the main process, then the same step as :func:`plain_images_per_sec`."""
    sys.path.insert(0, str(Path(__file__).parent))
    from input_pipeline import PlainRealDataset  # noqa: PLC0415  (a sibling script)

    from stoker.data.images import TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor

    info = get_model_info(case.model, case.dataset)
    torch.manual_seed(1234)
    model = create_model(case.model, dataset=case.dataset).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, weight_decay=WEIGHT_DECAY)
    pre = ImagePreprocessor(TF_CNN_MEAN, TF_CNN_STD)
    loader = torch.utils.data.DataLoader(
        PlainRealDataset(Path(data_dir), info.image_size),
        batch_size=case.batch,
        shuffle=True,
        drop_last=True,
        num_workers=len(os.sched_getaffinity(0)),
        persistent_workers=True,
    )

    def batches():  # noqa: ANN202
        while True:
            yield from loader

    it = batches()

    def step() -> float:
        images, labels = next(it)
        logits = model(pre(images))
        loss = F.cross_entropy(logits, labels) + WEIGHT_DECAY * l2_loss(model)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(case.num_warmup_batches):
        step()
    start = time.perf_counter()
    for _ in range(case.num_batches):
        step()
    return case.num_batches * case.batch / (time.perf_counter() - start)


_TF_WRITER = r"""
import os, sys, tensorflow as tf
root, out, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
files = [(os.path.join(root, c, f), i + 1, c) for i, c in enumerate(classes)
         for f in sorted(os.listdir(os.path.join(root, c))) if f.lower().endswith((".jpg", ".jpeg"))]
def b(v): return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
def n(v): return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
os.makedirs(out, exist_ok=True)
for s in range(shards):
    with tf.io.TFRecordWriter(os.path.join(out, f"train-{s:05d}-of-{shards:05d}")) as w:
        for path, label, text in files[s::shards]:
            data = open(path, "rb").read()
            h, wd, _ = tf.image.decode_jpeg(data).shape
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": b(data), "image/format": b(b"JPEG"), "image/class/label": n(label),
                "image/class/text": b(text.encode()), "image/filename": b(os.path.basename(path).encode()),
                "image/height": n(h), "image/width": n(wd), "image/colorspace": b(b"RGB"), "image/channels": n(3),
            })).SerializeToString())
print(len(files))
"""


def tf_records_of(data_dir: str, shards: int = 8) -> Path:
    """tf_cnn's ImageNet TFRecords of the JPEG folder ``data_dir`` (written once, by TensorFlow itself)."""
    out = Path(str(data_dir).rstrip("/") + ".tfrecords")
    marker = out / f".complete-{shards}"
    if marker.exists():
        return out
    python = PEERS_DIR / "tfvenv" / "bin" / "python"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [str(python), "-c", _TF_WRITER, str(data_dir), str(out), str(shards)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"writing TFRecords with TensorFlow failed: {done.stderr[-2000:]}")
    marker.touch()
    return out


def plain_images_per_sec(case: Case) -> float:
    """The same training step written by hand: no Estimator, no hooks, no device loop."""
    info = get_model_info(case.model, case.dataset)
    torch.manual_seed(1234)
    model = create_model(case.model, dataset=case.dataset).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, weight_decay=WEIGHT_DECAY)
    images, labels = next(
        iter(
            synthetic_images(
                (3, info.image_size, info.image_size), info.num_classes, batch_size=BATCH, seed=1234, channels_last=True
            )
        )
    )

    def step() -> float:
        loss = F.cross_entropy(model(images), labels) + WEIGHT_DECAY * l2_loss(model)  # reported, as the harness
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # the harness reads each step's loss too

    for _ in range(case.num_warmup_batches):
        step()
    start = time.perf_counter()
    for _ in range(case.num_batches):
        step()
    return case.num_batches * BATCH / (time.perf_counter() - start)


PEERS_DIR = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "stoker-peers"))


def tensorflow_images_per_sec(case: Case, threads: int) -> float:
    """tf_cnn_benchmarks.py on the same work (a child process of the peer install's Python)."""
    python = PEERS_DIR / "tfvenv" / "bin" / "python"
    script_dir = PEERS_DIR / "benchmarks" / "scripts" / "tf_cnn_benchmarks"
    if not python.exists() or not script_dir.is_dir():
        raise SystemExit(
            f"--configs tensorflow: no TensorFlow peer in {PEERS_DIR}; install it with "
            "benchmarks/peers/setup-tf-cnn.sh (see benchmarks/peers/README.md) or set PEERS_DIR"
        )
    cmd = [
        str(python),
        "tf_cnn_benchmarks.py",
        "--device=cpu",
        "--data_format=NHWC",
        f"--model={case.model}",
        f"--batch_size={case.batch}",
        f"--num_batches={case.num_batches}",
        f"--num_warmup_batches={case.num_warmup_batches}",
        "--variable_update=parameter_server",
        "--local_parameter_device=cpu",
        f"--num_intra_threads={threads}",
        "--num_inter_threads=1",
        f"--weight_decay={WEIGHT_DECAY}",
    ]
    if DATA_DIR is not None:  # the same images as tf_cnn's ImageNet TFRecords; its default preprocessing
        cmd += [f"--data_dir={tf_records_of(DATA_DIR)}", "--data_name=imagenet", "--nodistortions"]
    tf_data_name = case.tf_data_name or case.dataset
    if tf_data_name != "imagenet":
        cmd.append(f"--data_name={tf_data_name}")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(cmd, cwd=script_dir, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"total images/sec:\s*([0-9.]+)", out.stdout)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"tf_cnn_benchmarks failed ({out.returncode}): {(out.stderr or out.stdout)[-2000:]}")
    return float(found.group(1))


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


CONFIGS = ("stoker", "plain", "stoker_c_malloc", "plain_kept")
REAL_TARGET_OVER_TF = 1.5  # issue 25: stoker bench --data_dir at >= 1.5x tf_cnn_benchmarks on the same images
REAL_CONFIGS = ("stoker_records",)  # --data_dir only: stoker on the TFRecords tensorflow reads
COMPILE_CONFIGS = {"stoker_compile_module": "module", "stoker_compile_step": "step"}
OTHER_CONFIGS = ("tensorflow",)
# Images/sec that issue 4's targets ask for, over plain PyTorch on the reference machine (docs/results/reference.md).
TARGET_SPEEDUP = {"resnet50": 11.5 / 7.6, "resnet20": 710 / 640}
# Issue 26's targets: stoker's images/sec over TensorFlow's, side by side on one machine.
TARGET_OVER_TF = {"trivial": 1.2, "resnet20": 1.5, "resnet50": 1.15, "inception3": 1.1, "vgg16": 1.1}


def measure(config: str, case: Case) -> float:
    """One configuration of one model, in this process (called by ``--one`` in a child)."""
    if config == "plain_kept":
        keep_freed_host_memory()
    if config.startswith("plain"):
        return plain_images_per_sec(case) if DATA_DIR is None else plain_real_images_per_sec(case, DATA_DIR)
    if DATA_DIR is not None:
        data = str(tf_records_of(DATA_DIR)) if config == "stoker_records" else DATA_DIR
        return stoker_images_per_sec(case, keep_host_memory=config != "stoker_c_malloc", data_dir=data)
    if config in COMPILE_CONFIGS:
        return stoker_images_per_sec(case, compile=COMPILE_CONFIGS[config])
    return stoker_images_per_sec(case, keep_host_memory=config == "stoker")


def measure_in_child(config: str, case: Case, threads: int, num_batches: int | None = None) -> float:
    if config == "tensorflow":
        if num_batches:
            case = case.with_batches(num_batches)
        return tensorflow_images_per_sec(case, threads)
    extra = ["--num_batches", str(num_batches)] if num_batches else []
    if DATA_DIR is not None:
        extra += ["--data_dir", DATA_DIR]
    out = subprocess.run(
        [sys.executable, __file__, "--one", config, case.model, "--threads", str(threads), *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["images_per_sec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        choices=sorted(CASES),
        default=[m for m in CASES if m not in ("inception3", "vgg16")],  # those two take minutes a step: named only
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the median is reported")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: the idle cores, as stoker bench)")
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=CONFIGS + tuple(COMPILE_CONFIGS) + OTHER_CONFIGS + REAL_CONFIGS,
        default=list(CONFIGS),
        help="which configurations to run (default: the four without compilation)",
    )
    parser.add_argument("--num_batches", type=int, help="timed steps per model (default: each model's own)")
    parser.add_argument("--data_dir", help="real images: a JPEG folder DIR/<class>/<image>.jpg (see the docstring)")
    parser.add_argument("--generate", type=int, help="with --data_dir: first fill it with N ImageNet-shaped JPEGs")
    parser.add_argument(
        "--one", nargs=2, metavar=("CONFIG", "MODEL"), help=argparse.SUPPRESS
    )  # a child's one measurement
    args = parser.parse_args()
    if args.threads is None:
        busy = busy_cores()
        args.threads = max(1, min(torch.get_num_threads(), round(torch.get_num_threads() - (busy or 0.0))))
    torch.set_num_threads(args.threads)
    global DATA_DIR
    DATA_DIR = args.data_dir
    if args.data_dir and args.generate and not args.one:
        sys.path.insert(0, str(Path(__file__).parent))
        from input_pipeline import make_imagenet_like  # noqa: PLC0415  (a sibling script)

        make_imagenet_like(Path(args.data_dir), args.generate)
    if args.data_dir and not args.one and {"tensorflow", "stoker_records"} & set(args.configs):
        print(f"TFRecords: {tf_records_of(args.data_dir)}")
    if args.one:
        config, model = args.one
        case = CASES[model]
        if args.num_batches:
            case = case.with_batches(args.num_batches)
        print(json.dumps({"images_per_sec": measure(config, case)}))
        return

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{args.threads} threads, {time.strftime('%Y-%m-%d')}"
    )
    print(f"before: {uptime()}")
    rows = []
    # stoker / tensorflow: the median of the per-round ratios, where there are several rounds.
    paired_median: dict[str, float] = {}
    for name in args.models:
        case = CASES[name]
        configs = tuple(args.configs)
        runs: dict[str, list[float]] = {c: [] for c in configs}
        for r in range(args.rounds):
            # Rotate which goes first, so a drift in machine load favours none.
            for config in configs[r % len(configs) :] + configs[: r % len(configs)]:
                runs[config].append(measure_in_child(config, case, args.threads, args.num_batches))
        med = {c: statistics.median(v) for c, v in runs.items()}
        rows.append((case, med))
        print(f"  {name}: " + ", ".join(f"{c} {[round(x, 1) for x in v]}" for c, v in runs.items()), flush=True)
        if "stoker" in runs and "tensorflow" in runs and args.rounds > 1:
            # Each round's pair ran a minute apart: on a noisy host the per-round ratios and their
            # median say more than the ratio of the two medians below.
            paired = [a / b for a, b in zip(runs["stoker"], runs["tensorflow"], strict=True)]
            paired_median[case.model] = statistics.median(paired)
            print(
                f"  {name}: stoker / tensorflow per round {' '.join(f'{x:.2f}' for x in paired)}, "
                f"median {paired_median[case.model]:.2f}x",
                flush=True,
            )
    print(f"after:  {uptime()}")
    print()
    if args.data_dir:
        print(f"real data: {args.data_dir} (JPEG folder; TFRecords for tensorflow/stoker_records), --nodistortions")
    if set(args.configs) != set(CONFIGS):  # a comparison with eager stoker: images/sec and ratios to it
        # TensorFlow is the baseline stoker is measured against (stoker / tensorflow); the
        # compiled variants are measured against eager stoker (variant / stoker).
        pairs = [
            ("stoker", c) if c in OTHER_CONFIGS or c == "plain" else (c, "stoker")
            for c in args.configs
            if c != "stoker"
        ]
        with_target = "stoker" in args.configs and "tensorflow" in args.configs
        print(
            "| model (data set) | "
            + " | ".join(args.configs)
            + " | "
            + " | ".join(f"{a} / {b}" for a, b in pairs)
            + (f" | target ({'issue 25, real images' if DATA_DIR else 'issue 26'}) |" if with_target else " |")
        )
        columns = 2 * len(args.configs) - ("stoker" in args.configs) + with_target
        print("|---|" + "---|" * columns)
        for case, m in rows:
            ratios = [f"{m[a] / m[b]:.2f}x" for a, b in pairs] if "stoker" in m else []
            if with_target:
                # real images: issue 25's 1.5x TensorFlow (and 2x plain, in the stoker / plain column)
                target = REAL_TARGET_OVER_TF if DATA_DIR else TARGET_OVER_TF.get(case.model)
                # The verdict reads the per-round ratios' median where there is one (see above).
                ratio = paired_median.get(case.model, m["stoker"] / m["tensorflow"])
                basis = f", per-round median {ratio:.2f}x" if case.model in paired_median else ""
                met = ratio >= target if target else None
                ratios.append("-" if target is None else f">= {target:.2f}x: {'met' if met else 'NOT met'}{basis}")
            print(
                f"| {case.model} ({case.dataset}) | "
                + " | ".join(f"{m[c]:.1f}" for c in args.configs)
                + " | "
                + " | ".join(ratios)
                + " |"
            )
        return
    print(
        "| model (data set) | plain loop | stoker bench | stoker / plain | target's speed-up | stoker, C malloc | "
        "plain, kept memory "
        "| overhead (same malloc) | tf_cnn_benchmarks (reference machine) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for case, m in rows:
        target = TARGET_SPEEDUP.get(case.model)
        overhead = f"{m['stoker_c_malloc'] / m['plain']:.2f}x / {m['stoker'] / m['plain_kept']:.2f}x"
        print(
            f"| {case.model} ({case.dataset}) | {m['plain']:.1f} | {m['stoker']:.1f} | "
            f"{m['stoker'] / m['plain']:.2f}x | "
            f"{f'{target:.2f}x' if target else '-'} | {m['stoker_c_malloc']:.1f} | {m['plain_kept']:.1f} | "
            f"{overhead} | "
            f"{case.tf_images_per_sec:g} |"
        )


if __name__ == "__main__":
    main()
