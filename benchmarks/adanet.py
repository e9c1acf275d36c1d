"""AdaNet iteration vs training its subnetworks one after another with the plain Estimator.

One AdaNet iteration trains K candidate subnetworks (MLPs of depth 1..K, each with its own
Adam) *and* evaluates their K candidate ensembles (GrowStrategy, SCALAR mixture weights:
``--ensembler`` fixed at 1/N, learned with SGD or with Adam) in the same steps. The baseline
trains the same K subnetworks one after another, each with a plain ``stoker.Estimator``,
for the same number of steps on the same batches. Both write
checkpoints to a temporary model_dir (one at the end) and use the same RunConfig. The
ratio ``adanet / sequential`` is the cost of the search relative to training the
candidates alone; below 1.0 the shared step (one batch fetch, one loop, one backward call)
pays for the ensembles.

    python benchmarks/adanet.py [--candidates 3] [--steps 600] [--batch 64] [--width 128]
                                [--ensembler fixed|sgd|adam] [--rounds 3] [--json]

Rounds are interleaved (adanet, sequential, adanet, ...) so drifting machine load hits both.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import stoker
from stoker import adanet

IN_FEATURES, CLASSES, EXAMPLES = 64, 10, 2048


def make_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(EXAMPLES, IN_FEATURES, generator=g)
    w = torch.randn(IN_FEATURES, CLASSES, generator=g)
    return x, (x @ w).argmax(-1)


class MLP(nn.Module):
    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = IN_FEATURES
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU()]
            d = width
        self.body = nn.Sequential(*layers)
        self.logits = nn.Linear(d, CLASSES)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> adanet.Subnetwork:
        h = self.body(x)
        return adanet.Subnetwork(last_layer=h, logits=self.logits(h), complexity=float(self.depth) ** 0.5)


def adam(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=1e-3)


ENSEMBLERS = {
    # the original's default: mixture weights fixed at 1/N (only selection sees lambda)
    "fixed": lambda: adanet.ComplexityRegularizedEnsembler(adanet_lambda=1e-3),
    "sgd": lambda: adanet.ComplexityRegularizedEnsembler(lambda ps: torch.optim.SGD(ps, lr=0.01), adanet_lambda=1e-3),
    "adam": lambda: adanet.ComplexityRegularizedEnsembler(adam, adanet_lambda=1e-3),
}


class MLPBuilder(adanet.Builder):
    def __init__(self, depth: int, width: int) -> None:
        self.depth, self.width = depth, width

    @property
    def name(self) -> str:
        return f"mlp{self.depth}"

    def build_subnetwork(
        self, features: Any, logits_dimension: int, training: bool, iteration_step: torch.Tensor, previous_ensemble: Any
    ) -> nn.Module:
        return MLP(self.depth, self.width)

    def build_subnetwork_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return adam(parameters)


def run_config(model_dir: str, steps: int, loop: int) -> stoker.RunConfig:
    return stoker.RunConfig(
        model_dir=model_dir,
        iterations_per_loop=loop,
        save_checkpoints_steps=steps,
        log_every_n_steps=10**6,
        progress_bar=False,
        summaries=False,
        device="cpu",
    )


def time_adanet(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    x, y = data
    builders = [MLPBuilder(d, args.width) for d in range(1, args.candidates + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        est = adanet.Estimator(
            adanet.MultiClassHead(CLASSES),
            adanet.SimpleGenerator(builders),
            args.steps,
            max_iterations=1,
            ensemblers=[ENSEMBLERS[args.ensembler]()],
            config=run_config(tmp, args.steps, args.loop),
            train_batch_size=args.batch,
        )
        start, cpu = time.perf_counter(), time.process_time()
        est.train(lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=1).for_replica(p)))
        return time.perf_counter() - start, time.process_time() - cpu


def time_sequential(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    x, y = data
    head = adanet.MultiClassHead(CLASSES)
    with tempfile.TemporaryDirectory() as tmp:
        start, cpu = time.perf_counter(), time.process_time()
        for depth in range(1, args.candidates + 1):
            est = stoker.Estimator(
                model=lambda p, d=depth: MLP(d, args.width),
                model_fn=head.model_fn,
                optimizer=lambda p, ps: adam(ps),
                config=run_config(str(Path(tmp) / f"mlp{depth}"), args.steps, args.loop),
                train_batch_size=args.batch,
            )
            est.train(
                lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=1).for_replica(p)),
                max_steps=args.steps,
            )
        return time.perf_counter() - start, time.process_time() - cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time both ways ``args.rounds`` times, interleaved; return the figures."""
    torch.set_num_threads(args.threads)
    logging.getLogger("stoker").setLevel(logging.WARNING)
    data = make_data()
    time_adanet(argparse.Namespace(**{**vars(args), "steps": 20}), data)  # warm-up: imports, allocator
    a, s, a_cpu, s_cpu = [], [], [], []
    for _ in range(args.rounds):
        wall, cpu = time_adanet(args, data)
        a.append(wall)
        a_cpu.append(cpu)
        wall, cpu = time_sequential(args, data)
        s.append(wall)
        s_cpu.append(cpu)
    ratios = [x / y for x, y in zip(a, s, strict=True)]
    cpu_ratios = [x / y for x, y in zip(a_cpu, s_cpu, strict=True)]
    return {
        "candidates": args.candidates,
        "ensembler": args.ensembler,
        "steps": args.steps,
        "batch": args.batch,
        "width": args.width,
        "threads": args.threads,
        "adanet_seconds": a,
        "sequential_seconds": s,
        "ratio_per_round": ratios,
        "ratio_median": statistics.median(ratios),
        "adanet_cpu_seconds": a_cpu,
        "sequential_cpu_seconds": s_cpu,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "load_average": os.getloadavg()[0],
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        f"AdaNet iteration with {r['candidates']} candidates vs {r['candidates']} plain Estimators one after another "
        f"({r['steps']} steps each, batch {r['batch']}, width {r['width']}, mixture weights {r['ensembler']}, "
        f"{r['threads']} thread(s))",
    ]
    for i, (a, s, q) in enumerate(zip(r["adanet_seconds"], r["sequential_seconds"], r["ratio_per_round"], strict=True)):
        lines.append(f"  round {i}: adanet {a:.2f} s, sequential {s:.2f} s, ratio {q:.3f}")
    lines.append(
        f"  median ratio adanet / sequential: wall {r['ratio_median']:.3f}, process CPU time "
        f"{r['cpu_ratio_median']:.3f}"
    )
    lines.append(
        f"  (1-minute load average at the end: {r['load_average']:.2f}; above the core count, compare CPU-time ratios)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", type=int, default=3)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--loop", type=int, default=50, help="iterations_per_loop")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--ensembler",
        choices=sorted(ENSEMBLERS),
        default="sgd",
        help=(
            "mixture weights: fixed at 1/N (the original's default), learned with SGD or with Adam; default %(default)s"
        ),
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    r = run(args)
    print(json.dumps(r, indent=1) if args.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
