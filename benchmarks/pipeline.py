"""Pipeline step time and bubble: 2 and 4 stages against one process on the same work.

The work is a stack of identical blocks (``Linear(H, H) + GELU``), so stages split evenly and
the bubble is the schedule's, not an imbalance. Every run trains the same global batch through
``stoker.Estimator``; a pipelined run is started with torchrun (``S`` processes, one per stage).

Measured bubble of a stage: ``1 - busy / step``, where ``step`` is the pipelined step time and
``busy`` the time the same stage needs for its ``M`` micro-batches' forward and backward alone
(timed in the same process right after the run). Reported next to the schedule's theoretical
bubble ``(S - 1) / (M + S - 1)`` (GPipe and 1F1B alike; 1F1B only holds fewer activations).

Runs return dicts; printing is separate. ``python benchmarks/pipeline.py --help``. Timings on a
shared CPU are only meaningful as ratios against the one-process baseline of the same run; the
load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def make_model(params: dict[str, Any]) -> nn.Module:
    h = params["hidden"]
    return nn.Sequential(*(nn.Sequential(nn.Linear(h, h), nn.GELU()) for _ in range(params["blocks"])))


def model_fn(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, mode: Any, params: dict[str, Any]) -> Any:
    import stoker

    out = model(features)
    return stoker.EstimatorSpec(loss=(out - labels).pow(2).mean(), predictions={"out": out})


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One process of one run: train, time the loops, then time this process's stage alone."""
    import stoker
    from stoker.hooks import Hook

    torch.set_num_threads(1)
    params = {"hidden": args.hidden, "blocks": args.blocks}
    g = torch.Generator().manual_seed(0)
    n = args.batch * 4
    x, y = torch.randn(n, args.hidden, generator=g), torch.randn(n, args.hidden, generator=g)
    stages = args.stages
    split = (
        tuple(str(i) for i in range(args.blocks // stages, args.blocks, args.blocks // stages)) if stages > 1 else None
    )

    class Times(Hook):
        def __init__(self) -> None:
            self.loops: list[tuple[int, float]] = []

        def after_loop(self, run: Any, result: Any) -> None:
            self.loops.append((result.steps, result.seconds))

    times = Times()
    est = stoker.Estimator(
        model=make_model,
        model_fn=model_fn,
        params=params,
        train_batch_size=args.batch,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=1e-3),
        config=stoker.RunConfig(
            iterations_per_loop=args.steps,
            log_every_n_steps=None,
            progress_bar=False,
            pipeline=stoker.PipelineConfig(split=split, microbatches=args.microbatches, schedule=args.schedule)
            if split
            else None,
        ),
    )
    data = lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(p))  # noqa: E731
    est.train(data, max_steps=args.steps * (1 + args.loops), hooks=[times])
    timed = times.loops[1:]  # the first loop warms up (and infers the pipeline's shapes)
    step = sum(s for _, s in timed) / sum(n for n, _ in timed)
    result: dict[str, Any] = {"step_seconds": step, "rank": est.strategy.rank}
    runtime = getattr(est.strategy, "runtime", None)
    if runtime is not None:
        micro = args.batch // args.microbatches
        busy = 0.0
        for module in runtime.stages:
            inp = torch.randn(micro, args.hidden, requires_grad=True)
            for i in range(args.microbatches * (args.loops + 1)):
                if i == args.microbatches:
                    start = time.perf_counter()
                module(inp).sum().backward()
            busy += (time.perf_counter() - start) / args.loops
        result["busy_seconds"] = busy
    everyone = est.strategy.all_gather_object(result)
    est.strategy.teardown()
    return {
        "step_seconds": max(r["step_seconds"] for r in everyone),
        "busy_seconds": [r.get("busy_seconds") for r in everyone],
    }


def run_one(stages: int, schedule: str, microbatches: int, common: list[str]) -> dict[str, Any]:
    """Start one run (``stages`` processes under torchrun, or one plain process) and read its result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        flags = [
            *common,
            "--worker",
            "--stages",
            str(stages),
            "--schedule",
            schedule,
            "--microbatches",
            str(microbatches),
            "--out",
            str(out),
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
        if stages == 1:
            cmd = [sys.executable, __file__, *flags]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={stages}",
                __file__,
                *flags,
            ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """The baseline and every (stages, schedule) run, as one dict."""
    common = [
        "--hidden",
        str(args.hidden),
        "--blocks",
        str(args.blocks),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--loops",
        str(args.loops),
    ]
    base = run_one(1, "1f1b", 1, common)
    rows = []
    for stages in args.stage_counts:
        for schedule in args.schedules:
            r = run_one(stages, schedule, args.microbatches, common)
            busy = [b for b in r["busy_seconds"] if b is not None]
            rows.append(
                {
                    "stages": stages,
                    "schedule": schedule,
                    "microbatches": args.microbatches,
                    "step_seconds": r["step_seconds"],
                    "vs_one_process": r["step_seconds"] / base["step_seconds"],
                    "bubble_measured": 1 - sum(busy) / len(busy) / r["step_seconds"],
                    "bubble_theory": (stages - 1) / (args.microbatches + stages - 1),
                }
            )
    return {
        "one_process_step_seconds": base["step_seconds"],
        "runs": rows,
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "config": vars(args),
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"one process: {result['one_process_step_seconds'] * 1e3:.1f} ms/step; load average "
        f"{', '.join(f'{v:.1f}' for v in result['load'])} on {result['cpus']} CPUs",
        "stages  schedule  M   ms/step  vs 1 proc  bubble measured  bubble (S-1)/(M+S-1)",
    ]
    for r in result["runs"]:
        lines.append(
            f"{r['stages']:>6}  {r['schedule']:<8} {r['microbatches']:>2}  {r['step_seconds'] * 1e3:>8.1f}  "
            f"{r['vs_one_process']:>8.2f}x  {r['bubble_measured']:>15.2f}  {r['bubble_theory']:>20.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--blocks", type=int, default=8, help="Linear+GELU blocks (divisible by every stage count)")
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="steps per timed loop")
    p.add_argument("--loops", type=int, default=3, help="timed loops (after one warm-up loop)")
    p.add_argument("--stage_counts", type=int, nargs="+", default=[2, 4])
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"], choices=["gpipe", "1f1b"])
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stages", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--schedule", default="1f1b", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        result = worker(args)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(args.out).write_text(json.dumps(result))
        return
    bad = [s for s in args.stage_counts if s < 2 or args.blocks % s]
    if bad:
        p.error(f"--stage_counts {bad}: each must be >= 2 and divide --blocks {args.blocks}")
    if (args.batch % args.microbatches) or args.batch < args.microbatches:
        p.error(f"--microbatches {args.microbatches} must divide --batch {args.batch}")
    result = benchmark(args)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
