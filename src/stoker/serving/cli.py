"""``stoker serve EXPORT``: the command that starts :class:`~stoker.serving.server.Server` on an export."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import FlagError, StokerError
from ..flags import add_flags, check_values, field_flags, given_values, option
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
    add_flags(p, field_flags(ServeFlags), style="argparse")
    p.set_defaults(func=_serve_command)


@dataclass(kw_only=True)
class ServeFlags:
    """``stoker serve``'s flags, declared once (:mod:`stoker.flags`: the parser and the checks)."""

    aot: bool = option(False, "serve the directory's AOT package (stoker export --aot)")
    host: str = option("127.0.0.1", "address to bind (0.0.0.0 to accept other machines)")
    port: int = option(8000, "port (0: any free port, printed at start)", minimum=0, maximum=65535)
    model_name: str | None = option(None, "the model's name in /v2/models/NAME (default: the directory's)")
    max_body_bytes: int = option(DEFAULT_MAX_BODY_BYTES, "larger requests get 413", minimum=1)
    max_batch: int = option(DEFAULT_MAX_BATCH, "most rows of one request and of one model call", minimum=1)
    max_pending: int = option(
        DEFAULT_MAX_PENDING, "requests in the server at once (decoding, queued, running); more get 503", minimum=1
    )
    batch_window_ms: float = option(
        DEFAULT_WINDOW_MS, "longest wait for more requests to batch while others are arriving", minimum=0
    )
    no_batching: bool = option(False, "run every request as its own model call")


def _serve_command(args: argparse.Namespace) -> int:
    try:
        flags = ServeFlags(**given_values(ServeFlags, args))
        check_values(flags)
    except FlagError as e:
        print(f"stoker serve: {e}", file=sys.stderr)
        return 2
    try:
        server = make_server(
            args.export_dir,
            flags.host,
            flags.port,
            aot=True if flags.aot else None,
            model_name=flags.model_name,
            max_body_bytes=flags.max_body_bytes,
            max_batch=flags.max_batch,
            batching=not flags.no_batching,
            window_ms=flags.batch_window_ms,
            max_pending=flags.max_pending,
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


__all__ = ["ServeFlags", "add_parser"]
