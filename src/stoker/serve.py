"""A small HTTP JSON endpoint around an export directory's ``model.pt2`` (a serving check).

Standard library only (``http.server.ThreadingHTTPServer``, one thread per connection)::

    stoker serve exported/net --port 8000
    curl -s localhost:8000/healthz
    curl -s localhost:8000/predict -d '{"inputs": {"features": [[0.1, 0.2, ...]]}}'

Endpoints:

- ``GET /healthz``: ``{"status": "ok", "model": ..., "global_step": ...}``.
- ``GET /signature``: the export's ``signature.json``.
- ``POST /predict`` with ``{"inputs": {name: nested lists}}`` -> ``{"outputs": {name: nested
  lists}, "batch": n}``. Every input of the signature is required; shapes and dtypes must
  match it (``"batch"`` marks the dynamic first dimension, the same for every input).

Errors are JSON ``{"error": message}``, with the expected inputs added for a bad request:
400 (bad JSON, wrong names / shapes / dtypes, a batch over ``max_batch``), 411 (no
Content-Length), 413 (a body over ``max_body_bytes``, refused before it is read), 404/405,
500 (the model raised). It is a check that an export serves, not a production server: no
TLS, no authentication, no batching across requests; it binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch

from .errors import StokerError
from .export import BATCH, ExportedModel, load_exported

log = logging.getLogger("stoker")

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
DEFAULT_MAX_BATCH = 256
DISCARD_BYTES = 2**20  # of an oversized body, read and dropped after the 413 (see _read_body)
SOCKET_TIMEOUT_S = 30.0  # a client that stops sending mid-request frees its thread after this

_FLOAT_KINDS, _INT_KINDS, _BOOL_KINDS = "iuf", "iu", "b"  # numpy dtype kinds each input dtype accepts


class RequestError(ValueError):
    """A request that does not fit the signature; the message says what was expected."""


def validate_inputs(body: Any, signature: Mapping[str, Any], max_batch: int = DEFAULT_MAX_BATCH) -> dict[str, torch.Tensor]:
    """Check a decoded ``/predict`` body against the export's signature; return input tensors.

    Raises ``RequestError`` naming the first problem (a missing or unknown input, a ragged or
    non-numeric array, the wrong number of dimensions, a size other than the signature's, a
    float where integers are expected, batches of different sizes, a batch over ``max_batch``).
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("inputs"), Mapping):
        raise RequestError('the body must be a JSON object {"inputs": {name: nested lists}}')
    inputs = body["inputs"]
    expected = {i["name"]: i for i in signature["inputs"]}
    missing = [n for n in expected if n not in inputs]
    unknown = [n for n in inputs if n not in expected]
    if missing or unknown:
        raise RequestError(f"inputs must be exactly {list(expected)}; missing {missing}, unknown {unknown}")
    tensors: dict[str, torch.Tensor] = {}
    batch: int | None = None
    for name, spec in expected.items():
        try:
            array = np.asarray(inputs[name])
        except ValueError as e:  # numpy refuses ragged nested lists
            raise RequestError(f"input {name!r} is not a rectangular array ({e})") from e
        want_shape = spec["shape"]
        if array.ndim != len(want_shape):
            raise RequestError(f"input {name!r} has {array.ndim} dimensions {list(array.shape)}; expected {len(want_shape)}: {want_shape}")
        for axis, (got, want) in enumerate(zip(array.shape, want_shape, strict=True)):
            if want != BATCH and got != want:
                raise RequestError(f"input {name!r} has shape {list(array.shape)}; expected {want_shape} (dimension {axis} must be {want})")
        dtype = getattr(torch, spec["dtype"])
        kinds = _BOOL_KINDS if dtype == torch.bool else (_FLOAT_KINDS if dtype.is_floating_point else _INT_KINDS)
        if array.size and array.dtype.kind not in kinds:
            found = {"f": "floats", "b": "booleans", "i": "integers", "u": "integers"}.get(array.dtype.kind, "non-numbers")
            raise RequestError(f"input {name!r} must hold {spec['dtype']} values; got {found}")
        if want_shape and want_shape[0] == BATCH:
            rows = int(array.shape[0])
            if batch is not None and rows != batch:
                raise RequestError(f"every input needs the same batch size; {name!r} has {rows}, an earlier input {batch}")
            batch = rows
        if array.size and array.dtype.kind in _INT_KINDS and not dtype.is_floating_point and dtype != torch.bool:
            info = torch.iinfo(dtype)
            if int(array.min()) < info.min or int(array.max()) > info.max:
                raise RequestError(f"input {name!r} has values outside the range of {spec['dtype']} [{info.min}, {info.max}]")
        try:
            tensors[name] = torch.as_tensor(array).to(dtype)
        except (TypeError, RuntimeError, OverflowError) as e:
            raise RequestError(f"input {name!r} cannot be converted to {spec['dtype']}: {e}") from e
    if batch is not None and not 1 <= batch <= max_batch:
        raise RequestError(f"the batch has {batch} rows; this server accepts 1 to {max_batch}")
    return tensors


class PredictServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` holding the loaded export and the request limits."""

    daemon_threads = True  # a hung client connection never keeps the process alive

    def __init__(self, address: tuple[str, int], model: ExportedModel, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(address, _Handler)
        self.model = model
        self.max_body_bytes = max_body_bytes
        self.max_batch = max_batch
        self.requests_served = 0
        self._count_lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: PredictServer
    server_version = "stoker-serve"
    timeout = SOCKET_TIMEOUT_S

    # ---------------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
        sig = self.server.model.signature
        if self.path == "/healthz":
            self._reply(HTTPStatus.OK, {"status": "ok", "model": str(self.server.model.path),
                                        "global_step": sig.get("global_step"), "requests_served": self.server.requests_served})
        elif self.path == "/signature":
            self._reply(HTTPStatus.OK, sig)
        elif self.path == "/predict":
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "use POST /predict"})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}; use POST /predict, GET /healthz or GET /signature"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/predict":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}; use POST /predict"})
            return
        body = self._read_body()
        if body is None:
            return
        try:
            decoded = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: absurd nesting
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"the body is not valid JSON: {type(e).__name__}: {e}"})
            return
        signature = self.server.model.signature
        try:
            inputs = validate_inputs(decoded, signature, self.server.max_batch)
        except RequestError as e:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": str(e), "expected": signature["inputs"]})
            return
        try:
            outputs = self.server.model(inputs)
        except Exception as e:  # noqa: BLE001 - report any model failure to the client as a 500
            log.exception("serve: the model failed on a request")
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"the model failed: {type(e).__name__}: {e}"})
            return
        with self.server._count_lock:
            self.server.requests_served += 1
        rows = next(iter(inputs.values())).shape[0] if inputs else 0
        self._reply(HTTPStatus.OK, {"outputs": {k: v.tolist() for k, v in outputs.items()}, "batch": rows})

    # ---------------------------------------------------------------- helpers
    def _read_body(self) -> bytes | None:
        """The request body, or ``None`` after replying with an error (the body unread)."""
        length = self.headers.get("Content-Length")
        if length is None or self.headers.get("Transfer-Encoding"):
            self._reply(HTTPStatus.LENGTH_REQUIRED, {"error": "send the body with a Content-Length header (no chunked encoding)"})
            return None
        try:
            size = int(length)
        except ValueError:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"Content-Length {length!r} is not a number"})
            return None
        if size < 0:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"Content-Length {size} is negative"})
            return None
        if size > self.server.max_body_bytes:
            # Refused before reading it into memory. Then up to DISCARD_BYTES of it are read and
            # dropped: closing a socket with unread data makes TCP reset the connection, and the
            # client would see "connection reset" instead of this reply.
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        {"error": f"the body has {size} bytes; this server accepts at most {self.server.max_body_bytes}"})
            self._discard(min(size, DISCARD_BYTES))
            return None
        body = self.rfile.read(size)
        if len(body) < size:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"the body ended after {len(body)} of {size} bytes"})
            return None
        return body

    def _discard(self, size: int) -> None:
        try:
            while size > 0:
                chunk = self.rfile.read(min(size, 65536))
                if not chunk:
                    return
                size -= len(chunk)
        except OSError:  # the client gave up or the socket timed out: nothing left to protect
            return

    def _reply(self, status: HTTPStatus, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("serve %s: " + format, self.address_string(), *args)


def make_server(export_dir: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8000, *,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_batch: int = DEFAULT_MAX_BATCH) -> PredictServer:
    """Load ``export_dir`` and bind a server to ``host:port`` (``port=0``: one the OS picks);
    call ``serve_forever()`` on the result (and ``shutdown()`` from another thread to stop)."""
    if max_body_bytes < 1 or max_batch < 1:
        raise ValueError(f"max_body_bytes and max_batch must be >= 1; got {max_body_bytes}, {max_batch}")
    return PredictServer((host, port), load_exported(export_dir), max_body_bytes=max_body_bytes, max_batch=max_batch)


# ==================================================================== command line
def add_parser(subparsers: Any) -> None:
    """Register ``stoker serve EXPORT_DIR --port P``."""
    p = subparsers.add_parser(
        "serve",
        help="serve an export directory's model.pt2 over HTTP JSON (POST /predict, GET /healthz)",
        description="A small HTTP JSON endpoint (standard library) for checking an export: "
        'POST /predict {"inputs": {name: nested lists}} -> {"outputs": {...}}.',
    )
    p.add_argument("export_dir", help="a directory written by stoker export")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port, printed at start)")
    p.add_argument("--max_body_bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger requests get 413")
    p.add_argument("--max_batch", type=int, default=DEFAULT_MAX_BATCH, help="most rows one request may send")
    p.set_defaults(func=_serve_command)


def _serve_command(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        print(f"stoker serve: --port must be in 0..65535; got {args.port}", file=sys.stderr)
        return 2
    try:
        server = make_server(args.export_dir, args.host, args.port, max_body_bytes=args.max_body_bytes, max_batch=args.max_batch)
    except (StokerError, ValueError, OSError) as e:
        print(f"stoker serve: {e}", file=sys.stderr)
        return 1
    names = ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in server.model.signature["inputs"])
    print(f"serving {args.export_dir} on {server.url} (POST /predict with inputs {names}; GET /healthz)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


__all__ = ["PredictServer", "RequestError", "add_parser", "make_server", "validate_inputs"]
