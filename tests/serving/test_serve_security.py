"""stoker serve keeps good clients served while bad ones misbehave (issue 52): one fast test per
attack of the issue's table, on loopback, against a server in this process with small limits.
The slow red-team suite (test_serve_redteam.py) runs the same attacks at full size against
``stoker serve`` processes."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time

import numpy as np
import pytest
import torch

from helpers.redteam import body_of, call, is_json_error, status_of, strict_json
from helpers.tiny import make_data, make_estimator, train_input
from stoker.export import export
from stoker.serving.app import ServeConfig
from stoker.serving.connection import ConnectionLimits
from stoker.serving.protocol import default_max_body_bytes
from stoker.serving.server import exposure_warning, make_server

pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    x, y = make_data(32)
    est = make_estimator(tmp_path_factory.mktemp("run"))
    est.train(train_input(x, y), max_steps=4)
    return export(est, tmp_path_factory.mktemp("exp") / "net", x[:2]), x


def serve(exported, **kwargs):
    limits = kwargs.pop("limits", None)
    config = ServeConfig(**kwargs.pop("config", {}))
    return make_server(exported[0], "127.0.0.1", 0, config=config, limits=limits, **kwargs).start()


def good(port: int) -> int:
    payload = {"inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}]}
    return call(port, "POST", "/v2/models/net/infer", json.dumps(payload).encode())[0]


def metric(srv, name: str) -> str:
    return call(srv.server_address[1], "GET", "/metrics")[1].decode()


def test_clients_that_drip_their_bodies_hold_no_admission_slot_and_are_cut(exported):
    """Before: every drip took one of --max_pending's slots before its body was read, and good
    requests got 503 for as long as they dripped."""
    srv = serve(exported, max_pending=2, config={"min_upload_bytes_per_s": 1000})
    port = srv.server_address[1]
    drippers = []
    try:
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v2/models/net/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{")
            drippers.append(s)
        codes = []
        for _ in range(8):
            for s in drippers:
                s.sendall(b" ")
            codes.append(good(port))
            time.sleep(0.1)
        assert codes == [200] * 8  # admitted only once their own bodies had arrived
        answers = [s.recv(4096) for s in drippers]  # cut below 1000 bytes/s after the first second
        assert all(status_of(a) == 408 and b"arrives too slowly" in body_of(a) for a in answers), answers[0]
        assert json.loads(body_of(answers[0]))["error"].startswith("the body arrives too slowly")
    finally:
        for s in drippers:
            s.close()
        srv.stop()


def test_bodies_still_arriving_have_their_own_bound(exported):
    srv = serve(exported, config={"max_uploading": 2})
    port = srv.server_address[1]
    try:
        held = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            held.append(s)
        time.sleep(0.2)
        status, body, headers = call(port, "POST", "/predict", b'{"inputs": {}}')
        assert status == 503 and headers["retry-after"] == "1" and "--max_uploading" in json.loads(body)["error"]
        for s in held:
            s.close()
        time.sleep(0.2)
        assert good(port) == 200
    finally:
        srv.stop()


def test_greedy_bodies_are_decoded_one_at_a_time_within_a_bound_of_held_bytes(exported, monkeypatch):
    """Before: 64 bodies of 8 MiB were parsed at once (memory ~14x the bodies, liveness 7.2 s)."""
    import stoker.serving.app as app_module

    running, peak = [0], [0]
    real = app_module.decode_json

    def slow_decode(body):  # stands for a parse that takes long: it releases the GIL, as sleep does
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        running[0] -= 1
        return real(body)

    monkeypatch.setattr(app_module, "decode_json", slow_decode)
    body = json.dumps({"inputs": {"features": [[0.5] * 8] * 400}}, indent=4).encode()  # > 64 KiB: off the loop
    assert len(body) > 64 * 2**10
    srv = serve(exported, max_batch=256, config={"max_body_bytes": 2 * len(body), "max_buffered_bytes": 3 * len(body)})
    port = srv.server_address[1]
    try:
        results: list[tuple[int, dict[str, str]]] = []

        def send() -> None:
            status, _, headers = call(port, "POST", "/predict", body)
            results.append((status, headers))

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        live = []
        while any(t.is_alive() for t in threads):
            start = time.perf_counter()
            assert call(port, "GET", "/v2/health/live")[0] == 200
            live.append(time.perf_counter() - start)
        for t in threads:
            t.join(30)
        codes = sorted(s for s, _ in results)
        assert peak[0] == 1, peak  # --max_decoding
        assert codes.count(400) >= 1 and set(codes) <= {400, 503}, codes  # 400 rows > max_batch: decoded, 400
        assert all(h.get("retry-after") == "1" for s, h in results if s == 503)
        assert max(live) < 1.0, live  # health checks never wait for the decodes
        assert srv.app.buffered == 0 and srv.app.uploading == 0
        assert "stoker_serve_buffered_bytes 0.0" in metric(srv, "")
    finally:
        srv.stop()


def test_idle_and_slowloris_connections_are_closed_after_the_header_timeout(exported):
    """Before: kept open indefinitely."""
    srv = serve(exported, limits=ConnectionLimits(header_timeout_s=0.5))
    port = srv.server_address[1]
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        loris = socket.create_connection(("127.0.0.1", port), timeout=10)
        loris.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        for n in range(3):
            time.sleep(0.1)
            loris.sendall(f"X-{n}: y\r\n".encode())
        answer = loris.recv(4096)
        assert status_of(answer) == 408 and is_json_error(body_of(answer)), answer
        assert idle.recv(4096) == b"" and time.monotonic() - start < 3
        keep = socket.create_connection(("127.0.0.1", port), timeout=10)  # a complete request is unaffected
        keep.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(keep.recv(4096)) == 200
        for s in (idle, loris, keep):
            s.close()
        text = metric(srv, "")
        assert 'stoker_serve_connections_closed_total{reason="idle"}' in text
        assert 'stoker_serve_connections_closed_total{reason="header_timeout"} 1.0' in text
    finally:
        srv.stop()


def test_headers_over_the_limit_get_431_and_are_never_accumulated(exported):
    """Before: 512 MB of headers were accepted with 200 (server memory 371 -> 864 MB)."""
    srv = serve(exported, limits=ConnectionLimits(max_header_bytes=8192))
    port = srv.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            try:
                for _ in range(200):  # 1.6 MB, far past the limit: the server answers and stops reading
                    s.sendall(b"X-Fill: " + b"a" * 8000 + b"\r\n")
            except OSError:
                pass
            answer = s.recv(4096)
        assert status_of(answer) == 431 and "larger than 8192 bytes" in json.loads(body_of(answer))["error"]
        answer = _raw(port, b"NOT HTTP AT ALL\r\n\r\n")  # malformed: uvicorn's plain text before, JSON now
        assert status_of(answer) == 400 and is_json_error(body_of(answer))
        smuggled = (
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        answer = _raw(port, smuggled)
        assert status_of(answer) == 400 and is_json_error(body_of(answer))
        assert good(port) == 200
    finally:
        srv.stop()


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return s.recv(65536)


def test_connections_beyond_the_limit_are_closed_at_once(exported):
    srv = serve(exported, limits=ConnectionLimits(max_connections=3))
    port = srv.server_address[1]
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert extra.recv(4096) == b""
        except ConnectionResetError:
            pass
        for s in [*held, extra]:
            s.close()
        time.sleep(0.2)
        assert good(port) == 200
        assert 'stoker_serve_connections_closed_total{reason="too_many_connections"} 1.0' in metric(srv, "")
    finally:
        srv.stop()


@pytest.mark.parametrize("binary", [False, True])
def test_a_shape_whose_product_overflows_int64_is_a_json_400(exported, binary):
    """Before: a plain-text 500 and a traceback."""
    srv = serve(exported)
    port = srv.server_address[1]
    try:
        if binary:
            item = {"name": "features", "shape": [2**62, 4], "datatype": "FP32", "parameters": {"binary_data_size": 0}}
            header = json.dumps({"inputs": [item]}).encode()
            status, body, _ = call(
                port, "POST", "/v2/models/net/infer", header, {"Inference-Header-Content-Length": str(len(header))}
            )
        else:
            item = {"name": "features", "shape": [2**62, 4], "datatype": "FP32", "data": []}
            status, body, _ = call(port, "POST", "/v2/models/net/infer", json.dumps({"inputs": [item]}).encode())
        assert status == 400 and "has a batch of 4611686018427387904 rows" in json.loads(body)["error"]
        assert good(port) == 200
    finally:
        srv.stop()


def test_a_client_gone_during_a_413_is_one_log_line_and_counted_as_413(exported, caplog):
    """Before: a 54-line traceback, counted as a 500."""
    srv = serve(exported, config={"max_body_bytes": 4096})
    port = srv.server_address[1]
    try:
        with caplog.at_level(logging.WARNING, logger="stoker"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000000\r\n\r\n[[")
                s.shutdown(socket.SHUT_RDWR)
            deadline = time.monotonic() + 5
            while "413" not in metric(srv, "") and time.monotonic() < deadline:
                time.sleep(0.05)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "disconnected before its 413" in lines[0] and "\n" not in lines[0], lines
        text = metric(srv, "")
        assert 'stoker_serve_requests_total{code="413",route="predict"} 1.0' in text
        assert 'code="500"' not in text
        # a client that stays gets its 413 even while it goes on sending (the server lingers)
        big = b"[" + b"0.5," * 2**20
        status, body, _ = call(port, "POST", "/predict", big)
        assert status == 413 and "at most 4096" in json.loads(body)["error"]
    finally:
        srv.stop()


def test_non_finite_inputs_are_refused_and_non_finite_outputs_stay_json(exported):
    """Before: NaN in, 200 with NaN in the answer (not JSON). The choice: inputs refused (400),
    outputs written as the strings "NaN", "Infinity", "-Infinity"."""
    srv = serve(exported)
    port = srv.server_address[1]
    try:
        row = [float("nan")] + [0.5] * 7
        status, body, _ = call(port, "POST", "/predict", json.dumps({"inputs": {"features": [row]}}).encode())
        assert status == 400 and "NaN is not a JSON number" in strict_json(body)["error"]
        x = np.full((1, 8), np.inf, dtype=np.float32)
        item = {"name": "features", "shape": [1, 8], "datatype": "FP32", "parameters": {"binary_data_size": 32}}
        header = json.dumps({"inputs": [item]}).encode()
        length = {"Inference-Header-Content-Length": str(len(header))}
        status, body, _ = call(port, "POST", "/v2/models/net/infer", header + x.tobytes(), length)
        assert status == 400 and "holds NaN or infinite values" in strict_json(body)["error"]
        model = srv.app.batcher.model
        srv.app.batcher.model = lambda inputs: {  # a model that overflows
            "logits": torch.tensor([[float("inf"), float("-inf"), float("nan")]]).expand(len(inputs["features"]), 3),
            "classes": model(inputs)["classes"],
        }
        payload = {"inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}]}
        status, body, _ = call(port, "POST", "/v2/models/net/infer", json.dumps(payload).encode())
        assert status == 200 and strict_json(body)["outputs"][0]["data"] == ["Infinity", "-Infinity", "NaN"]
        assert np.array(strict_json(body)["outputs"][0]["data"], dtype=np.float32)[2] != 0  # numpy reads them back
        status, body, _ = call(port, "POST", "/predict", json.dumps({"inputs": {"features": [[0.5] * 8]}}).encode())
        assert status == 200 and strict_json(body)["outputs"]["logits"] == [["Infinity", "-Infinity", "NaN"]]
    finally:
        srv.stop()


def test_health_and_signature_name_no_paths_unless_asked(exported):
    """Before: /healthz and /signature answered the export's and the checkpoint's absolute paths."""
    out = exported[0]
    for show in (False, True):
        srv = serve(exported, config={"show_paths": show})
        port = srv.server_address[1]
        try:
            texts = [call(port, "GET", p)[1].decode() for p in ("/healthz", "/signature", "/v2/models/net", "/metrics")]
            leaked = any(str(out.parent) in t for t in texts)
            assert leaked == show, texts
            health, sig = json.loads(texts[0]), json.loads(texts[1])
            if not show:
                assert health["model"] == "net" and sig["checkpoint"] == "ckpt-4"
        finally:
            srv.stop()


def test_listening_beyond_loopback_says_there_is_no_tls_or_authentication(exported, caplog):
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert exposure_warning(host) is None, host
    for host in ("0.0.0.0", "::", "10.1.2.3", "my-host"):
        line = exposure_warning(host)
        assert line and "\n" not in line and "no TLS and no authentication" in line and "proxy" in line
    with caplog.at_level(logging.WARNING, logger="stoker"):
        srv = make_server(exported[0], "0.0.0.0", 0)
    srv.socket.close()
    assert [r.getMessage() for r in caplog.records] == [exposure_warning("0.0.0.0")]


def test_the_default_body_limit_follows_the_signature_and_max_batch(exported):
    sig = json.loads((exported[0] / "signature.json").read_text())
    assert default_max_body_bytes(sig, 256) == 256 * 8 * 32 + 64 * 1024
    assert default_max_body_bytes(sig, 16) == 16 * 8 * 32 + 64 * 1024
    static = {"inputs": [{"name": "x", "dtype": "float32", "shape": [4, 3, 224, 224]}]}
    assert default_max_body_bytes(static, 256) == 4 * 3 * 224 * 224 * 32 + 64 * 1024
    huge = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 3, 1024, 1024]}]}
    assert default_max_body_bytes(huge, 256) == 256 * 2**20  # capped: pass --max_body_bytes for more
    srv = serve(exported, max_batch=16)
    port = srv.server_address[1]
    try:
        assert srv.app.config.max_body_bytes == 16 * 8 * 32 + 64 * 1024
        status, body, _ = call(port, "POST", "/predict", b" " * (16 * 8 * 32 + 64 * 1024 + 1))
        assert status == 413 and "at most 69632" in json.loads(body)["error"]
    finally:
        srv.stop()


def test_the_command_refuses_bad_limits_with_2(tmp_path, capsys):
    from stoker.cli import main

    for flag, value in (("--max_uploading", "0"), ("--max_header_bytes", "10"), ("--header_timeout_s", "0")):
        assert main(["serve", str(tmp_path), flag, value]) == 2
        assert f"{flag} must be" in capsys.readouterr().err


def test_a_response_to_a_client_that_reads_it_late_is_still_delivered(exported):
    """An answer given before the body was read (413 here) is followed by a lingering close: the
    client that is still sending reads the answer instead of a connection reset."""
    srv = serve(exported, config={"max_body_bytes": 4096})
    host, port = srv.server_address
    try:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("POST", "/predict", body=b" " * (3 * 2**20))  # sent whole before reading
        resp = conn.getresponse()
        assert resp.status == 413 and resp.getheader("connection") == "close" and is_json_error(resp.read())
        conn.close()
    finally:
        srv.stop()
