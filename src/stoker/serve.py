"""``stoker serve``: an export (``model.pt2``) or its AOTInductor package (``model.aoti.pt2``)
served over HTTP with uvicorn, speaking the Open Inference Protocol (KServe v2 REST)::

    stoker serve exported/net --port 8000                  # the torch.export program
    stoker serve exported/net/model.aoti.pt2 --port 8000   # the AOT package (or: exported/net --aot)
    curl -s localhost:8000/v2/models/net
    curl -s localhost:8000/v2/models/net/infer -d '{"inputs": [{"name": "features", "shape": [1, 8],
         "datatype": "FP32", "data": [0.1, 0.2, ...]}]}'

Routes (the application is :class:`stoker.serve_app.ServeApp`; its checks and encodings are
in :mod:`stoker.serve_protocol`, its batching in :mod:`stoker.serve_batcher`):

- ``GET /v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{name}`` (metadata from
  the signature, ``-1`` for the batch dimension), ``/v2/models/{name}/ready``;
- ``POST /v2/models/{name}/infer`` (JSON data or Triton's binary tensor extension);
- stoker's own ``POST /predict`` ``{"inputs": {name: nested lists}}``, ``GET /healthz`` and
  ``GET /signature``, kept as aliases;
- ``GET /metrics``: Prometheus text (request counts, latency, batch sizes, pending requests).

Answers: 400 for a request that does not fit the signature (the expected inputs are in the
answer), 404 for another model name, 408 for a body that does not arrive in time, 413 for a
body over ``max_body_bytes``, 503 (with ``Retry-After``) when ``max_pending`` requests are
already in, 500 when the model raises. No TLS and no authentication: it binds 127.0.0.1
unless told otherwise; put it behind a proxy that has them before exposing it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from .errors import StokerError
from .export import ExportedModel, load_exported
from .serve_protocol import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY_BYTES, RequestError, validate_inputs

if TYPE_CHECKING:
    from .serve_app import ServeConfig

log = logging.getLogger("stoker")

DEFAULT_MAX_PENDING = 64
DEFAULT_WINDOW_MS = 2.0
START_TIMEOUT_S = 30.0


def _require_web_stack() -> None:
    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if not _importable(m)]
    if missing:
        raise StokerError(f"stoker serve needs the {', '.join(missing)} package(s): pip install 'stoker[serve]' "
                          "(starlette, uvicorn, prometheus-client)")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class Server:
    """A uvicorn server around one loaded export, bound before it starts (``port=0``: the OS picks).

    ``serve_forever()`` runs it in this thread (Ctrl-C stops it); ``start()`` runs it in a
    background thread and returns once it accepts connections, ``stop()`` ends it.
    """

    def __init__(self, model: ExportedModel, host: str, port: int, config: ServeConfig) -> None:
        import uvicorn

        from .serve_app import ServeApp

        self.model = model
        self.app = ServeApp(model, config)
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
            self.socket.listen(2048)  # connections wait in the backlog until uvicorn starts, never refused
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()[:2]
        # limit_concurrency: a backstop on connections + tasks far above the app's own bound
        # (max_pending, answered with a JSON 503); uvicorn answers beyond it with a plain 503.
        uv_config = uvicorn.Config(self.app.app, log_level="warning", access_log=False, lifespan="on",
                                   timeout_keep_alive=5, limit_concurrency=4 * config.batching.max_pending + 64,
                                   timeout_graceful_shutdown=10)
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


def make_server(export_path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8000, *,
                aot: bool | None = None, model_name: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                max_batch: int = DEFAULT_MAX_BATCH, batching: bool = True, window_ms: float = DEFAULT_WINDOW_MS,
                max_pending: int = DEFAULT_MAX_PENDING) -> Server:
    """Load an export (``aot=True`` or a ``model.aoti.pt2`` path: its AOT package) and bind a
    server to ``host:port``; call ``start()`` or ``serve_forever()`` on the result."""
    _require_web_stack()
    from .serve_app import ServeConfig
    from .serve_batcher import BatchingConfig

    config = ServeConfig(model_name=model_name, max_body_bytes=max_body_bytes,
                         batching=BatchingConfig(enabled=batching, max_batch=max_batch, window_ms=window_ms,
                                                 max_pending=max_pending))
    return Server(load_exported(export_path, aot=aot), host, port, config)


# ==================================================================== command line
def add_parser(subparsers: Any) -> None:
    """Register ``stoker serve EXPORT --port P``."""
    p = subparsers.add_parser(
        "serve",
        help="serve an export (model.pt2) or its AOT package (model.aoti.pt2) over the Open Inference Protocol",
        description="Serve an export over HTTP (uvicorn): the Open Inference Protocol / KServe v2 REST "
        "(/v2/health/live, /v2/models/NAME, POST /v2/models/NAME/infer), stoker's POST /predict, "
        "and Prometheus /metrics; requests that arrive together run as one batch.",
    )
    p.add_argument("export_dir", help="a directory written by stoker export, or its model.aoti.pt2")
    p.add_argument("--aot", action="store_true", help="serve the directory's AOT package (stoker export --aot)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port, printed at start)")
    p.add_argument("--model_name", default=None, help="the model's name in /v2/models/NAME (default: the directory's)")
    p.add_argument("--max_body_bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger requests get 413")
    p.add_argument("--max_batch", type=int, default=DEFAULT_MAX_BATCH, help="most rows of one request and of one model call")
    p.add_argument("--max_pending", type=int, default=DEFAULT_MAX_PENDING,
                   help="requests in the server at once (decoding, queued, running); more get 503")
    p.add_argument("--batch_window_ms", type=float, default=DEFAULT_WINDOW_MS,
                   help="longest wait for more requests to batch while others are arriving")
    p.add_argument("--no_batching", dest="batching", action="store_false", help="run every request as its own model call")
    p.set_defaults(func=_serve_command)


def _serve_command(args: argparse.Namespace) -> int:
    for flag, value, low in (("port", args.port, 0), ("max_body_bytes", args.max_body_bytes, 1),
                             ("max_batch", args.max_batch, 1), ("max_pending", args.max_pending, 1)):
        if value < low or (flag == "port" and value > 65535):
            allowed = "0..65535" if flag == "port" else f">= {low}"
            print(f"stoker serve: --{flag} must be {allowed}; got {value}", file=sys.stderr)
            return 2
    if args.batch_window_ms < 0:
        print(f"stoker serve: --batch_window_ms must be >= 0; got {args.batch_window_ms}", file=sys.stderr)
        return 2
    try:
        server = make_server(args.export_dir, args.host, args.port, aot=True if args.aot else None,
                             model_name=args.model_name, max_body_bytes=args.max_body_bytes, max_batch=args.max_batch,
                             batching=args.batching, window_ms=args.batch_window_ms, max_pending=args.max_pending)
    except (StokerError, ValueError, OSError) as e:
        print(f"stoker serve: {e}", file=sys.stderr)
        return 1
    names = ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in server.model.signature["inputs"])
    what = "AOT package" if server.model.kind == "aot" else "torch.export program"
    print(f"serving {args.export_dir} ({what}) as model {server.app.name!r} on {server.url}: "
          f"POST /v2/models/{server.app.name}/infer with inputs {names}; GET /metrics", flush=True)
    # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal to the handler
    # that was there before it: these make that a clean exit (status 0) instead of a traceback.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


__all__ = ["RequestError", "Server", "add_parser", "make_server", "validate_inputs"]
