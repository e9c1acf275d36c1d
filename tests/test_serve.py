"""The serving check: HTTP JSON on loopback, validation, size limit, bad JSON."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest
import torch

from conftest import make_data, make_estimator, train_input
from stoker.export import export, load_exported
from stoker.serve import RequestError, make_server, validate_inputs

TIMEOUT = 10  # seconds: every request in these tests is bounded


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    x, y = make_data(32)
    est = make_estimator(tmp_path_factory.mktemp("run"))
    est.train(train_input(x, y), max_steps=4)
    return export(est, tmp_path_factory.mktemp("exp") / "net", x[:2]), x


@pytest.fixture()
def server(exported):
    srv = make_server(exported[0], "127.0.0.1", 0, max_body_bytes=4096, max_batch=16)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(TIMEOUT)


def request(srv, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def predict(srv, payload: object) -> tuple[int, dict]:
    return request(srv, "POST", "/predict", json.dumps(payload).encode(), {"Content-Type": "application/json"})


def test_health_and_a_valid_request_matches_the_program(server, exported):
    out_dir, x = exported
    status, body = request(server, "GET", "/healthz")
    assert status == 200 and body["status"] == "ok" and body["global_step"] == 4
    status, body = predict(server, {"inputs": {"features": x[:3].tolist()}})
    assert status == 200, body
    assert body["batch"] == 3 and sorted(body["outputs"]) == ["classes", "logits"]
    want = load_exported(out_dir)({"features": x[:3]})
    torch.testing.assert_close(torch.tensor(body["outputs"]["logits"]), want["logits"])
    assert body["outputs"]["classes"] == want["classes"].tolist()
    status, sig = request(server, "GET", "/signature")
    assert status == 200 and sig["inputs"][0]["shape"] == ["batch", 8]


def test_a_wrong_shape_is_a_400_that_states_the_signature(server, exported):
    x = exported[1]
    status, body = predict(server, {"inputs": {"features": x[:2, :5].tolist()}})
    assert status == 400
    assert "expected ['batch', 8]" in body["error"]
    assert body["expected"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 8]}]
    for bad in ({"inputs": {"features": [1.0] * 8}},               # one dimension short
                {"inputs": {"features": [[1.0] * 8, [1.0] * 7]}},  # ragged
                {"inputs": {"features": [[True] * 8]}},            # booleans for float32
                {"inputs": {"features": [["a"] * 8]}},             # strings
                {"inputs": {"other": [[1.0] * 8]}},                # wrong name
                {"inputs": {"features": [[1.0] * 8] * 17}},        # over max_batch
                {"features": [[1.0] * 8]}):                        # no "inputs"
        status, body = predict(server, bad)
        assert status == 400, (bad, body)
        assert body["error"]


def test_an_oversized_body_is_refused_with_413(server):
    payload = json.dumps({"inputs": {"features": [[0.5] * 8] * 200}}).encode()
    assert len(payload) > 4096
    status, body = request(server, "POST", "/predict", payload)
    assert status == 413 and "at most 4096" in body["error"]


def test_bad_json_and_other_bad_requests(server):
    status, body = request(server, "POST", "/predict", b'{"inputs": [1, 2', {"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in body["error"]
    status, _ = request(server, "POST", "/predict", b"\xff\xfe")
    assert status == 400
    status, body = request(server, "POST", "/predict", b"[" * 4000)  # nesting deeper than the parser's stack
    assert status == 400 and "RecursionError" in body["error"]
    assert request(server, "GET", "/nowhere")[0] == 404
    assert request(server, "GET", "/predict")[0] == 405
    # no Content-Length: refused without waiting for a body
    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        sock.sendall(b"POST /predict HTTP/1.0\r\nHost: x\r\n\r\n")
        reply = sock.recv(1024).decode()
    assert reply.startswith("HTTP/1.0 411")
    # the server still answers after all that
    assert request(server, "GET", "/healthz")[0] == 200


def test_validate_inputs_checks_integer_dtypes_and_batch_agreement():
    sig = {"inputs": [{"name": "tokens", "dtype": "int64", "shape": ["batch", 4]},
                      {"name": "mask", "dtype": "float32", "shape": ["batch", 4]}]}
    ok = validate_inputs({"inputs": {"tokens": [[1, 2, 3, 4]], "mask": [[1, 1, 0, 0]]}}, sig)
    assert ok["tokens"].dtype == torch.int64 and ok["mask"].dtype == torch.float32
    with pytest.raises(RequestError, match="must hold int64 values; got floats"):
        validate_inputs({"inputs": {"tokens": [[1.5, 2, 3, 4]], "mask": [[1, 1, 0, 0]]}}, sig)
    with pytest.raises(RequestError, match="same batch size"):
        validate_inputs({"inputs": {"tokens": [[1, 2, 3, 4]] * 2, "mask": [[1, 1, 0, 0]]}}, sig)
    small = {"inputs": [{"name": "b", "dtype": "uint8", "shape": [1]}]}
    with pytest.raises(RequestError, match="outside the range of uint8"):
        validate_inputs({"inputs": {"b": [300]}}, small)
