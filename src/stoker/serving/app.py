"""The ASGI application of ``stoker serve`` (Starlette): Open Inference Protocol routes, stoker's
own ``/predict`` alias, request limits, dynamic batching and Prometheus metrics.

It serves one loaded export (:class:`~stoker.export.ExportedModel`: the ``torch.export``
program or the AOTInductor package alike). A request goes through four bounds, each with its
own answer, so that slow or greedy clients cannot starve the others:

1. **upload**: the body is read first, before the request takes any other place in the server,
   by at most ``max_uploading`` requests at once (503). It must arrive within
   ``body_timeout_s`` and keep an average of ``min_upload_bytes_per_s`` after the first
   second (408), and fit ``max_body_bytes`` (413). The bytes of all bodies held (arriving, or
   waiting to be decoded) stay within ``max_buffered_bytes`` (503).
2. **admission**: only a request whose body has arrived is admitted, up to ``max_pending`` at
   once (503 with ``Retry-After``): a client that drips its body holds an upload place, never
   an admission slot.
3. **decoding**: at most ``max_decoding`` bodies over 64 KiB are decoded (and answers encoded)
   at once, in a worker thread: JSON parsing holds the GIL, so more threads would only queue
   for it, and each parse multiplies its body's size in memory.
4. **batching**: decoded requests go through :class:`~stoker.serving.batcher.DynamicBatcher`.

Every error answer is JSON ``{"error": message}``. The connection-level limits (header size and
time, idle connections, how many connections) are in :mod:`stoker.serving.connection`; the
server around it is in :mod:`stoker.serving.server`. See docs/export.md, "Security".
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._version import __version__
from ..errors import ConfigError, StokerError
from ..export.program import BATCH, ExportedModel
from .batcher import BatchingConfig, DynamicBatcher, Saturated
from .limits import (
    BODY_TIMEOUT_S,
    BUFFERED_BODIES,
    DISCARD_BYTES,
    MAX_DECODING,
    MAX_UPLOADING,
    MIN_UPLOAD_BYTES_PER_S,
    OFF_LOOP_BYTES,
    UPLOAD_GRACE_S,
)
from .protocol import (
    InferRequest,
    RequestError,
    decode_infer_request,
    decode_json,
    default_max_body_bytes,
    encode_infer_response,
    json_values,
    model_metadata,
    model_version,
    public_signature,
    validate_inputs,
)

log = logging.getLogger("stoker")


@dataclass(kw_only=True)
class ServeConfig:
    """The server's limits and its batching; ``model_name`` defaults to the export directory's name.

    ``max_body_bytes=None`` derives the limit from the export's signature and ``max_batch``
    (:func:`~stoker.serving.protocol.default_max_body_bytes`); ``max_buffered_bytes=None`` is
    ``BUFFERED_BODIES`` times the body limit. ``show_paths`` lets ``/healthz`` and ``/signature``
    name the export's and checkpoint's paths (off: their names only).
    """

    model_name: str | None = None
    max_body_bytes: int | None = None
    body_timeout_s: float = BODY_TIMEOUT_S
    min_upload_bytes_per_s: float = MIN_UPLOAD_BYTES_PER_S
    max_uploading: int = MAX_UPLOADING
    max_buffered_bytes: int | None = None
    max_decoding: int = MAX_DECODING
    show_paths: bool = False
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_buffered_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 (or None: derived); got {value}")
        for name in ("max_uploading", "max_decoding"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.body_timeout_s <= 0 or self.min_upload_bytes_per_s < 0:
            raise ConfigError(
                "body_timeout_s must be > 0 and min_upload_bytes_per_s >= 0; got "
                f"{self.body_timeout_s}, {self.min_upload_bytes_per_s}"
            )

    def resolved(self, signature: dict[str, Any]) -> ServeConfig:
        """A copy with the derived limits filled in from ``signature``."""
        body = self.max_body_bytes or default_max_body_bytes(signature, self.batching.max_batch)
        buffered = self.max_buffered_bytes or BUFFERED_BODIES * body
        return dataclasses.replace(self, max_body_bytes=body, max_buffered_bytes=max(buffered, body))


class ServeMetrics:
    """The Prometheus series of one server, in its own registry (several servers in one process stay apart)."""

    ROUTES = ("infer", "predict", "metadata", "health", "metrics", "other")

    def __init__(self, max_batch: int) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "stoker_serve_requests",
            "HTTP requests answered, by route and status code",
            ["route", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "stoker_serve_request_seconds",
            "time from request to the end of the answer, by route",
            ["route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        rows = [float(2**i) for i in range(max_batch.bit_length())] + (
            [float(max_batch)] if max_batch & (max_batch - 1) else []
        )
        self.batch_rows = Histogram(
            "stoker_serve_batch_rows", "rows of each model call", registry=self.registry, buckets=rows
        )
        self.batch_requests = Histogram(
            "stoker_serve_batch_requests",
            "requests grouped into each model call",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.model_seconds = Histogram("stoker_serve_model_seconds", "time of each model call", registry=self.registry)
        self.pending = Gauge(
            "stoker_serve_pending_requests", "requests admitted (decoding, queued or running)", registry=self.registry
        )
        self.uploading = Gauge(
            "stoker_serve_uploading_requests", "requests whose body is still arriving", registry=self.registry
        )
        self.buffered = Gauge(
            "stoker_serve_buffered_bytes", "bytes of request bodies held (arriving or waiting to be decoded)",
            registry=self.registry,
        )  # fmt: skip
        self.closed = Counter(
            "stoker_serve_connections_closed",
            "connections the server closed before a request was complete, by reason",
            ["reason"],
            registry=self.registry,
        )

    def observe_batch(self, rows: int, requests: int, seconds: float) -> None:
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)
        self.model_seconds.observe(seconds)

    @staticmethod
    def route_of(path: str) -> str:
        if path.endswith("/infer"):
            return "infer"
        if path == "/predict":
            return "predict"
        if path.startswith("/v2/health") or path == "/healthz" or path.endswith("/ready"):
            return "health"
        if path.startswith("/v2") or path == "/signature":
            return "metadata"
        return "metrics" if path == "/metrics" else "other"


class _Counted:
    """ASGI middleware: counts every answer (404s included) and times it, by route."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            route = self.metrics.route_of(scope["path"])
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)


