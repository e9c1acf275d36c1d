"""``stoker bench`` against tf_cnn_benchmarks' figures, and against a hand-written loop.

Runs the harness in-process (``stoker.bench.run_benchmark``, the function behind ``stoker
bench``) for trivial (ImageNet), resnet20 (CIFAR-10) and resnet50 (ImageNet) with batch 32,
NHWC (channels_last), synthetic data, fp32, SGD, as REFERENCE_NUMBERS.md's TensorFlow runs.
Next to each, a plain PyTorch loop (same model, optimizer, data and weight decay, no
framework) is timed in the same process, interleaved round by round, so machine noise hits
both alike: ``stoker / plain`` is the harness's overhead (target: 1.00x).

Prints a markdown table (model, stoker images/sec, plain loop images/sec, stoker / plain,
tf_cnn_benchmarks' figure on the reference machine, stoker / TF) and the load before and
after (``os.getloadavg``; absolute figures are only comparable on a quiet machine).

    python benchmarks/cnn.py                      # all three models, 2 rounds
    python benchmarks/cnn.py --models resnet20 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stoker.bench import BenchConfig, run_benchmark
from stoker.bench.cli import busy_cores
from stoker.bench.train import l2_loss
from stoker.data import synthetic_images
from stoker.models import create_model, get_model_info


@dataclass(frozen=True)
class Case:
    """One row: a model, its data set, how many steps, and tf_cnn_benchmarks' figure."""

    model: str
    dataset: str
    num_batches: int
    num_warmup_batches: int
    tf_images_per_sec: float


CASES = {
    "trivial": Case("trivial", "imagenet", 100, 10, 3614.0),
    "resnet20": Case("resnet20", "cifar10", 30, 5, 647.0),
    "resnet50": Case("resnet50", "imagenet", 5, 2, 10.4),
}
BATCH = 32
WEIGHT_DECAY = 4e-5  # tf_cnn_benchmarks' default, also in the plain loop


def stoker_images_per_sec(case: Case) -> float:
    cfg = BenchConfig(model=case.model, data_name=case.dataset, batch_size=BATCH, data_format="NHWC",
                      num_batches=case.num_batches, num_warmup_batches=case.num_warmup_batches,
                      device="cpu", display_every=10**6, weight_decay=WEIGHT_DECAY)
    return run_benchmark(cfg, log=lambda line: None)["images_per_sec"]


def plain_images_per_sec(case: Case) -> float:
    """The same training step written by hand: no Estimator, no hooks, no device loop."""
    info = get_model_info(case.model, case.dataset)
    torch.manual_seed(1234)
    model = create_model(case.model, dataset=case.dataset).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, weight_decay=WEIGHT_DECAY)
    images, labels = next(iter(synthetic_images((3, info.image_size, info.image_size), info.num_classes,
                                                batch_size=BATCH, seed=1234, channels_last=True)))

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


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the median is reported")
    parser.add_argument("--no_plain", action="store_true", help="skip the hand-written loop")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: the idle cores, as stoker bench)")
    args = parser.parse_args()
    if args.threads is None:
        busy = busy_cores()
        args.threads = max(1, min(torch.get_num_threads(), round(torch.get_num_threads() - (busy or 0.0))))
    torch.set_num_threads(args.threads)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"before: {uptime()}")
    rows = []
    for name in args.models:
        case = CASES[name]
        ours: list[float] = []
        plain: list[float] = []
        for r in range(args.rounds):
            # Alternate which goes first, so a drift in machine load favours neither.
            if r % 2 and not args.no_plain:
                plain.append(plain_images_per_sec(case))
            ours.append(stoker_images_per_sec(case))
            if not r % 2 and not args.no_plain:
                plain.append(plain_images_per_sec(case))
        rows.append((case, statistics.median(ours), statistics.median(plain) if plain else None, ours, plain))
        print(f"  {name}: stoker {[round(x, 1) for x in ours]}, plain {[round(x, 1) for x in plain]}", flush=True)
    print(f"after:  {uptime()}")
    print()
    print("| model (data set) | stoker bench images/sec | plain loop images/sec | stoker / plain | tf_cnn_benchmarks (reference) | stoker / TF |")
    print("|---|---|---|---|---|---|")
    for case, ours_med, plain_med, _, _ in rows:
        vs_plain = f"{ours_med / plain_med:.2f}x" if plain_med else "-"
        plain_txt = f"{plain_med:.1f}" if plain_med else "-"
        print(f"| {case.model} ({case.dataset}) | {ours_med:.1f} | {plain_txt} | {vs_plain} | "
              f"{case.tf_images_per_sec:g} | {ours_med / case.tf_images_per_sec:.2f}x |")


if __name__ == "__main__":
    main()
