"""Data-parallel scaling on one machine: 1 process x 2 threads vs 2 replicas x 1 thread.

Trains resnet20 (cifar10 shapes, synthetic data, the same global batch) for ``--steps``
timed steps after ``--warmup`` untimed ones, two ways, in one run:

- ``1x2``: one process with 2 intra-op threads;
- ``2x1``: two processes (``replicated``: DDP over gloo), 1 thread each, the batch split.

Prints images/sec of each, the ratio, and the time of one all-reduce of resnet20's
gradients (what DDP adds per step) measured separately in the 2-process run.
On a GPU machine run the 1-process part with ``--device cuda`` for a 1-GPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import stoker
from stoker.hooks import Hook
from stoker.models import count_parameters, create_model


class Timer(Hook):
    """Wall time of the loops after the warm-up ones."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.seconds = 0.0
        self.steps = 0

    def after_loop(self, run, result):  # noqa: ANN001
        if result.first_step >= self.warmup:
            self.seconds += result.seconds
            self.steps += result.steps


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    return stoker.EstimatorSpec(loss=F.cross_entropy(model(features), labels))


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    est = stoker.Estimator(
        model=lambda p: create_model("resnet20", dataset="cifar10").to(memory_format=torch.channels_last),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
        config=stoker.RunConfig(
            iterations_per_loop=args.loop, progress_bar=False, log_every_n_steps=10**9, device=args.device
        ),
        train_batch_size=args.batch,
    )
    per_replica = args.batch // est.strategy.world_size
    g = torch.Generator().manual_seed(est.strategy.rank)
    images = torch.randn(per_replica, 3, 32, 32, generator=g).to(est.strategy.device, memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (per_replica,), generator=g).to(est.strategy.device)

    class Synthetic:  # the same on-device batch every step: no input cost
        prefers_inline_fetch = True

        def __iter__(self):  # noqa: ANN204
            while True:
                yield images, labels

    timer = Timer(args.warmup)
    est.train(lambda p: Synthetic(), max_steps=args.warmup + args.steps, hooks=[timer])
    result = {"images_per_sec": timer.steps * args.batch / timer.seconds, "world_size": est.strategy.world_size}
    if est.strategy.world_size > 1:
        import torch.distributed as dist

        grads = torch.zeros(count_parameters(est.model))
        for _ in range(5):
            dist.all_reduce(grads)
        start = time.perf_counter()
        for _ in range(50):
            dist.all_reduce(grads)
        result["allreduce_ms"] = (time.perf_counter() - start) / 50 * 1000
    if est.strategy.is_chief:
        Path(args.out).write_text(json.dumps(result))
    est.strategy.teardown()


def launch(nproc: int, threads: int, args: argparse.Namespace, out: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if nproc > 1:
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--threads",
            str(threads),
            "--out",
            str(out),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
            "--loop",
            str(args.loop),
            "--device",
            args.device,
        ]
        procs.append(subprocess.Popen(cmd, env=env))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"worker failed with exit code {p.returncode}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--loop", type=int, default=5, help="iterations_per_loop")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        one, two = [], []
        for r in range(args.rounds):  # interleaved, so machine noise hits both alike
            one.append(launch(1, 2, args, Path(tmp) / f"one{r}.json"))
            two.append(launch(2, 1, args, Path(tmp) / f"two{r}.json"))
    best1 = max(x["images_per_sec"] for x in one)
    best2 = max(x["images_per_sec"] for x in two)
    allreduce = min(x["allreduce_ms"] for x in two)
    print(f"resnet20 (cifar10), global batch {args.batch}, synthetic, channels_last, best of {args.rounds}")
    print(f"{'layout':<28}{'images/sec':>12}{'ratio':>8}")
    print(f"{'1 process x 2 threads':<28}{best1:>12.1f}{1.0:>7.2f}x")
    print(f"{'2 replicas x 1 thread (DDP)':<28}{best2:>12.1f}{best2 / best1:>7.2f}x")
    print(
        f"all-reduce of resnet20's {count_parameters(create_model('resnet20', dataset='cifar10')):,} gradients: "
        f"{allreduce:.2f} ms"
    )


if __name__ == "__main__":
    main()
