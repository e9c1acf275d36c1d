"""Load on ``stoker serve``: throughput and p50/p99 latency at 1, 16 and 64 concurrent clients,
with dynamic batching on and off, on loopback.

The model (``charlm`` or ``resnet20``, fresh weights) is exported once (``--aot``: also as an
AOTInductor package, which the servers then run). Two servers are started, batching on and
off, each as its own process (``python -m stoker serve``, so the clients do not share its
interpreter); the cells alternate between them. For each client count every client thread sends ``--requests / clients``
one-row Open Inference Protocol requests (JSON, ``POST /v2/models/NAME/infer``) one after the
other over its own keep-alive connection. Bounded: a fixed number of requests per cell, a
timeout on every request, loopback only. The mean rows per model call come from the server's
``/metrics``. Prints a table; ``--json`` also writes the rows.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import stoker
from stoker.bench.run_spec import zoo_predict_model_fn
from stoker.export import export
from stoker.models import create_model
from stoker.recipes.charlm import CharLMConfig, build_estimator

TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[1]


def _export(model: str, out: Path, aot: bool) -> tuple[Path, dict[str, Any]]:
    """Export ``model`` with fresh weights; return the directory and one request's input tensor."""
    if model == "charlm":
        est = build_estimator(CharLMConfig(device="cpu"))
        example = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
        tensor = {"name": "features", "shape": [1, 32], "datatype": "INT64", "data": example[0].tolist()}
    else:
        est = stoker.Estimator(
            model=lambda p: create_model("resnet20", dataset="cifar10"),
            model_fn=zoo_predict_model_fn,
            config=stoker.RunConfig(device="cpu", progress_bar=False),
        )
        example = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        tensor = {
            "name": "features",
            "shape": [1, 3, 32, 32],
            "datatype": "FP32",
            "data": example[0].flatten().tolist(),
        }
    return export(est, out / model, example, aot=aot), tensor


class ServerProcess:
    """``python -m stoker serve`` in its own process, on a free loopback port."""

    def __init__(self, export_dir: Path, aot: bool, batching: bool, threads: int, window_ms: float) -> None:
        cmd = [
            sys.executable,
            "-m",
            "stoker",
            "serve",
            str(export_dir),
            "--port",
            "0",
            "--model_name",
            "m",
            "--batch_window_ms",
            str(window_ms),
        ]
        cmd += ["--aot"] if aot else []
        cmd += [] if batching else ["--no_batching"]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        found = re.search(r"on http://([\d.]+):(\d+)", line)
        if not found:
            self.stop()
            raise RuntimeError(f"stoker serve did not start: {line}")
        self.host, self.port = found.group(1), int(found.group(2))

    def get(self, path: str) -> bytes:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        try:
            conn.request("GET", path)
            return conn.getresponse().read()
        finally:
            conn.close()

    def batch_totals(self) -> tuple[float, float]:
        """(rows, model calls) so far, from ``/metrics``."""
        text = self.get("/metrics").decode()
        rows = re.search(r"^stoker_serve_batch_rows_sum (\S+)$", text, re.M)
        calls = re.search(r"^stoker_serve_batch_rows_count (\S+)$", text, re.M)
        return (float(rows.group(1)) if rows else 0.0), (float(calls.group(1)) if calls else 0.0)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def _client(
    server: ServerProcess, body: bytes, n: int, start: threading.Barrier, latencies: list[float], statuses: list[int]
) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT_S)
    start.wait(TIMEOUT_S)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/v2/models/m/infer", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                statuses.append(resp.status)
            except (OSError, http.client.HTTPException):
                statuses.append(0)
                conn.close()
                conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT_S)
            latencies.append(time.perf_counter() - t0)
    finally:
        conn.close()


def run_cell(server: ServerProcess, body: bytes, clients: int, requests: int) -> dict[str, Any]:
    """``requests`` one-row requests from ``clients`` threads; throughput, latency, statuses, rows per call."""
    per_client = max(requests // clients, 1)
    latencies: list[float] = []
    statuses: list[int] = []
    barrier = threading.Barrier(clients + 1)
    threads = [
        threading.Thread(target=_client, args=(server, body, per_client, barrier, latencies, statuses))
        for _ in range(clients)
    ]
    rows0, calls0 = server.batch_totals()
    for t in threads:
        t.start()
    barrier.wait(TIMEOUT_S)
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rows1, calls1 = server.batch_totals()
    ms = np.array(latencies) * 1000
    return {
        "clients": clients,
        "requests": len(statuses),
        "ok": statuses.count(200),
        "503": statuses.count(503),
        "other": len(statuses) - statuses.count(200) - statuses.count(503),
        "requests_per_s": len(statuses) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "rows_per_call": (rows1 - rows0) / max(calls1 - calls0, 1),
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| batching | clients | requests | 200 | 503 | other | req/s | p50 ms | p99 ms | rows per model call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r['batching'] else 'off'} | {r['clients']} | {r['requests']} | {r['ok']} | {r['503']} | "
            f"{r['other']} | {r['requests_per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['rows_per_call']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", choices=["charlm", "resnet20"], default="charlm")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--requests", type=int, default=256, help="requests per cell (split evenly over the clients)")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (OMP_NUM_THREADS)")
    parser.add_argument("--aot", action="store_true", help="serve the AOTInductor package instead of model.pt2")
    parser.add_argument("--batch_window_ms", type=float, default=2.0, help="the batching server's --batch_window_ms")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    logging.getLogger("stoker").setLevel(logging.ERROR)
    print(
        f"torch {torch.__version__}, model {args.model}{' (AOT package)' if args.aot else ''}, server threads "
        f"{args.threads}, load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        export_dir, tensor = _export(args.model, Path(tmp), args.aot)
        body = json.dumps({"inputs": [tensor]}).encode()
        servers = {
            batching: ServerProcess(export_dir, args.aot, batching, args.threads, args.batch_window_ms)
            for batching in (True, False)
        }
        try:
            for server in servers.values():
                run_cell(server, body, 1, 8)  # warm-up
            # both servers run side by side (idle when not measured), cells interleaved, so that
            # the shared machine's noise hits batching on and off alike
            for clients in args.clients:
                for batching, server in servers.items():
                    rows.append(
                        {
                            "model": args.model,
                            "aot": args.aot,
                            "batching": batching,
                            **run_cell(server, body, clients, args.requests),
                        }
                    )
                    print(format_rows(rows[-1:]).splitlines()[-1], flush=True)
        finally:
            for server in servers.values():
                server.stop()
    print(format_rows(rows))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
