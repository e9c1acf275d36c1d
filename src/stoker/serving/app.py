"""The ASGI application of ``stoker serve`` (Starlette): Open Inference Protocol routes, stoker's
own ``/predict`` alias, request limits, dynamic batching and Prometheus metrics.

It serves one loaded export (:class:`~stoker.export.ExportedModel`: the ``torch.export``
program or the AOTInductor package alike). Request bodies are read with a size limit (413)
and a time limit (408); a request is admitted (or refused with 503) before its body is
decoded; decoded requests go through :class:`~stoker.serving.batcher.DynamicBatcher`. Every
error answer is JSON ``{"error": message}``. The server around it is in :mod:`stoker.serving.server`.
"""

from __future__ import annotations

import asyncio
import json
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
from .protocol import (
    DEFAULT_MAX_BODY_BYTES,
    InferRequest,
    RequestError,
    decode_infer_request,
    decode_json,
    encode_infer_response,
    model_metadata,
    model_version,
    validate_inputs,
)

DISCARD_BYTES = 2**20  # of an oversized body, read and dropped before the 413 (see _read_body)
BODY_TIMEOUT_S = 30.0  # a client that stops sending mid-body gets 408 after this
OFF_LOOP_BYTES = 64 * 2**10  # bodies larger than this are decoded (and answered) in a worker thread


@dataclass(kw_only=True)
class ServeConfig:
    """The server's limits and its batching; ``model_name`` defaults to the export directory's name."""

    model_name: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.body_timeout_s <= 0:
            raise ConfigError(
                f"max_body_bytes must be >= 1 and body_timeout_s > 0; got {self.max_body_bytes}, {self.body_timeout_s}"
            )


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


class ServeApp:
    """The routes over one loaded export; ``app`` is the ASGI application to run."""

    def __init__(self, model: ExportedModel, config: ServeConfig) -> None:
        self.model = model
        self.config = config
        self.signature = model.signature
        self.name = config.model_name or model.path.name
        self.platform = "pytorch_aotinductor" if model.kind == "aot" else "pytorch_torch_export"
        self.max_batch = config.batching.max_batch
        self.metrics = ServeMetrics(self.max_batch)
        self.metrics.pending.set_function(lambda: self.batcher.admitted)
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
                "model": str(self.model.path),
                "kind": self.model.kind,
                "global_step": self.signature.get("global_step"),
                "requests_served": self.requests_served,
            }
        )

    async def signature_route(self, request: Request) -> Response:
        return JSONResponse(self.signature)

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
            payload = {"outputs": {k: v.cpu().tolist() for k, v in outputs.items()}, "batch": int(rows)}
            return json.dumps(payload).encode(), None

        answer, _ = await self._run(request, decode, encode)
        return Response(answer, media_type="application/json")

    async def _run(
        self,
        request: Request,
        decode: Callable[[bytes], tuple[dict[str, Any], Any]],
        encode: Callable[[Any, dict[str, Any]], tuple[bytes, int | None]],
    ) -> tuple[bytes, int | None]:
        """Admit, read, decode (``decode(body) -> (inputs, what encode needs)``), batch, run, encode."""
        try:
            async with self.batcher.slot():
                body = await self._read_body(request)
                try:
                    inputs, decoded = await self._off_loop(len(body), decode, body)
                except RequestError as e:
                    raise _error(400, str(e), expected=self.signature["inputs"]) from e
                rows = next(iter(inputs.values())).shape[0] if inputs else 0
                try:
                    outputs = await self.batcher.infer(inputs, int(rows))
                except Saturated:  # shutting down: the outer handler answers 503
                    raise
                except Exception as e:  # noqa: BLE001 - any model failure is the server's 500
                    raise _error(500, f"the model failed: {type(e).__name__}: {e}") from e
                answer = await self._off_loop(len(body), encode, decoded, outputs)
        except Saturated as e:
            raise _Refused(503, {"error": str(e)}, {"Retry-After": "1"}) from e
        self.requests_served += 1
        return answer

    @staticmethod
    async def _off_loop(size: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; in a worker thread for a large request, so that parsing megabytes of JSON
        does not hold up the event loop (health checks, other requests' admission)."""
        if size <= OFF_LOOP_BYTES:
            return fn(*args)  # small: a thread hop would cost more than the work
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _read_body(self, request: Request) -> bytes:
        """The body, at most ``max_body_bytes`` (413) and read within ``body_timeout_s`` (408)."""
        limit = self.config.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise _error(400, f"Content-Length {length!r} is not a non-negative number")
            if int(length) > limit:
                # Refused from the header. Up to DISCARD_BYTES are read and dropped first: closing
                # a socket with unread data makes TCP reset it, and the client would see
                # "connection reset" instead of this answer.
                await self._discard(request)
                raise _error(413, f"the body has {length} bytes; this server accepts at most {limit}")
        chunks, size = [], 0

        async def read() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:  # a chunked body: counted as it arrives
                    raise _error(413, f"the body has more than {limit} bytes; this server accepts at most {limit}")
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), self.config.body_timeout_s)
        except asyncio.TimeoutError:  # noqa: UP041 - a distinct class before Python 3.11
            raise _error(408, f"the body did not arrive within {self.config.body_timeout_s:g} s") from None
        except ClientDisconnect:  # nobody will read the answer; this ends the request quietly
            raise _error(400, "the client disconnected before sending the whole body") from None
        return b"".join(chunks)

    @staticmethod
    async def _discard(request: Request) -> None:
        async def drop() -> None:
            dropped = 0
            async for chunk in request.stream():
                dropped += len(chunk)
                if dropped >= DISCARD_BYTES:
                    return

        try:
            await asyncio.wait_for(drop(), 2.0)
        except (asyncio.TimeoutError, OSError):  # noqa: UP041 - the client stopped sending: nothing to protect
            return

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


def can_batch(signature: dict[str, Any]) -> bool:
    """Whether requests can be concatenated: every input and output has the dynamic batch first."""
    tensors = [*signature["inputs"], *signature["outputs"]]
    return bool(signature.get("dynamic_batch")) and all(t["shape"] and t["shape"][0] == BATCH for t in tensors)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServeApp", "ServeConfig", "ServeMetrics", "can_batch"]
