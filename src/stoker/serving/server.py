"""``stoker serve``: an export (``model.pt2``) or its AOTInductor package (``model.aoti.pt2``)
served over HTTP with uvicorn, speaking the Open Inference Protocol (KServe v2 REST)::

    stoker serve exported/net --port 8000                  # the torch.export program
    stoker serve exported/net/model.aoti.pt2 --port 8000   # the AOT package (or: exported/net --aot)
    curl -s localhost:8000/v2/models/net
    curl -s localhost:8000/v2/models/net/infer -d '{"inputs": [{"name": "features", "shape": [1, 8],
         "datatype": "FP32", "data": [0.1, 0.2, ...]}]}'

Routes (the application is :class:`stoker.serving.app.ServeApp`; its checks and encodings are
in :mod:`stoker.serving.protocol`, its batching in :mod:`stoker.serving.batcher`):

- ``GET /v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{name}`` (metadata from
  the signature, ``-1`` for the batch dimension), ``/v2/models/{name}/ready``;
- ``POST /v2/models/{name}/infer`` (JSON data or Triton's binary tensor extension);
- stoker's own ``POST /predict`` ``{"inputs": {name: nested lists}}``, ``GET /healthz`` and
  ``GET /signature``, kept as aliases;
- ``GET /metrics``: Prometheus text (request counts, latency, batch sizes, pending requests).

Answers: 400 for a request that does not fit the signature (the expected inputs are in the
answer), 404 for another model name, 408 for a body or headers that do not arrive in time (or
a body slower than the minimum rate), 413 for a body over ``max_body_bytes``, 431 for headers
over ``max_header_bytes``, 503 (with ``Retry-After``) at one of the server's bounds
(``max_pending``, ``max_uploading``, ``max_buffered_bytes``), 500 when the model raises; every
one JSON. No TLS and no authentication: it binds 127.0.0.1 unless told otherwise, and says so
in one line when bound elsewhere; put it behind a proxy that has them before exposing it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from ..errors import StokerError
from ..export.program import ExportedModel, load_exported
from .protocol import DEFAULT_MAX_BATCH, RequestError, validate_inputs

if TYPE_CHECKING:
    from .app import ServeConfig
    from .connection import ConnectionLimits

log = logging.getLogger("stoker")

DEFAULT_MAX_PENDING = 64
DEFAULT_WINDOW_MS = 2.0
START_TIMEOUT_S = 30.0


def _require_web_stack() -> None:
    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if not _importable(m)]
    if missing:
        raise StokerError(
            f"stoker serve needs the {', '.join(missing)} package(s): pip install 'stoker[serve]' "
            "(starlette, uvicorn, prometheus-client)"
        )


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class Server:
    """A uvicorn server around one loaded export, bound before it starts (``port=0``: the OS picks).

    ``serve_forever()`` runs it in this thread (Ctrl-C stops it); ``start()`` runs it in a
    background thread and returns once it accepts connections, ``stop()`` ends it.
    """

    def __init__(
        self, model: ExportedModel, host: str, port: int, config: ServeConfig, limits: ConnectionLimits | None = None
    ) -> None:
        import uvicorn

        from .app import ServeApp
        from .connection import ConnectionLimits, uvicorn_settings

        self.model = model
        self.app = ServeApp(model, config)
        limits = limits or ConnectionLimits()
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
            self.socket.listen(2048)  # connections wait in the backlog until uvicorn starts, never refused
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()[:2]
        warning = exposure_warning(host)
        if warning:
            log.warning(warning)
        closed = self.app.metrics.closed
        uv_config = uvicorn.Config(
            self.app.app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
            **uvicorn_settings(limits, lambda reason: closed.labels(reason).inc()),
        )
        self.uvicorn = uvicorn.Server(uv_config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (uvicorn handles SIGINT / SIGTERM here)."""
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def start(self) -> Server:
        """Serve from a background thread; return once the server accepts connections."""
        self._thread = threading.Thread(target=self.serve_forever, name="stoker-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise StokerError(f"stoker serve: the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, finish what is running, and end the background thread."""
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def exposure_warning(host: str) -> str | None:
    """The one line said when the server listens beyond this machine (None on a loopback address)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if loopback:
        return None
    return (
        f"stoker serve: listening on {host}, beyond this machine, with no TLS and no authentication: "
        "put a proxy that provides them in front (or the cluster's ingress, as with KServe and Triton)"
    )


def make_server(
    export_path: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    aot: bool | None = None,
    model_name: str | None = None,
    max_body_bytes: int | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    batching: bool = True,
    window_ms: float = DEFAULT_WINDOW_MS,
    max_pending: int = DEFAULT_MAX_PENDING,
    config: ServeConfig | None = None,
    limits: ConnectionLimits | None = None,
) -> Server:
    """Load an export (``aot=True`` or a ``model.aoti.pt2`` path: its AOT package) and bind a
    server to ``host:port``; call ``start()`` or ``serve_forever()`` on the result.

    ``max_body_bytes=None`` derives the limit from the export's signature and ``max_batch``.
    ``config`` (a :class:`~stoker.serving.app.ServeConfig`) and ``limits`` (a
    :class:`~stoker.serving.connection.ConnectionLimits`) give every other bound; the keyword
    arguments above, when given, are applied over ``config``."""
    _require_web_stack()
    import dataclasses

    from .app import ServeConfig
    from .batcher import BatchingConfig

    base = config or ServeConfig()
    config = dataclasses.replace(
        base,
        model_name=model_name or base.model_name,
        max_body_bytes=max_body_bytes or base.max_body_bytes,
        batching=BatchingConfig(enabled=batching, max_batch=max_batch, window_ms=window_ms, max_pending=max_pending),
    )
    return Server(load_exported(export_path, aot=aot), host, port, config, limits)


__all__ = ["RequestError", "Server", "exposure_warning", "make_server", "validate_inputs"]
