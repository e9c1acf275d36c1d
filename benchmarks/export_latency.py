"""Inference latency: ``Estimator.predict``, the eager ``model_fn``, the export, torch.compile and the AOT package.

For each model (``resnet20`` on CIFAR-10 images, the ``charlm`` recipe on byte segments) and
each batch size, one request is timed ``--iters`` times (after ``--warmup`` untimed calls)
five ways:

- ``estimator.predict``: ``next(est.predict(input_fn, yield_single_examples=False))`` per
  request: what a Python caller of the Estimator pays (infeed set-up, padding, copies);
- ``eager``: the PREDICT ``model_fn`` on the module, under ``torch.inference_mode``;
- ``exported``: ``torch.export.load("model.pt2").module()``, what ``stoker serve`` runs;
- ``compiled``: ``torch.compile`` of the eager computation (compiled once per batch size; the
  compile time is reported apart and is not in the latencies);
- ``aot``: the AOTInductor package of ``export(..., aot=True)`` (``model.aoti.pt2``, one package
  with the dynamic batch for every batch size; its compile time is reported apart).

Weights are the freshly initialised ones (latency does not depend on their values); the
exported program is checked against eager before timing. Prints a table; ``--json`` also
writes the rows. Compile is slow on a small CPU: ``--no-compile`` skips torch.compile and
``--no-aot`` the AOT package.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import stoker
from stoker.bench.run_spec import zoo_predict_model_fn
from stoker.export import PredictModule, export, load_exported
from stoker.models import create_model
from stoker.recipes.charlm import CharLMConfig, build_estimator


def _timings(fn: Callable[[], Any], warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _summary(times: list[float], batch: int) -> dict[str, float]:
    ms = np.array(times) * 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "examples_per_sec": batch / statistics.median(times),
    }


EstimatorFactory = Callable[[int, "str | None"], stoker.Estimator]  # (predict batch, warm-start weights)


def _resnet20() -> tuple[EstimatorFactory, Callable[[int], torch.Tensor]]:
    def estimator(batch: int, weights: str | None) -> stoker.Estimator:
        return stoker.Estimator(
            model=lambda p: create_model("resnet20", dataset="cifar10"),
            model_fn=zoo_predict_model_fn,
            config=stoker.RunConfig(device="cpu", progress_bar=False),
            predict_batch_size=batch,
            warm_start_from=weights,
        )

    return estimator, lambda n: torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _charlm() -> tuple[EstimatorFactory, Callable[[int], torch.Tensor]]:
    config = CharLMConfig(device="cpu")

    def estimator(batch: int, weights: str | None) -> stoker.Estimator:
        return build_estimator(dataclasses.replace(config, eval_batch_size=batch), warm_start_from=weights)

    return estimator, lambda n: torch.randint(0, 256, (n, config.seq_len), generator=torch.Generator().manual_seed(0))


MODELS: dict[str, Callable[[], tuple[EstimatorFactory, Callable[[int], torch.Tensor]]]] = {
    "resnet20": _resnet20,
    "charlm": _charlm,
}


def bench_model(
    name: str, batches: list[int], warmup: int, iters: int, compile_: bool, workdir: Path, aot: bool = True
) -> list[dict[str, Any]]:
    """Rows ``{model, batch, path, p50_ms, p99_ms, mean_ms, examples_per_sec, ...}`` for one model."""
    make_estimator, make_input = MODELS[name]()
    fresh = make_estimator(max(batches), None)
    start = time.perf_counter()
    out_dir = export(fresh, workdir / name, make_input(2), aot=aot)
    export_s = time.perf_counter() - start
    weights = out_dir / "model.safetensors"
    program = load_exported(out_dir)
    package = load_exported(out_dir, aot=True) if aot else None
    module = PredictModule(fresh.model.eval(), fresh._model_fn, {**fresh.params, "cache": None}, None).eval()
    rows: list[dict[str, Any]] = []
    for batch in batches:
        x = make_input(batch)
        with torch.inference_mode():
            eager_out = module(x)
        got = program({"features": x})
        for key, value in eager_out.items():
            assert torch.allclose(value.float(), got[key].float(), rtol=1e-4, atol=1e-4), (
                f"{name}: exported {key} differs"
            )
        # The Estimator reads the exported weights (warm start), so all paths compute the same thing.
        est = make_estimator(batch, str(weights))

        def data(p, x=x):
            return stoker.data.arrays(x, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p))

        paths: dict[str, Callable[[], Any]] = {
            "estimator.predict": lambda est=est, data=data: next(est.predict(data, yield_single_examples=False)),
            "eager": lambda x=x: _no_grad(module, x),
            "exported": lambda x=x: program({"features": x}),
        }
        extra: dict[str, dict[str, float]] = {}
        if package is not None:
            paths["aot"] = lambda x=x: package({"features": x})
            extra["aot"] = {"compile_s": float(package.signature["aot"]["compile_s"])}
            for key, value in eager_out.items():
                assert torch.allclose(value.float(), package({"features": x})[key].float(), rtol=1e-4, atol=1e-4), (
                    f"{name}: aot {key} differs"
                )
        if compile_:
            compiled = torch.compile(module, dynamic=False)
            start = time.perf_counter()
            _no_grad(compiled, x)
            extra["compiled"] = {"compile_s": time.perf_counter() - start}
            paths["compiled"] = lambda x=x, compiled=compiled: _no_grad(compiled, x)
        # Interleave the paths round by round so machine noise (a shared CPU) hits all alike.
        rounds = 3
        per_round = max(iters // rounds, 1)
        times: dict[str, list[float]] = {p: [] for p in paths}
        for r in range(rounds):
            for path, fn in paths.items():
                times[path] += _timings(fn, warmup if r == 0 else 1, per_round)
        for path in paths:
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "path": path,
                    "iters": len(times[path]),
                    **_summary(times[path], batch),
                    "export_s": export_s,
                    **extra.get(path, {}),
                }
            )
    return rows


def _no_grad(module: Callable[..., Any], x: torch.Tensor) -> Any:
    with torch.inference_mode():
        return module(x)


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The result table (markdown)."""
    eager = {(r["model"], r["batch"]): r["p50_ms"] for r in rows if r["path"] == "eager"}
    lines = [
        "| model | batch | path | p50 ms | p99 ms | examples/s | p50 speed-up vs eager | note |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        note = f"compile {r['compile_s']:.1f} s" if "compile_s" in r else ""
        speedup = eager.get((r["model"], r["batch"]), float("nan")) / r["p50_ms"]
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['path']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['examples_per_sec']:.0f} | {speedup:.2f}x | {note} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["resnet20", "charlm"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--iters", type=int, default=30, help="timed requests per path (in 3 interleaved rounds)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--no-compile", dest="compile", action="store_false", help="skip torch.compile (slow on small CPUs)"
    )
    parser.add_argument(
        "--no-aot", dest="aot", action="store_false", help="skip the AOTInductor package (needs a C++ compiler)"
    )
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    logging.getLogger("stoker").setLevel(logging.ERROR)  # the fresh-weights export warning is expected here
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d %H:%M')}", flush=True
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows += bench_model(name, args.batches, args.warmup, args.iters, args.compile, Path(tmp), args.aot)
            print(f"{name} done", flush=True)
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
