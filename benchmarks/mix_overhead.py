"""What ``stoker.data.mix`` costs: a mixture against a single source, in the same run.

Variants, interleaved round by round (the order rotating) so that machine noise hits them alike:

- ``single``: one ``stoker.data.arrays`` source (in-memory, batch 64 of 32 floats: a batch is a
  slice, microseconds, so any per-batch cost of the mixture shows at its largest);
- ``mix2``: ``mix`` of two such sources, weights 0.7 / 0.3;
- ``mix8``: ``mix`` of eight, equal weights;
- ``mix2e``: ``mix(..., per="example")`` of the two: every batch a blend, built from the
  sources' examples (a gather per source, a concatenation and a reordering of the rows).

Each is iterated for ``--batches`` batches after one warm-up batch (the loader alone, no
model): microseconds per batch, and the ratio of batches/sec to ``single``. With ``--train``
the same inputs also train the overhead benchmark's MLP (32 -> 64 -> 10, SGD) with
``Estimator.train`` (no model_dir, ``iterations_per_loop=100``) for ``--steps`` steps: steps/sec
and the ratio to ``single``. Then the mixture's own cost per batch (over two sources that
return one constant batch, less the same loop over one such source), and the cost of
checkpointing the mixture's position: ``state_dict()`` + ``json.dumps`` per call (median over
1000) and its size. The machine load
(``os.getloadavg()``) is printed at the start. Figures: docs/results/input_pipeline.md#mixtures.

    python benchmarks/mix_overhead.py --rounds 5 --train
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import stoker
from stoker.data import ReadOptions, arrays, mix

BATCH = 64
EXAMPLES = 4096


def make_input(variant: str, seed: int = 0) -> Callable[[dict[str, Any]], Any]:
    """An ``input_fn`` for ``variant``: ``single``, ``mix2``, ``mix8`` or ``mix2e``."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(EXAMPLES, 32, generator=g), torch.randint(0, 10, (EXAMPLES,), generator=g)
    count = {"single": 1, "mix2": 2, "mix8": 8, "mix2e": 2}[variant]
    weights = [0.7, 0.3] if count == 2 else [1.0] * count

    def input_fn(params: dict[str, Any]) -> Any:
        read = ReadOptions(seed=1).for_replica(params)
        parts = [arrays(x, y, read=read) for _ in range(count)]
        if variant == "single":
            return parts[0]
        per = "example" if variant.endswith("e") else "batch"
        return mix({f"s{i}": (p, w) for i, (p, w) in enumerate(zip(parts, weights, strict=True))}, seed=1, per=per)

    return input_fn


def time_loader(variant: str, batches: int) -> float:
    """Microseconds per batch of ``variant``'s input iterated alone."""
    it = iter(make_input(variant)({"batch_size": BATCH}))
    next(it)  # warm-up: the first gather, the first block of draws
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return 1e6 * (time.perf_counter() - start) / batches


def model_fn(model: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor, mode: Any, params: Any) -> Any:
    return stoker.EstimatorSpec(loss=torch.nn.functional.cross_entropy(model(features), labels))


def time_training(variant: str, steps: int) -> float:
    """Steps/sec of ``Estimator.train`` on ``variant``'s input (no model_dir)."""
    est = stoker.Estimator(
        model=lambda p: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.05),
        config=stoker.RunConfig(model_dir=None, iterations_per_loop=100, progress_bar=False, log_every_n_steps=None),
        train_batch_size=BATCH,
    )
    start = time.perf_counter()
    est.train(make_input(variant), max_steps=steps)
    return steps / (time.perf_counter() - start)


class _Constant:
    """A source that returns one batch, with state: the mixture's own cost shows alone."""

    def __init__(self) -> None:
        self.batch = (torch.zeros(BATCH, 32), torch.zeros(BATCH, dtype=torch.long))

    def __iter__(self) -> _Constant:
        return self

    def __next__(self) -> Any:
        return self.batch

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def own_cost(batches: int) -> float:
    """Microseconds per batch the mixture adds to sources that cost nothing (two constant ones)."""
    plain = _Constant()
    start = time.perf_counter()
    for _ in range(batches):
        next(plain)
    alone = time.perf_counter() - start
    m = iter(mix({"a": (_Constant(), 0.7), "b": (_Constant(), 0.3)}, seed=1))
    next(m)
    start = time.perf_counter()
    for _ in range(batches):
        next(m)
    return 1e6 * (time.perf_counter() - start - alone) / batches


def checkpoint_cost() -> dict[str, float]:
    """``state_dict()`` + ``json.dumps`` of a two-source mixture: median microseconds and bytes."""
    m = iter(make_input("mix2")({"batch_size": BATCH}))
    for _ in range(100):
        next(m)
    times = []
    for _ in range(1000):
        start = time.perf_counter()
        text = json.dumps(m.state_dict())
        times.append(time.perf_counter() - start)
    return {"state_us": 1e6 * statistics.median(times), "state_bytes": float(len(text))}


def run(rounds: int, batches: int, train: bool, steps: int) -> dict[str, Any]:
    variants = ["single", "mix2", "mix8", "mix2e"]
    loader: dict[str, list[float]] = {v: [] for v in variants}
    training: dict[str, list[float]] = {v: [] for v in variants}
    if train:
        time_training("single", 100)  # warm-up: the first Estimator of a process builds more
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            loader[v].append(time_loader(v, batches))
        for v in order if train else ():
            training[v].append(time_training(v, steps))
    out: dict[str, Any] = {"loader_us": {v: statistics.median(t) for v, t in loader.items()}}
    out["loader_ratio"] = {v: out["loader_us"]["single"] / out["loader_us"][v] for v in variants}
    if train:
        out["train_steps_per_sec"] = {v: statistics.median(t) for v, t in training.items()}
        base = out["train_steps_per_sec"]["single"]
        out["train_ratio"] = {v: out["train_steps_per_sec"][v] / base for v in variants}
    out["own_us"] = statistics.median(own_cost(batches) for _ in range(rounds))
    out.update(checkpoint_cost())
    return out


def report(out: dict[str, Any]) -> None:
    print("loader alone (batch 64 of 32 floats from memory):")
    for v, us in out["loader_us"].items():
        print(f"  {v:7s} {us:8.2f} us/batch  {out['loader_ratio'][v]:.3f}x single's batches/sec")
    if "train_ratio" in out:
        print("Estimator.train, MLP 32-64-10, no model_dir, iterations_per_loop=100:")
        for v, rate in out["train_steps_per_sec"].items():
            print(f"  {v:7s} {rate:8.1f} steps/sec  {out['train_ratio'][v]:.3f}x single")
    print(f"the mixture's own cost per batch (two sources that cost nothing): {out['own_us']:.2f} us")
    print(f"mix2 state_dict + json.dumps: {out['state_us']:.1f} us, {out['state_bytes']:.0f} bytes")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=20000)
    p.add_argument("--train", action="store_true", help="also time Estimator.train on each input")
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("stoker").setLevel(logging.WARNING)  # each train() call's lines are not the figures
    print(f"load {os.getloadavg()}, torch {torch.__version__}, {os.cpu_count()} cores")
    report(run(args.rounds, args.batches, args.train, args.steps))


if __name__ == "__main__":
    main()
