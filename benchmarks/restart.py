"""Time to full speed after a restart: first start, restart on a fresh machine, warm restart (issue 49).

For each workload, side by side in one run, every run a fresh process:

1. **first start**: empty compiler caches, empty model_dir; training to step ``--steps``, it is
   preempted (SIGTERM: it checkpoints the step it is at and exits) once at full speed.
2. **restart, fresh machine, no artifacts** (the baseline: what a restart cost before compiled
   artifacts travelled with the checkpoint): a copy of the model_dir without ``compiled/``,
   new empty ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, ``XDG_CACHE_HOME`` and
   ``STOKER_CACHE_DIR``; trains on to ``--steps``.
3. **restart, fresh machine**: the same with the model_dir as the first start left it.
4. **warm restart**: the first start's compiler caches, a copy of its model_dir.
5. **uninterrupted**: empty caches, ``--steps`` in one run; its final weights must be bitwise
   those of (3) (the same command: the BERT recipe's learning-rate schedule depends on
   ``--max_steps``, so every run is given the same one).

What is compared is each run's *time to full speed*, the line every training run logs
(``stoker.engine.full_speed``): from the process's start to the end of the last step before its
first full-speed step (start-up and imports, checkpoint load, compiled artifacts, input
pipeline, compile, first steps). Ratios are to the first start; issue 49's target: a restart
on a fresh machine at most 0.4x.

Workloads: ``resnet20`` (CIFAR-10 shapes, batch 32, SGD with momentum, ``compile="step"``, an
Estimator in this script's ``child`` mode) and ``bert`` (``stoker train bert --compile step``,
the recipe's model with ``--bert_layers`` layers).

    PYTHONPATH=src python benchmarks/restart.py                      # both, CPU
    PYTHONPATH=src python benchmarks/restart.py --workloads resnet20 --steps 20
    PYTHONPATH=src python benchmarks/restart.py --device cuda --cuda_graph   # make gpu-check's row
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"time to full speed: ([\d.]+) s, at step (\d+) \((.*)\)")
SCENARIOS = ("first start", "fresh machine, no artifacts", "fresh machine", "warm restart")


def child(args: argparse.Namespace) -> None:
    """Train step-compiled resnet20 on synthetic CIFAR-10 batches in ``--model_dir`` to ``--to``."""
    import logging

    import torch
    import torch.nn.functional as F

    import stoker
    from stoker.models import create_model

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("stoker").setLevel(logging.INFO)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32 * 20, 3, 32, 32, generator=g), torch.randint(0, 10, (32 * 20,), generator=g)

    def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        return stoker.EstimatorSpec(loss=F.cross_entropy(model(features), labels))

    est = stoker.Estimator(
        model=lambda p: create_model("resnet20", dataset="cifar10"),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        config=stoker.RunConfig(
            model_dir=args.model_dir,
            device=args.device,
            compile="none" if args.cuda_graph else "step",
            cuda_graph=args.cuda_graph,
            precision="bf16" if args.device == "cuda" else "fp32",
            iterations_per_loop=1,
            progress_bar=False,
            log_every_n_steps=10**6,
            save_checkpoints_steps=10**6,
        ),
        train_batch_size=32,
    )
    read = stoker.data.ReadOptions(seed=0)
    est.train(lambda p: stoker.data.arrays(x, y, read=read.for_replica(p)), max_steps=args.to)


def command(workload: str, model_dir: Path, to: int, args: argparse.Namespace) -> list[str]:
    if workload == "resnet20":
        argv = [sys.executable, __file__, "child", "--model_dir", str(model_dir), "--to", str(to)]
        return argv + ["--device", args.device] + (["--cuda_graph"] if args.cuda_graph else [])
    argv = [sys.executable, "-m", "stoker", "train", "bert", "--model_dir", str(model_dir), "--max_steps", str(to)]
    argv += ["--compile", "step", "--num_layers", str(args.bert_layers), "--device", args.device]
    argv += ["--eval_every_n_steps", "0", "--save_checkpoints_steps", "1000000", "--iterations_per_loop", "1"]
    return argv + ["--corpus_bytes", str(2**20), "--log_every_n_steps", "1000000"]


def run(
    workload: str, model_dir: Path, to: int, caches: Path, args: argparse.Namespace, preempt: bool = False
) -> dict[str, Any]:
    """One training process to global step ``to`` with its compiler caches under ``caches``: its
    time to full speed (from the log line), its phases, its wall time. ``preempt``: send it SIGTERM
    as soon as it is at full speed (it checkpoints the step it is at and exits)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        env[var] = str(caches / sub)
    env["XDG_CACHE_HOME"], env["STOKER_CACHE_DIR"] = str(caches / "xdg"), str(caches / "stoker")
    start = time.perf_counter()
    proc = subprocess.Popen(
        command(workload, model_dir, to, args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if preempt and LINE.search(line):  # at full speed: preempted (SIGTERM: a checkpoint, then exit 143)
            proc.send_signal(signal.SIGTERM)
    returncode = proc.wait()
    wall = time.perf_counter() - start
    text = "".join(lines)
    if returncode != (128 + signal.SIGTERM if preempt else 0):
        raise SystemExit(f"{workload} to step {to} failed (exit {returncode}):\n{text[-4000:]}")
    m = LINE.search(text)
    if m is None:
        raise SystemExit(f"{workload}: no 'time to full speed' line in its log:\n{text[-4000:]}")
    phases = {k.strip(", "): float(v) for k, v in re.findall(r"(?:^|, )([a-z -]+?) ([\d.]+) s", m.group(3))}
    return {"to_full_speed_s": float(m.group(1)), "wall_s": round(wall, 1), "line": m.group(0), "phases": phases}


def final_weights(model_dir: Path) -> bytes:
    ckpts = sorted(model_dir.glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))
    return (ckpts[-1] / "model.safetensors").read_bytes()


def workload_rows(workload: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    n = args.steps
    first_dir = scratch / f"{workload}-first"
    warm_caches = scratch / f"{workload}-caches-first"
    rows = {"first start": run(workload, first_dir, n, warm_caches, args, preempt=True)}
    copies = {name: scratch / f"{workload}-{i}" for i, name in enumerate(SCENARIOS[1:])}
    for path in copies.values():
        shutil.copytree(first_dir, path)
    shutil.rmtree(copies["fresh machine, no artifacts"] / "compiled", ignore_errors=True)
    rows["fresh machine, no artifacts"] = run(
        workload, copies["fresh machine, no artifacts"], n, scratch / f"{workload}-caches-base", args
    )
    rows["fresh machine"] = run(workload, copies["fresh machine"], n, scratch / f"{workload}-caches-fresh", args)
    rows["warm restart"] = run(workload, copies["warm restart"], n, warm_caches, args)
    whole = scratch / f"{workload}-whole"
    bitwise = baseline_bitwise = None
    if not args.no_bitwise:
        run(workload, whole, n, scratch / f"{workload}-caches-whole", args)
        bitwise = final_weights(whole) == final_weights(copies["fresh machine"])
        baseline_bitwise = final_weights(whole) == final_weights(copies["fresh machine, no artifacts"])
    first = rows["first start"]["to_full_speed_s"]
    for row in rows.values():
        row["ratio"] = round(row["to_full_speed_s"] / first, 2)
    return {
        "rows": rows,
        "bitwise_equal_to_uninterrupted": bitwise,
        "without_artifacts_bitwise_equal_to_uninterrupted": baseline_bitwise,
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "| workload | run | time to full speed (s) | ratio to first start | phases (s) |",
        "|---|---|---:|---:|---|",
    ]
    for workload, res in results["workloads"].items():
        for name, row in res["rows"].items():
            phases = ", ".join(f"{k} {v}" for k, v in row["phases"].items())
            lines.append(f"| {workload} | {name} | {row['to_full_speed_s']:.1f} | {row['ratio']:.2f}x | {phases} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", default="bench", choices=("bench", "child"))
    p.add_argument("--workloads", nargs="+", default=["resnet20", "bert"], choices=("resnet20", "bert"))
    p.add_argument("--steps", type=int, default=40, help="every run trains to this step (the first start: preempted)")
    p.add_argument("--bert_layers", type=int, default=4, help="encoder layers of the BERT recipe's model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cuda_graph", action="store_true", help="resnet20 with RunConfig(cuda_graph=True), not compiled")
    p.add_argument("--no_bitwise", action="store_true", help="skip the uninterrupted run and the bitwise check")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--model_dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--to", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode == "child":
        child(args)
        return 0
    import torch

    results: dict[str, Any] = {
        "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "device": args.device,
        "steps": args.steps,
        "workloads": {},
    }
    with tempfile.TemporaryDirectory(prefix="stoker-restart-") as scratch:
        for workload in args.workloads:
            results["workloads"][workload] = workload_rows(workload, args, Path(scratch))
            print(f"{workload}: {json.dumps(results['workloads'][workload], indent=1)}", flush=True)
    print(table(results))
    for workload, res in results["workloads"].items():
        fresh, bitwise = res["rows"]["fresh machine"]["ratio"], res["bitwise_equal_to_uninterrupted"]
        print(
            f"{workload}: restart on a fresh machine {fresh:.2f}x of the first start (target <= 0.4x); "
            f"final weights bitwise equal to an uninterrupted run: {bitwise}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
