"""stoker serve: uvicorn + Starlette, the Open Inference Protocol driven by tritonclient, the
/predict alias, limits (400/404/405/413/503), dynamic batching and Prometheus metrics, on loopback."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time

import numpy as np
import pytest
import torch

from helpers.tiny import make_data, make_estimator, train_input
from stoker.export import export, load_exported
from stoker.serving.server import RequestError, make_server, validate_inputs

httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient[http] is a dev dependency (pip install -e .[dev])"
)

TIMEOUT = 10  # seconds: every request in these tests is bounded


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    x, y = make_data(32)
    est = make_estimator(tmp_path_factory.mktemp("run"))
    est.train(train_input(x, y), max_steps=4)
    return export(est, tmp_path_factory.mktemp("exp") / "net", x[:2]), x


@pytest.fixture()
def server(exported):
    srv = make_server(exported[0], "127.0.0.1", 0, max_body_bytes=4096, max_batch=16).start()
    yield srv
    srv.stop()


def request(
    srv, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    status, raw, _ = raw_request(srv, method, path, body, headers)
    return status, json.loads(raw)


def raw_request(
    srv, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, http.client.HTTPResponse]:
    host, port = srv.server_address
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        chunked = (headers or {}).get("Transfer-Encoding") == "chunked"
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp
    finally:
        conn.close()


def predict(srv, payload: object) -> tuple[int, dict]:
    return request(srv, "POST", "/predict", json.dumps(payload).encode(), {"Content-Type": "application/json"})


def infer_json(srv, payload: object, model: str = "net") -> tuple[int, dict]:
    return request(srv, "POST", f"/v2/models/{model}/infer", json.dumps(payload).encode())


def triton(srv) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        srv.url.removeprefix("http://"), connection_timeout=TIMEOUT, network_timeout=TIMEOUT
    )


def triton_infer(client, x: np.ndarray, binary: bool, model: str = "net"):
    inp = httpclient.InferInput("features", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = None if binary else [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("logits", "classes")]
    return client.infer(model, [inp], outputs=outputs)


def test_tritonclient_reads_health_and_metadata_and_infers_in_json_and_binary(server, exported):
    out_dir, x = exported
    client = triton(server)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("net")
        meta = client.get_model_metadata("net")
        assert meta["name"] == "net" and meta["versions"] == ["4"] and meta["platform"] == "pytorch_torch_export"
        assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 8]}]
        assert meta["outputs"] == [
            {"name": "logits", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "classes", "datatype": "INT64", "shape": [-1]},
        ]
        want = load_exported(out_dir)({"features": x[:3]})
        for binary in (False, True):
            result = triton_infer(client, x[:3].numpy(), binary)
            np.testing.assert_array_equal(result.as_numpy("logits"), want["logits"].numpy())
            np.testing.assert_array_equal(result.as_numpy("classes"), want["classes"].numpy())
        inp = httpclient.InferInput("features", [2, 8], "FP32")
        inp.set_data_from_numpy(x[:2].numpy())
        result = client.infer(
            "net", [inp], model_version="4", request_id="r-7", outputs=[httpclient.InferRequestedOutput("classes")]
        )
        assert result.get_response()["id"] == "r-7" and result.as_numpy("logits") is None
        np.testing.assert_array_equal(result.as_numpy("classes"), want["classes"][:2].numpy())
        with pytest.raises(Exception, match="no model 'other'"):
            client.get_model_metadata("other")
        with pytest.raises(Exception, match="has no version '5'"):
            client.infer("net", [inp], model_version="5")
    finally:
        client.close()


def test_the_predict_alias_and_healthz_still_answer(server, exported):
    out_dir, x = exported
    status, body = request(server, "GET", "/healthz")
    assert status == 200 and body["status"] == "ok" and body["global_step"] == 4 and body["kind"] == "program"
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
    for bad in (
        {"inputs": {"features": [1.0] * 8}},  # one dimension short
        {"inputs": {"features": [[1.0] * 8, [1.0] * 7]}},  # ragged
        {"inputs": {"features": [[True] * 8]}},  # booleans for float32
        {"inputs": {"features": [["a"] * 8]}},  # strings
        {"inputs": {"other": [[1.0] * 8]}},  # wrong name
        {"inputs": {"features": [[1.0] * 8] * 17}},  # over max_batch
        {"features": [[1.0] * 8]},
    ):  # no "inputs"
        status, body = predict(server, bad)
        assert status == 400, (bad, body)
        assert body["error"]


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (
            {"name": "features", "shape": [1, 8], "datatype": "FP64", "data": [0.5] * 8},
            "datatype 'FP64'; the model expects FP32",
        ),
        ({"name": "features", "shape": [1, 5], "datatype": "FP32", "data": [0.5] * 5}, r"expected \['batch', 8\]"),
        (
            {"name": "features", "shape": [2, 8], "datatype": "FP32", "data": [0.5] * 8},
            "holds 16 values but data has 8",
        ),
        ({"name": "features", "shape": [1, 8], "datatype": "FP32", "data": ["a"] * 8}, "must hold float32 values"),
        ({"name": "features", "shape": [1, 8], "datatype": "FP32"}, 'has no "data"'),
        ({"name": "features", "shape": [-1, 8], "datatype": "FP32", "data": [0.5] * 8}, "non-negative integers"),
        ({"name": "other", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}, "unknown input 'other'"),
    ],
)
def test_open_inference_protocol_requests_that_do_not_fit_are_400(server, tensor, message):
    status, body = infer_json(server, {"inputs": [tensor]})
    assert status == 400 and re.search(message, body["error"]), body


def test_bad_json_unknown_routes_and_models_and_oversized_bodies(server):
    status, body = request(server, "POST", "/predict", b'{"inputs": [1, 2', {"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in body["error"]
    assert request(server, "POST", "/v2/models/net/infer", b"\xff\xfe")[0] == 400
    status, body = request(server, "POST", "/predict", b"[" * 4000)  # nesting deeper than the parser's stack
    assert status == 400 and "RecursionError" in body["error"]
    assert infer_json(server, {"inputs": []}, model="other")[0] == 404
    assert request(server, "GET", "/nowhere")[0] == 404
    assert request(server, "GET", "/predict")[0] == 405
    assert request(server, "GET", "/v2/models/net/versions/99")[0] == 404
    payload = json.dumps({"inputs": {"features": [[0.5] * 8] * 200}}).encode()
    assert len(payload) > 4096
    status, body = request(server, "POST", "/predict", payload)
    assert status == 413 and "at most 4096" in body["error"]

    def chunks():
        for _ in range(10):
            yield b"[" + b"0.5," * 200

    status, body = request(server, "POST", "/v2/models/net/infer", chunks(), {"Transfer-Encoding": "chunked"})
    assert status == 413 and "more than 4096" in body["error"]
    # an empty body (no Content-Length) is bad JSON, answered at once
    host, port = server.server_address
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        sock.sendall(b"POST /predict HTTP/1.0\r\nHost: x\r\n\r\n")
        assert sock.recv(1024).decode().startswith("HTTP/1.1 400")
    assert request(server, "GET", "/v2/health/live") == (200, {"live": True})  # still serving


def _slow(model, seconds: float, calls: list[int]):
    def run(inputs):
        calls.append(int(next(iter(inputs.values())).shape[0]))
        time.sleep(seconds)
        return model(inputs)

    return run


def _concurrently(srv, n: int, rows: torch.Tensor) -> list[tuple[int, dict]]:
    results: list[tuple[int, dict]] = [(0, {})] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        barrier.wait(TIMEOUT)
        results[i] = predict(srv, {"inputs": {"features": rows[i : i + 1].tolist()}})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * TIMEOUT)
    return results


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_requests_are_batched_and_answered_each_with_its_own_rows(exported, batching):
    out_dir, x = exported
    srv = make_server(out_dir, "127.0.0.1", 0, max_batch=16, batching=batching, window_ms=50).start()
    try:
        calls: list[int] = []
        srv.app.batcher.model = _slow(srv.app.batcher.model, 0.05, calls)
        results = _concurrently(srv, 8, x)
        want = load_exported(out_dir)({"features": x[:8]})
        for i, (status, body) in enumerate(results):
            assert status == 200, body
            torch.testing.assert_close(torch.tensor(body["outputs"]["logits"][0]), want["logits"][i], rtol=0, atol=1e-6)
        assert sum(calls) == 8
        assert (len(calls) < 8) if batching else (calls == [1] * 8), calls
        metrics = raw_request(srv, "GET", "/metrics")[1].decode()
        assert f"stoker_serve_batch_requests_count {float(len(calls))}" in metrics
        assert "stoker_serve_batch_rows_sum 8.0" in metrics
        assert 'stoker_serve_requests_total{code="200",route="predict"} 8.0' in metrics
        assert 'stoker_serve_request_seconds_count{route="predict"} 8.0' in metrics
    finally:
        srv.stop()


def test_a_flood_past_max_pending_gets_503_and_the_server_keeps_serving(exported):
    out_dir, x = exported
    srv = make_server(out_dir, "127.0.0.1", 0, max_pending=2).start()
    try:
        srv.app.batcher.model = _slow(srv.app.batcher.model, 0.3, [])
        results = _concurrently(srv, 12, x)
        codes = sorted(status for status, _ in results)
        assert set(codes) == {200, 503} and 2 <= codes.count(200) <= 8, codes
        assert all("retry later" in body["error"] for status, body in results if status == 503)
        assert predict(srv, {"inputs": {"features": x[:1].tolist()}})[0] == 200
        metrics = raw_request(srv, "GET", "/metrics")[1].decode()
        assert f'stoker_serve_requests_total{{code="503",route="predict"}} {float(codes.count(503))}' in metrics
    finally:
        srv.stop()


def test_validate_inputs_checks_integer_dtypes_and_batch_agreement():
    sig = {
        "inputs": [
            {"name": "tokens", "dtype": "int64", "shape": ["batch", 4]},
            {"name": "mask", "dtype": "float32", "shape": ["batch", 4]},
        ]
    }
    ok = validate_inputs({"inputs": {"tokens": [[1, 2, 3, 4]], "mask": [[1, 1, 0, 0]]}}, sig)
    assert ok["tokens"].dtype == torch.int64 and ok["mask"].dtype == torch.float32
    with pytest.raises(RequestError, match="must hold int64 values; got floats"):
        validate_inputs({"inputs": {"tokens": [[1.5, 2, 3, 4]], "mask": [[1, 1, 0, 0]]}}, sig)
    with pytest.raises(RequestError, match="same batch size"):
        validate_inputs({"inputs": {"tokens": [[1, 2, 3, 4]] * 2, "mask": [[1, 1, 0, 0]]}}, sig)
    small = {"inputs": [{"name": "b", "dtype": "uint8", "shape": [1]}]}
    with pytest.raises(RequestError, match="outside the range of uint8"):
        validate_inputs({"inputs": {"b": [300]}}, small)


def test_the_command_refuses_bad_flags_with_2_and_a_non_export_with_1(tmp_path, capsys):
    from stoker.cli import main

    assert main(["serve", str(tmp_path), "--max_pending", "0"]) == 2
    assert "--max_pending must be an integer >= 1; got 0" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--batch_window_ms", "-1"]) == 2
    assert main(["serve", str(tmp_path), "--port", "0"]) == 1
    assert "is not a stoker export" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--aot", "--port", "0"]) == 1


def test_stoker_serve_as_a_process_answers_at_once_and_stops_on_sigterm(exported):
    import re
    import signal
    import subprocess

    from helpers.processes import PYTHON, popen, python_env

    proc = popen(
        [PYTHON, "-m", "stoker", "serve", str(exported[0]), "--port", "0"],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        found = re.search(r"as model 'net' on http://127\.0\.0\.1:(\d+)", line)
        assert found, line
        conn = http.client.HTTPConnection("127.0.0.1", int(found.group(1)), timeout=TIMEOUT)
        conn.request("GET", "/v2/health/ready")  # the printed port accepts at once
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)


def test_large_bodies_are_decoded_off_the_event_loop_with_the_same_answers(exported):
    out_dir, x = exported
    srv = make_server(out_dir, "127.0.0.1", 0, max_batch=256).start()
    try:
        rows = x.repeat(8, 1)  # 256 rows
        body = json.dumps({"inputs": {"features": rows.tolist()}}, indent=8).encode()
        assert len(body) > 64 * 2**10  # past OFF_LOOP_BYTES: decoded in a worker thread
        status, answer = request(srv, "POST", "/predict", body)
        assert status == 200 and answer["batch"] == 256
        want = load_exported(out_dir)({"features": rows})
        assert answer["outputs"]["classes"] == want["classes"].tolist()
        bad = json.dumps({"inputs": {"features": rows[:, :5].tolist()}}, indent=12).encode()
        assert len(bad) > 64 * 2**10
        status, answer = request(srv, "POST", "/predict", bad)
        assert status == 400 and "dimension 1 must be 8" in answer["error"]
    finally:
        srv.stop()
