"""How long a checkpoint stalls the training loop: synchronous against asynchronous saves.

Trains a zoo model (default resnet50, batch 32, SGD with momentum, synthetic data) with a
checkpoint every ``--every`` steps into each store (``local``: a fresh temporary directory;
``s3``: a bucket on moto's S3 server on the loopback address, through s3fs) with
``RunConfig(checkpoint_io=CheckpointIO(async_save=False))`` and ``True``. The stall of one
checkpoint is the time the loop thread spends in the save (``ModelState.save``): for a synchronous save the whole
serialise-write-commit, for an asynchronous one the copy of the state (plus any wait for
the previous write). The background write time of asynchronous saves is reported beside it.

Target: the median asynchronous stall is at most 10 % of the median synchronous stall.
The ratio is taken within one run, so machine load hits both sides alike; say the load.

    python benchmarks/checkpoint_io.py                                  # resnet50, 224 px
    python benchmarks/checkpoint_io.py --image_size 32 --steps 9        # quick, on a CPU
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

import stoker
from stoker.models import create_model


@contextmanager
def _s3_server() -> Iterator[str]:
    """A bucket on moto's S3 server on 127.0.0.1; yields its ``s3://`` URL prefix."""
    import fsspec
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    fsspec.filesystem("s3").mkdir("bench")
    try:
        yield "s3://bench"
    finally:
        server.stop()


def _model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features)
    return stoker.EstimatorSpec(loss=None if labels is None else F.cross_entropy(logits, labels))


def run_one(model_dir: str, args: argparse.Namespace, async_checkpoints: bool) -> dict[str, Any]:
    """Train ``args.steps`` steps into ``model_dir``; the stall and write time of every checkpoint."""
    torch.manual_seed(0)
    n = args.batch_size
    x = torch.randn(n, 3, args.image_size, args.image_size)
    y = torch.randint(0, 1000, (n,))

    def input_fn(params: dict[str, Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield x, y

    est = stoker.Estimator(
        model=lambda params: create_model(args.model),
        model_fn=_model_fn,
        optimizer=lambda params, ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
        config=stoker.RunConfig(
            model_dir=model_dir,
            iterations_per_loop=1,
            save_checkpoints_steps=args.every,
            checkpoint_io=stoker.CheckpointIO(async_save=async_checkpoints),
            log_every_n_steps=None,
            summaries=False,
            progress_bar=False,
            keep_checkpoint_max=2,
        ),
        train_batch_size=n,
    )
    state = est.state
    stalls: list[float] = []
    writes: list[float] = []
    real_save = state.save

    def timed_save(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        out = real_save(*a, **kw)
        stalls.append(time.perf_counter() - start)
        writer = state.writer
        if writer is not None and writer._thread is not None:  # time the background write too
            thread, begun = writer._thread, time.perf_counter()

            def joined() -> None:
                thread.join()
                writes.append(time.perf_counter() - begun)

            import threading

            threading.Thread(target=joined, daemon=True).start()
        return out

    state.save = timed_save  # type: ignore[method-assign]
    start = time.perf_counter()
    est.train(input_fn, max_steps=args.steps)
    total = time.perf_counter() - start
    periodic = stalls[:-1] if len(stalls) > 1 else stalls  # the last one is the final save at the end
    return {
        "stalls_s": stalls,
        "median_stall_s": statistics.median(periodic),
        "median_write_s": statistics.median(writes) if writes else None,
        "train_s": total,
        "checkpoints": len(stalls),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every store x mode; returns the results and the async/sync stall ratio per store."""
    results: dict[str, Any] = {
        "load_avg": os.getloadavg(),
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "steps": args.steps,
        "every": args.every,
        "runs": {},
    }
    stores = args.stores.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = _s3_server() if "s3" in stores else _null()
        with ctx as bucket:
            for store in stores:
                for mode in ("sync", "async"):
                    base = tmp if store == "local" else bucket
                    model_dir = f"{base}/{store}-{mode}-{time.time_ns()}"
                    results["runs"][f"{store}/{mode}"] = run_one(model_dir, args, mode == "async")
                sync, asyn = results["runs"][f"{store}/sync"], results["runs"][f"{store}/async"]
                results[f"{store}/async_over_sync"] = asyn["median_stall_s"] / sync["median_stall_s"]
    return results


@contextmanager
def _null() -> Iterator[None]:
    yield None


def report(results: dict[str, Any]) -> str:
    lines = [
        f"{results['model']} batch {results['batch_size']} at {results['image_size']} px, "
        f"checkpoint every {results['every']} of {results['steps']} steps; load average {results['load_avg'][0]:.1f}"
    ]
    lines.append(f"{'store/mode':<14} {'stall (median)':>15} {'background write':>17} {'checkpoints':>12}")
    for key, r in results["runs"].items():
        write = f"{r['median_write_s'] * 1e3:.0f} ms" if r["median_write_s"] is not None else "-"
        lines.append(f"{key:<14} {r['median_stall_s'] * 1e3:>12.0f} ms {write:>17} {r['checkpoints']:>12}")
    for key, value in results.items():
        if key.endswith("async_over_sync"):
            verdict = "meets" if value <= 0.10 else "misses"
            lines.append(f"{key.split('/')[0]}: async stall = {value:.1%} of sync ({verdict} the 10 % target)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--steps", type=int, default=13)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--stores", default="local,s3", help="comma-separated: local, s3")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args()
    if not set(args.stores.split(",")) <= {"local", "s3"}:
        p.error(f"--stores takes local and/or s3, comma-separated; got {args.stores!r}")
    logging.getLogger("stoker").setLevel(logging.WARNING)
    results = run(args)
    print(json.dumps(results, indent=1) if args.json else report(results))


if __name__ == "__main__":
    main()
