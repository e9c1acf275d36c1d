"""``stoker serve EXPORT``: the command that starts :class:`~stoker.serving.server.Server` on an export."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from ..errors import StokerError
from .protocol import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY_BYTES
from .server import DEFAULT_MAX_PENDING, DEFAULT_WINDOW_MS, make_server


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
    p.add_argument(
        "--max_batch", type=int, default=DEFAULT_MAX_BATCH, help="most rows of one request and of one model call"
    )
    p.add_argument(
        "--max_pending",
        type=int,
        default=DEFAULT_MAX_PENDING,
        help="requests in the server at once (decoding, queued, running); more get 503",
    )
    p.add_argument(
        "--batch_window_ms",
        type=float,
        default=DEFAULT_WINDOW_MS,
        help="longest wait for more requests to batch while others are arriving",
    )
    p.add_argument(
        "--no_batching", dest="batching", action="store_false", help="run every request as its own model call"
    )
    p.set_defaults(func=_serve_command)


def _serve_command(args: argparse.Namespace) -> int:
    for flag, value, low in (
        ("port", args.port, 0),
        ("max_body_bytes", args.max_body_bytes, 1),
        ("max_batch", args.max_batch, 1),
        ("max_pending", args.max_pending, 1),
    ):
        if value < low or (flag == "port" and value > 65535):
            allowed = "0..65535" if flag == "port" else f">= {low}"
            print(f"stoker serve: --{flag} must be {allowed}; got {value}", file=sys.stderr)
            return 2
    if args.batch_window_ms < 0:
        print(f"stoker serve: --batch_window_ms must be >= 0; got {args.batch_window_ms}", file=sys.stderr)
        return 2
    try:
        server = make_server(
            args.export_dir,
            args.host,
            args.port,
            aot=True if args.aot else None,
            model_name=args.model_name,
            max_body_bytes=args.max_body_bytes,
            max_batch=args.max_batch,
            batching=args.batching,
            window_ms=args.batch_window_ms,
            max_pending=args.max_pending,
        )
    except (StokerError, ValueError, OSError) as e:
        print(f"stoker serve: {e}", file=sys.stderr)
        return 1
    names = ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in server.model.signature["inputs"])
    what = "AOT package" if server.model.kind == "aot" else "torch.export program"
    print(
        f"serving {args.export_dir} ({what}) as model {server.app.name!r} on {server.url}: "
        f"POST /v2/models/{server.app.name}/infer with inputs {names}; GET /metrics",
        flush=True,
    )
    # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal to the handler
    # that was there before it: these make that a clean exit (status 0) instead of a traceback.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


__all__ = ["add_parser"]
