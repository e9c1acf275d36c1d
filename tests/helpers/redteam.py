"""Attacks on a running ``stoker serve``, on loopback: each returns what happened, as figures.

Used by the slow red-team suite (tests/serving/test_serve_redteam.py), which asserts what must
hold, and run as a script to measure before / after for docs/results/security.md::

    PYTHONPATH=src:tests python tests/helpers/redteam.py --out after.json [--big]

Every loop is bounded (a count and a deadline); every server is a process of its own, started
with ``stoker serve --port 0`` and stopped by its pid (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMEOUT = 10.0  # every request of a good client is bounded by this
MiB = 2**20


# ---------------------------------------------------------------------------- the server under test
@dataclass
class ServerProc:
    """A ``stoker serve`` process: its pid, port and everything it printed."""

    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mb(self, key: str = "VmRSS") -> float:
        """The server's resident memory (``VmHWM``: its peak so far), in MiB."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def output(self) -> str:
        return "".join(self.lines)


def export_tiny(where: Path) -> Path:
    """A TinyNet (8 features -> logits[3], classes) trained 4 steps and exported to ``where/net``."""
    from helpers.tiny import make_data, make_estimator, train_input
    from stoker.export import export

    x, y = make_data(32)
    est = make_estimator(where / "run")
    est.train(train_input(x, y), max_steps=4)
    return Path(export(est, where / "net", x[:2]))