class _Refused(StokerError):
    """An answer other than 200, with its status and JSON payload (raised in a route, turned into
    the response by ``ServeApp._refused``; it never leaves the server)."""

    def __init__(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(payload.get("error"))
        self.status, self.payload, self.headers = status, payload, headers


def _error(status: int, message: str, **extra: Any) -> _Refused:
    return _Refused(status, {"error": message, **extra})


@dataclass
class _Upload:
    """A body being read: its chunks, their size, the bytes it holds of ``max_buffered_bytes``."""

    held: int
    size: int = 0
    chunks: list[bytes] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)


def _busy(message: str, close: bool = False) -> _Refused:
    """A 503 for a bound the server is at: the client may retry shortly."""
    headers = {"Retry-After": "1", **_CLOSE} if close else {"Retry-After": "1"}
    return _Refused(503, {"error": f"{message}; retry later"}, headers)


# On an answer given before the body was read to its end: the connection closes after it, so
# uvicorn stops reading (and parsing) the rest of a body nobody will use.
_CLOSE = {"Connection": "close"}


def _cut(status: int, message: str) -> _Refused:
    return _Refused(status, {"error": message}, dict(_CLOSE))


class ServeApp:
    """The routes over one loaded export; ``app`` is the ASGI application to run."""

    def __init__(self, model: ExportedModel, config: ServeConfig) -> None:
        self.model = model
        self.config = config = config.resolved(model.signature)
        self.signature = model.signature
        self.uploading = 0  # requests whose body is being read
        self.buffered = 0  # bytes of bodies held: arriving, or read and not yet decoded
        self.decoding = asyncio.Semaphore(config.max_decoding)
        self.name = config.model_name or model.path.name
        self.platform = "pytorch_aotinductor" if model.kind == "aot" else "pytorch_torch_export"
        self.max_batch = config.batching.max_batch
        self.metrics = ServeMetrics(self.max_batch)
        self.metrics.pending.set_function(lambda: self.batcher.admitted)
        self.metrics.uploading.set_function(lambda: self.uploading)
        self.metrics.buffered.set_function(lambda: self.buffered)
        self.batcher = DynamicBatcher(
            model, config.batching, can_batch=can_batch(self.signature), observe=self.metrics.observe_batch
        )
        self.requests_served = 0
        v2 = "/v2/models/{name}"
        routes = [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route(v2, self.metadata),
            Route(v2 + "/versions/{version}", self.metadata),
            Route(v2 + "/ready", self.model_ready),
            Route(v2 + "/versions/{version}/ready", self.model_ready),
            Route(v2 + "/infer", self.infer, methods=["POST"]),
            Route(v2 + "/versions/{version}/infer", self.infer, methods=["POST"]),
            Route("/healthz", self.healthz),
            Route("/signature", self.signature_route),
            Route("/predict", self.predict, methods=["POST"]),
            Route("/metrics", self.metrics_route),
        ]
        starlette = Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers={HTTPException: self._http_error, _Refused: self._refused},
        )
        self.app: ASGIApp = _Counted(starlette, self.metrics)

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> Any:
        await self.batcher.start()
        try:
            yield
        finally:
            await self.batcher.stop()

    # ---------------------------------------------------------------- health and metadata
    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        return JSONResponse({"ready": True})  # the model is loaded before the server binds

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse({"name": "stoker", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def metadata(self, request: Request) -> Response:
        self._check_model(request)
        return JSONResponse(model_metadata(self.signature, self.name, self.platform))

    async def model_ready(self, request: Request) -> Response:
        self._check_model(request)
        return JSONResponse({"name": self.name, "ready": True})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "model": str(self.model.path) if self.config.show_paths else self.name,
                "kind": self.model.kind,
                "global_step": self.signature.get("global_step"),
                "requests_served": self.requests_served,
            }
        )

    async def signature_route(self, request: Request) -> Response:
        return JSONResponse(self.signature if self.config.show_paths else public_signature(self.signature))

    async def metrics_route(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ---------------------------------------------------------------- inference
    async def infer(self, request: Request) -> Response:
        """``POST /v2/models/{name}/infer``: the Open Inference Protocol, JSON or binary tensors."""
        self._check_model(request)
        header_length = request.headers.get("inference-header-content-length")

        def decode(body: bytes) -> tuple[dict[str, Any], InferRequest]:
            decoded = decode_infer_request(body, header_length, self.signature, self.max_batch)
            return decoded.inputs, decoded

        def encode(decoded: InferRequest, outputs: dict[str, Any]) -> tuple[bytes, int | None]:
            return encode_infer_response(decoded, outputs, self.signature, self.name)

        answer, json_length = await self._run(request, decode, encode)
        headers = {} if json_length is None else {"Inference-Header-Content-Length": str(json_length)}
        return Response(
            answer,
            media_type="application/json" if json_length is None else "application/octet-stream",
            headers=headers,
        )

    async def predict(self, request: Request) -> Response:
        """``POST /predict``: stoker's own JSON shape, kept as an alias of ``/infer``."""

        def decode(body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
            inputs = validate_inputs(decode_json(body), self.signature, self.max_batch)
            return inputs, inputs

        def encode(inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple[bytes, None]:
            rows = next(iter(inputs.values())).shape[0] if inputs else 0
            payload = {"outputs": {k: json_values(v.cpu().numpy()) for k, v in outputs.items()}, "batch": int(rows)}
            return json.dumps(payload, allow_nan=False).encode(), None

        answer, _ = await self._run(request, decode, encode)
        return Response(answer, media_type="application/json")

    async def _run(
        self,
        request: Request,
        decode: Callable[[bytes], tuple[dict[str, Any], Any]],
        encode: Callable[[Any, dict[str, Any]], tuple[bytes, int | None]],
    ) -> tuple[bytes, int | None]:
        """Read the body, admit, decode (``decode(body) -> (inputs, what encode needs)``), batch,
        run, encode."""
        body = await self._read_body(request)  # before admission: a slow body holds no slot
        size = len(body)
        try:
            async with self.batcher.slot():
                try:
                    inputs, decoded = await self._off_loop(size, decode, body)
                except RequestError as e:
                    raise _error(400, str(e), expected=self.signature["inputs"]) from e
                finally:
                    self.buffered -= len(body)  # decoded (or refused): its bytes are no longer held
                    body = b""
                rows = next(iter(inputs.values())).shape[0] if inputs else 0
                try:
                    outputs = await self.batcher.infer(inputs, int(rows))
                except Saturated:  # shutting down: the outer handler answers 503
                    raise
                except Exception as e:  # noqa: BLE001 - any model failure is the server's 500
                    raise _error(500, f"the model failed: {type(e).__name__}: {e}") from e
                answer = await self._off_loop(size, encode, decoded, outputs)
        except Saturated as e:
            raise _Refused(503, {"error": str(e)}, {"Retry-After": "1"}) from e
        finally:
            self.buffered -= len(body)  # refused at admission: never decoded
        self.requests_served += 1
        return answer

    async def _off_loop(self, size: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; for a large request in a worker thread, at most ``max_decoding`` at once,
        so that parsing megabytes of JSON neither holds up the event loop (health checks, other
        requests' reading) nor runs many parses, each many times its body in memory, at once."""
        if size <= OFF_LOOP_BYTES:
            return fn(*args)  # small: a thread hop would cost more than the work
        async with self.decoding:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _read_body(self, request: Request) -> bytes:
        """The body: at most ``max_body_bytes`` (413), within ``body_timeout_s`` and at
        ``min_upload_bytes_per_s`` after the first second (408), while fewer than
        ``max_uploading`` bodies are arriving and the bodies held fit ``max_buffered_bytes``
        (503). A body of declared length holds its whole length from the start (so the first
        ones to come are read whole, rather than all of them half); a chunked one holds its bytes
        as they arrive. They count as held (``self.buffered``) until the caller releases them."""
        config = self.config
        assert config.max_body_bytes is not None and config.max_buffered_bytes is not None  # resolved
        declared = await self._declared_length(request)
        upload = _Upload(held=declared or 0)
        if self.uploading >= config.max_uploading or self.buffered + upload.held > config.max_buffered_bytes:
            await self._discard(request, upload.held)
            bound = "--max_uploading" if self.uploading >= config.max_uploading else "--max_buffered_bytes"
            raise _busy(f"{self.uploading} bodies are arriving, {self.buffered} bytes held: at {bound}", close=True)
        self.uploading += 1
        self.buffered += upload.held
        stream = request.stream().__aiter__()
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(stream.__anext__(), self._patience(upload))
                except StopAsyncIteration:
                    break
                upload.size += len(chunk)
                if upload.size > config.max_body_bytes:  # a chunked body: counted as it arrives
                    await _drain(stream)
                    limit = config.max_body_bytes
                    raise _cut(413, f"the body has more than {limit} bytes; this server accepts at most {limit}")
                if upload.size > upload.held:  # chunked: hold what arrives, within the bound
                    if self.buffered + upload.size - upload.held > config.max_buffered_bytes:
                        await _drain(stream)
                        raise _busy(f"the bodies held fill --max_buffered_bytes ({config.max_buffered_bytes})", True)
                    self.buffered += upload.size - upload.held
                    upload.held = upload.size
                upload.chunks.append(chunk)
        except asyncio.TimeoutError:  # noqa: UP041 - a distinct class before Python 3.11
            self.buffered -= upload.held
            raise self._too_slow(upload) from None
        except ClientDisconnect:  # nobody will read the answer; this ends the request quietly
            self.buffered -= upload.held
            raise _error(400, "the client disconnected before sending the whole body") from None
        except BaseException:
            self.buffered -= upload.held
            raise
        finally:
            self.uploading -= 1
        self.buffered -= upload.held - upload.size  # a declared length the body did not reach (h11 refuses that)
        return b"".join(upload.chunks)

    async def _declared_length(self, request: Request) -> int | None:
        """The body's ``Content-Length`` (``None``: chunked); 400 if it is not a number, 413 (from
        the header, the body unread) over ``max_body_bytes``."""
        length = request.headers.get("content-length")
        if length is None:
            return None
        if not length.isdigit():
            raise _error(400, f"Content-Length {length!r} is not a non-negative number")
        limit = self.config.max_body_bytes
        assert limit is not None
        if int(length) > limit:
            await self._discard(request, int(length))
            raise _cut(413, f"the body has {length} bytes; this server accepts at most {limit}")
        return int(length)

    def _too_slow(self, upload: _Upload) -> _Refused:
        elapsed = time.monotonic() - upload.start
        if elapsed >= self.config.body_timeout_s:
            return _cut(408, f"the body did not arrive within {self.config.body_timeout_s:g} s")
        return _cut(
            408,
            f"the body arrives too slowly ({upload.size} bytes in {elapsed:.1f} s; this server needs "
            f"{self.config.min_upload_bytes_per_s:g} bytes/s after the first {UPLOAD_GRACE_S:g} s)",
        )

    def _patience(self, upload: _Upload) -> float:
        """How long to wait for the next chunk of ``upload``: until its total time limit, or until
        its average rate falls below the minimum."""
        now = time.monotonic()
        total = upload.start + self.config.body_timeout_s - now
        rate = self.config.min_upload_bytes_per_s
        if rate <= 0:
            return max(total, 0.0)
        # size >= rate * (t - start - grace) holds until t = start + grace + size / rate
        slow = upload.start + UPLOAD_GRACE_S + (upload.size + 1) / rate - now
        return max(min(total, slow), 0.0)

    @staticmethod
    async def _discard(request: Request, length: int) -> None:
        """Read and drop up to ``DISCARD_BYTES`` of a body refused unread (see ``_drain``)."""
        try:
            await _drain(request.stream().__aiter__(), raise_disconnect=True)
        except ClientDisconnect:  # one line, not a traceback: the client will not read the 413
            client = request.client
            log.warning(
                "stoker serve: a client%s disconnected before its 413 (a body of %d bytes) was sent",
                "" if client is None else f" on port {client.port}",
                length,
            )

    def _check_model(self, request: Request) -> None:
        name, version = request.path_params.get("name"), request.path_params.get("version")
        if name != self.name:
            raise _error(404, f"no model {name!r}; this server serves {self.name!r}")
        if version is not None and version != model_version(self.signature):
            raise _error(404, f"model {name!r} has no version {version!r}; it has {model_version(self.signature)!r}")

    # ---------------------------------------------------------------- error answers
    async def _refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return JSONResponse(exc.payload, status_code=exc.status, headers=exc.headers)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        routes = "GET /v2/health/live, /v2/health/ready, /v2/models/{name}, POST /v2/models/{name}/infer, POST /predict"
        message = (
            f"no route {request.method} {request.url.path}; routes: {routes}"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


async def _drain(stream: Any, raise_disconnect: bool = False) -> None:
    """Read and drop up to ``DISCARD_BYTES`` more of a refused body, for at most 2 s: closing a
    socket with unread data makes TCP reset it, and the client would see "connection reset"
    instead of the answer. Beyond that the connection is closed (``Connection: close``)."""

    async def drop() -> None:
        dropped = 0
        async for chunk in stream:
            dropped += len(chunk)
            if dropped >= DISCARD_BYTES:
                return

    try:
        await asyncio.wait_for(drop(), 2.0)
    except (asyncio.TimeoutError, OSError):  # noqa: UP041 - the client stopped sending: nothing to protect
        return
    except ClientDisconnect:
        if raise_disconnect:
            raise


def can_batch(signature: dict[str, Any]) -> bool:
    """Whether requests can be concatenated: every input and output has the dynamic batch first."""
    tensors = [*signature["inputs"], *signature["outputs"]]
    return bool(signature.get("dynamic_batch")) and all(t["shape"] and t["shape"][0] == BATCH for t in tensors)


__all__ = ["ServeApp", "ServeConfig", "ServeMetrics", "can_batch"]
