"""Eager against ``compile="module"`` and ``compile="step"`` on the MLP of ``benchmarks/overhead.py``.

The MLP (32 -> 64 -> 10, batch 64, SGD with momentum, in-memory data) is host-bound: a step is
a few dozen tiny kernels, so what compilation removes (Python and dispatch per op, one update
kernel per parameter) is most of the step. Each variant trains ``--steps`` steps after a
warm-up ``train`` call of 20 steps that compiles (timed apart and reported), each run in a
fresh process (dynamo's caches are per process: a second compiled Estimator in one process
recompiles against the first one's guards), interleaved round by round; prints the median
steps/sec and the ratio to eager.

    python benchmarks/compiled_step.py --steps 500 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import stoker

BATCH = 64
MODES = ("none", "module", "step")


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(64 * 200, 32, generator=g), torch.randint(0, 10, (64 * 200,), generator=g)


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    return stoker.EstimatorSpec(loss=F.cross_entropy(model(features), labels))


def run(mode: str, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int = 20) -> tuple[float, float]:
    """(compile seconds: the warm-up train call, steps/sec after it)."""
    est = stoker.Estimator(
        model=lambda p: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        config=stoker.RunConfig(iterations_per_loop=100, progress_bar=False, log_every_n_steps=10**9, compile=mode),
        train_batch_size=BATCH,
    )
    input_fn = lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(p))  # noqa: E731
    start = time.perf_counter()
    est.train(input_fn, max_steps=warmup)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    est.train(input_fn, max_steps=warmup + steps)
    return compile_s, steps / (time.perf_counter() - start)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child's one measurement
    args = parser.parse_args()
    logging.getLogger("stoker").setLevel(logging.WARNING)
    x, y = make_data()
    if args.one:
        print(json.dumps(run(args.one, x, y, args.steps)))
        return
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}"
    )
    print(f"before: {uptime()}")
    speed: dict[str, list[float]] = {m: [] for m in MODES}
    first: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 3 :] + MODES[: r % 3]:
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            c, s = json.loads(out.strip().splitlines()[-1])
            first[mode].append(c)
            speed[mode].append(s)
    print(f"after:  {uptime()}")
    eager = statistics.median(speed["none"])
    print("\n| MLP (overhead.py) | steps/sec (median) | / eager | first 20 steps incl. compile (s) |")
    print("|---|---|---|---|")
    for mode in MODES:
        med = statistics.median(speed[mode])
        print(f"| compile={mode} | {med:.0f} | {med / eager:.2f}x | {statistics.median(first[mode]):.1f} |")


if __name__ == "__main__":
    main()