@contextlib.contextmanager
def serving(export_dir: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[ServerProc]:
    """``stoker serve export_dir --port 0 *flags`` in its own process; stopped by pid on exit."""
    env = dict(env or os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker", "serve", str(export_dir), "--port", "0", *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    server = ServerProc(proc, 0)
    threading.Thread(target=_drain, args=(proc, server.lines), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while not server.port:
            found = re.search(r"on http://(?:\[[^\]]*\]|[^:/\s]+):(\d+)", server.output())
            if found:
                server.port = int(found.group(1))
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stoker serve did not start: {server.output()[-2000:]}")
            else:
                time.sleep(0.05)
        yield server
    finally:
        stop(proc)


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the server by its pid, SIGKILL it if it has not gone in 15 s."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(15)


# ---------------------------------------------------------------------------- clients
def call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
) -> tuple[int, bytes, dict[str, str]]:
    """One request on its own connection: status, body, headers (status 0: no answer in ``timeout``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    except OSError:
        return 0, b"", {}
    finally:
        conn.close()


def strict_json(data: bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity, which are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(data, parse_constant=refuse)


def is_json_error(data: bytes) -> bool:
    try:
        body = strict_json(data)
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), str)


def good_infer(port: int, rows: int = 2) -> tuple[int, float]:
    """A valid OIP request; its status and latency in seconds."""
    payload = {"inputs": [{"name": "features", "shape": [rows, 8], "datatype": "FP32", "data": [0.25] * (8 * rows)}]}
    start = time.perf_counter()
    status, _, _ = call(port, "POST", "/v2/models/net/infer", json.dumps(payload).encode())
    return status, time.perf_counter() - start


def raw(port: int, data: bytes, read_for: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; what came back within ``read_for`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_for) as sock:
        sock.sendall(data)
        out = b""
        deadline = time.monotonic() + read_for
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                out += chunk
                if b"\r\n\r\n" in out and _complete(out):
                    break
        return out


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    found = re.search(rb"content-length:\s*(\d+)", head, re.I)
    return found is not None and len(body) >= int(found.group(1))


def status_of(response: bytes) -> int:
    found = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(found.group(1)) if found else 0


def body_of(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]


# ---------------------------------------------------------------------------- the attacks
def slow_drip(port: int, connections: int = 64, seconds: float = 8.0) -> dict[str, Any]:
    """``connections`` clients announce a 1000-byte body and send one byte every 0.5 s; meanwhile
    one good client sends valid requests. What the good client got, and what the drippers got."""
    socks: list[socket.socket] = []
    head = b"POST /v2/models/net/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    for _ in range(connections):
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        s.sendall(head + b"{")
        socks.append(s)
    codes: list[int] = []
    latencies: list[float] = []
    cut: dict[int, float] = {}
    start = time.monotonic()
    next_drip = start
    while time.monotonic() - start < seconds and len(codes) < 400:
        if time.monotonic() >= next_drip:
            for i, s in enumerate(socks):
                if i not in cut:
                    try:
                        s.sendall(b" ")
                    except OSError:
                        cut[i] = time.monotonic() - start
            next_drip += 0.5
        status, latency = good_infer(port)
        codes.append(status)
        latencies.append(latency)
        time.sleep(0.05)
    answers: dict[str, int] = {}
    for i, s in enumerate(socks):
        s.settimeout(0.2)
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        key = str(status_of(data)) if data else ("closed" if i in cut else "no answer")
        answers[key] = answers.get(key, 0) + 1
        s.close()
    return {
        "good_requests": len(codes),
        "good_codes": {str(c): codes.count(c) for c in sorted(set(codes))},
        "good_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "drippers_answered": answers,
        "drippers_cut_by_s": round(max(cut.values()), 2) if cut else None,
    }


def greedy(server: ServerProc, clients: int = 64, body_mib: float = 8.0, path: str = "/predict") -> dict[str, Any]:
    """``clients`` clients each send a ~``body_mib`` MiB JSON body (valid JSON, too many rows) at once;
    the server's peak memory and the latency of /v2/health/live meanwhile."""
    row = "[" + ",".join(["0.123456789"] * 8) + "]"
    rows = (int(body_mib * MiB) - 64) // (len(row) + 1)
    body = ('{"inputs": {"features": [' + ",".join([row] * rows) + "]}}").encode()
    baseline = server.rss_mb()
    peak_before = server.rss_mb("VmHWM")
    codes: list[int] = []
    done = threading.Event()
    live: list[float] = []

    def probe() -> None:
        while not done.is_set() and len(live) < 2000:
            start = time.perf_counter()
            status, _, _ = call(server.port, "GET", "/v2/health/live")
            live.append(time.perf_counter() - start if status == 200 else float("inf"))
            time.sleep(0.05)

    def send() -> None:
        codes.append(call(server.port, "POST", path, body, {"Content-Type": "application/json"}, timeout=120)[0])

    prober = threading.Thread(target=probe)
    prober.start()
    threads = [threading.Thread(target=send) for _ in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - start
    done.set()
    prober.join(30)
    peak = server.rss_mb("VmHWM")
    return {
        "body_mib": round(len(body) / MiB, 2),
        "codes": {str(c): codes.count(c) for c in sorted(set(codes))},
        "seconds": round(elapsed, 1),
        "rss_before_mb": round(baseline),
        "rss_peak_mb": round(max(peak, peak_before)),
        "rss_growth_mb": round(max(peak, peak_before) - baseline),
        "growth_per_body": round((max(peak, peak_before) - baseline) / (len(body) / MiB), 1),
        "live_probes": len(live),
        "live_timeouts": sum(t == float("inf") for t in live),
        "live_p50_s": round(statistics.median(live), 3) if live else None,
        "live_max_s": round(max(t for t in live if t != float("inf")), 3)
        if any(t != float("inf") for t in live)
        else None,
    }


def idle_connections(port: int, connections: int = 32, wait_s: float = 15.0) -> dict[str, Any]:
    """``connections`` sockets that send nothing, and one that sends a header line every second:
    how long until the server closes them (None: still open after ``wait_s``)."""
    idle = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) for _ in range(connections)]
    slowloris = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    slowloris.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    closed: dict[int, float] = {}
    loris_closed: float | None = None
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < wait_s and (len(closed) < connections or loris_closed is None):
        for i, s in enumerate(idle):
            if i not in closed and _closed(s):
                closed[i] = time.monotonic() - start
        if loris_closed is None:
            try:
                slowloris.sendall(f"X-Drip-{n}: y\r\n".encode())
                n += 1
            except OSError:
                loris_closed = time.monotonic() - start
            if loris_closed is None and _closed(slowloris):
                loris_closed = time.monotonic() - start
        time.sleep(0.5)
    for s in [*idle, slowloris]:
        s.close()
    return {
        "idle": connections,
        "idle_closed": len(closed),
        "idle_closed_after_s": round(max(closed.values()), 1) if closed else None,
        "slowloris_closed_after_s": None if loris_closed is None else round(loris_closed, 1),
        "slowloris_header_lines_sent": n,
        "waited_s": wait_s,
    }


def _closed(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        data = s.recv(4096, socket.MSG_PEEK)
        return data == b"" or data.startswith(b"HTTP/")
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def huge_headers(server: ServerProc, mib: int = 64) -> dict[str, Any]:
    """A GET whose headers add up to ``mib`` MiB: the answer and the server's memory."""
    before = server.rss_mb()
    line = b"X-Fill: " + b"a" * 8000 + b"\r\n"
    status = 0
    body = b""
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        try:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            while sent < mib * MiB:
                sock.sendall(line * 64)
                sent += len(line) * 64
            sock.sendall(b"\r\n")
        except OSError:
            pass
        with contextlib.suppress(OSError):
            data = sock.recv(65536)
            status, body = status_of(data), body_of(data)
    return {
        "headers_mib_sent": round(sent / MiB, 1),
        "status": status,
        "json_error": is_json_error(body),
        "rss_before_mb": round(before),
        "rss_peak_mb": round(server.rss_mb("VmHWM")),
    }


def bad_requests(server: ServerProc) -> dict[str, Any]:
    """Requests that are the client's fault: each must be a 4xx with a JSON error, never a 500."""
    port = server.port
    out: dict[str, Any] = {}
    for name, data in (("int64_shape_overflow", []), ("int64_shape_overflow_8_values", [0.5] * 8)):
        overflow = {"inputs": [{"name": "features", "shape": [2**62, 4], "datatype": "FP32", "data": data}]}
        status, body, _ = call(port, "POST", "/v2/models/net/infer", json.dumps(overflow).encode())
        out[name] = {"status": status, "json_error": is_json_error(body)}
    header = json.dumps(
        {
            "inputs": [
                {"name": "features", "shape": [2**62, 4], "datatype": "FP32", "parameters": {"binary_data_size": 0}}
            ]
        }
    ).encode()
    status, body, _ = call(
        port, "POST", "/v2/models/net/infer", header, {"Inference-Header-Content-Length": str(len(header))}
    )
    out["int64_shape_overflow_binary"] = {"status": status, "json_error": is_json_error(body)}
    nan = {"inputs": {"features": [[float("nan")] + [0.5] * 7, [float("inf")] + [0.5] * 7]}}
    status, body, _ = call(port, "POST", "/predict", json.dumps(nan).encode())
    out["nan_inf_input"] = {"status": status, "answer_is_json": _parses(body), "json_error": is_json_error(body)}
    nan_oip = {"inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32", "data": [float("nan")] * 8}]}
    status, body, _ = call(port, "POST", "/v2/models/net/infer", json.dumps(nan_oip).encode())
    out["nan_inf_input_oip"] = {"status": status, "answer_is_json": _parses(body)}
    before = len(server.lines)
    for _ in range(3):  # a client that declares 2 GB, is told 413, and has gone before it can read it
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
            s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000000\r\n\r\n" + b"[" * 1000)
            s.shutdown(socket.SHUT_RDWR)
    time.sleep(1.0)
    log = "".join(server.lines[before:])
    metrics = call(port, "GET", "/metrics")[1].decode()
    out["disconnect_during_413"] = {
        "log_lines": len([line for line in log.splitlines() if line.strip()]),
        "tracebacks": log.count("Traceback"),
        "counted_500": bool(re.search(r'stoker_serve_requests_total\{code="500",route="predict"\} [1-9]', metrics)),
        "counted_413": bool(re.search(r'stoker_serve_requests_total\{code="413",route="predict"\} [1-9]', metrics)),
    }
    return out


def _parses(body: bytes) -> bool:
    try:
        strict_json(body)
    except ValueError:
        return False
    return True


def private_paths(server: ServerProc, export_dir: Path) -> dict[str, Any]:
    """Whether health, signature, metadata or metrics answers name a filesystem path or an address."""
    found = {}
    for path in ("/healthz", "/signature", "/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/net", "/metrics"):
        body = call(server.port, "GET", path)[1].decode(errors="replace")
        leaks = [p for p in (str(export_dir), str(export_dir.parent), tempfile.gettempdir() + "/") if p in body]
        leaks += re.findall(r'"(/[^"]*/[^"]*)"', body)[:3]
        if "127.0.0.1" in body:
            leaks.append("127.0.0.1")
        found[path] = sorted(set(leaks))
    return found


# ---------------------------------------------------------------------------- what held before
def path_tricks(port: int) -> dict[str, Any]:
    """Traversal, encodings and NUL in every route: every answer a 4xx, none a 500 or a file."""
    routes = [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/models/{m}",
        "/v2/models/{m}/versions/4",
        "/v2/models/{m}/ready",
        "/v2/models/{m}/versions/4/ready",
        "/v2/models/{m}/infer",
        "/v2/models/{m}/versions/4/infer",
        "/healthz",
        "/signature",
        "/predict",
        "/metrics",
    ]
    tricks = ["../../../../etc/passwd", "..%2f..%2f..%2fetc%2fpasswd", "net%00", "%2e%2e", "net/../net", "%ff%fe"]
    codes: dict[str, int] = {}
    leaked = 0
    for route in routes:
        for trick in tricks:
            path = route.format(m=trick) if "{m}" in route else route + "/" + trick
            for method in ("GET", "POST"):
                status, body, _ = call(port, method, path, b"{}" if method == "POST" else None)
                codes[str(status)] = codes.get(str(status), 0) + 1
                leaked += b"root:" in body
    return {"requests": sum(codes.values()), "codes": codes, "file_contents_leaked": leaked}


def held(server: ServerProc, export_dir: Path, mixed: int = 3000, clients: int = 64) -> dict[str, Any]:
    """The attacks that already failed: they must keep failing."""
    import numpy as np
    import torch

    from stoker.export import load_exported

    port = server.port
    out: dict[str, Any] = {"path_tricks": path_tricks(port)}
    big = raw(port, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2147483648\r\n\r\n{", 5)
    out["declared_2gb_body"] = status_of(big)
    smuggle = raw(
        port,
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        3,
    )
    out["smuggling"] = status_of(smuggle)
    out["nested_json"] = call(port, "POST", "/predict", b"[" * 100_000)[0]
    rss = server.rss_mb()
    shapes = [[2**40, 8], [-1, 8], [10**12, 10**12], [1, 8, 8, 8, 8]]
    out["absurd_shapes"] = [
        call(
            port,
            "POST",
            "/v2/models/net/infer",
            json.dumps({"inputs": [{"name": "features", "shape": s, "datatype": "FP32", "data": [1.0]}]}).encode(),
        )[0]
        for s in shapes
    ]
    out["absurd_shapes_rss_growth_mb"] = round(server.rss_mb() - rss)
    # mixed traffic: every answer checked against the model loaded here
    model = load_exported(export_dir)
    rng = np.random.default_rng(0)
    wrong, codes = 0, {}
    lock = threading.Lock()
    per_client = mixed // clients

    def client(seed: int) -> None:
        nonlocal wrong
        gen = np.random.default_rng(seed)
        for i in range(per_client):
            rows = int(gen.integers(1, 9))
            x = gen.standard_normal((rows, 8)).astype(np.float32)
            want = model({"features": torch.from_numpy(x)})
            kind = i % 4
            if kind == 0:
                payload = {
                    "inputs": [{"name": "features", "shape": [rows, 8], "datatype": "FP32", "data": x.ravel().tolist()}]
                }
                status, body, _ = call(port, "POST", "/v2/models/net/infer", json.dumps(payload).encode())
                ok = status == 200 and np.allclose(
                    np.array(json.loads(body)["outputs"][0]["data"]).reshape(rows, 3), want["logits"].numpy(), atol=1e-5
                )
            elif kind == 1:
                header = json.dumps(
                    {
                        "inputs": [
                            {
                                "name": "features",
                                "shape": [rows, 8],
                                "datatype": "FP32",
                                "parameters": {"binary_data_size": x.nbytes},
                            }
                        ],
                        "outputs": [{"name": "classes", "parameters": {"binary_data": True}}],
                    }
                ).encode()
                status, body, headers = call(
                    port,
                    "POST",
                    "/v2/models/net/infer",
                    header + x.tobytes(),
                    {"Inference-Header-Content-Length": str(len(header))},
                )
                n = int(headers.get("inference-header-content-length", 0))
                ok = status == 200 and np.array_equal(np.frombuffer(body[n:], "<i8"), want["classes"].numpy())
            elif kind == 2:
                status, body, _ = call(
                    port, "POST", "/predict", json.dumps({"inputs": {"features": x.tolist()}}).encode()
                )
                ok = status == 200 and json.loads(body)["outputs"]["classes"] == want["classes"].tolist()
            else:
                status, body, _ = call(
                    port, "POST", "/predict", json.dumps({"inputs": {"features": x[:, :5].tolist()}}).encode()
                )
                ok = status == 400 and is_json_error(body)
            with lock:
                codes[str(status)] = codes.get(str(status), 0) + 1
                wrong += not ok

    threads = [threading.Thread(target=client, args=(int(rng.integers(1 << 30)),)) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    out["mixed"] = {"requests": per_client * clients, "clients": clients, "codes": codes, "wrong": wrong}
    metrics = call(port, "GET", "/metrics")[1].decode()
    out["metrics_private"] = [p for p in (str(export_dir), "127.0.0.1", "/tmp") if p in metrics]
    return out


def saturated(server: ServerProc, clients: int = 64, tries: int = 10) -> dict[str, Any]:
    """With ``--max_pending 1``: concurrent large batches until one is refused; its Retry-After."""
    payload = json.dumps(
        {"inputs": [{"name": "features", "shape": [256, 8], "datatype": "FP32", "data": [0.5] * 2048}]}
    ).encode()
    seen: list[tuple[int, bytes, dict[str, str]]] = []

    def one() -> None:
        seen.append(call(server.port, "POST", "/v2/models/net/infer", payload))

    for _ in range(tries):
        threads = [threading.Thread(target=one) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if any(s == 503 for s, _, _ in seen):
            break
    refused = [(b, h) for s, b, h in seen if s == 503]
    return {
        "requests": len(seen),
        "refused_503": len(refused),
        "retry_after": sorted({h.get("retry-after", "") for _, h in refused}),
        "json_errors": all(is_json_error(b) for b, _ in refused),
        "other_codes": sorted({s for s, _, _ in seen if s not in (200, 503)}),
    }


# ---------------------------------------------------------------------------- the whole run
ATTACKS = ("slow_drip", "greedy", "idle", "headers", "bad", "held", "max_pending")


def run_all(
    export_dir: Path, big: bool, only: tuple[str, ...] = ATTACKS, flags: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The attacks in ``only``, each on a fresh server; figures as a dict."""
    results: dict[str, Any] = {}
    body_flags = ("--max_body_bytes", str(8 * MiB + 64 * 1024))  # the same limit before and after
    if "slow_drip" in only:
        with serving(export_dir, *body_flags, *flags) as server:
            results["slow_drip"] = slow_drip(server.port)
    if "greedy" in only:
        with serving(export_dir, *body_flags, *flags) as server:
            results["greedy_64x8MiB"] = greedy(server, 64, 8.0)
        with serving(export_dir, *flags) as server:
            results["greedy_64x8MiB_default_limit"] = greedy(server, 64, 8.0)
    if "idle" in only:
        with serving(export_dir, *flags) as server:
            results["idle_connections"] = idle_connections(server.port)
    if "headers" in only:
        with serving(export_dir, *flags) as server:
            results["huge_headers"] = huge_headers(server, 512 if big else 64)
    if "bad" in only:
        with serving(export_dir, *flags) as server:
            results["bad_requests"] = bad_requests(server)
            results["private_paths"] = private_paths(server, export_dir)
    if "held" in only:
        with serving(export_dir, *flags) as server:
            results["held"] = held(server, export_dir)
    if "max_pending" in only:
        with serving(export_dir, "--max_pending", "1", *flags) as server:
            results["max_pending"] = saturated(server)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--big", action="store_true", help="512 MiB of headers (the issue's figure) instead of 64")
    parser.add_argument("--only", default=",".join(ATTACKS), help=f"comma-separated, of {', '.join(ATTACKS)}")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="redteam-") as tmp:
        export_dir = export_tiny(Path(tmp))
        results = run_all(export_dir, args.big, tuple(args.only.split(",")))
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
