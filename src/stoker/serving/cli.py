"""``stoker serve EXPORT``: the command that starts :class:`~stoker.serving.server.Server` on an export."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import FlagError, StokerError
from ..flags import add_flags, check_values, field_flags, given_values, option
from .limits import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_DECODING,
    MAX_HEADER_BYTES,
    MAX_UPLOADING,
    MIN_UPLOAD_BYTES_PER_S,
)
from .protocol import DEFAULT_MAX_BATCH
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
    host: str = option(
        "127.0.0.1", "address to bind (0.0.0.0 to accept other machines: there is no TLS and no authentication)"
    )
    port: int = option(8000, "port (0: any free port, printed at start)", minimum=0, maximum=65535)
    model_name: str | None = option(None, "the model's name in /v2/models/NAME (default: the directory's)")
    max_body_bytes: int | None = option(
        None,
        "larger requests get 413 (default: the largest request the signature allows at --max_batch rows, "
        "32 bytes a value, plus 64 KiB; at most 256 MiB)",
        minimum=1,
    )
    max_batch: int = option(DEFAULT_MAX_BATCH, "most rows of one request and of one model call", minimum=1)
    max_pending: int = option(
        DEFAULT_MAX_PENDING,
        "requests admitted at once (body arrived: decoding, queued, running); more get 503",
        minimum=1,
    )
    batch_window_ms: float = option(
        DEFAULT_WINDOW_MS, "longest wait for more requests to batch while others are arriving", minimum=0
    )
    no_batching: bool = option(False, "run every request as its own model call")
    # the bounds of docs/export.md's "Security"
    max_uploading: int = option(MAX_UPLOADING, "request bodies arriving at once; more get 503", minimum=1)
    max_buffered_bytes: int | None = option(
        None,
        "bytes of request bodies held at once (arriving or waiting to be decoded); beyond, 503 "
        "(default 16 x --max_body_bytes)",
        minimum=1,
    )
    body_timeout_s: float = option(BODY_TIMEOUT_S, "a body must arrive within this; else 408", above=0)
    min_upload_bytes_per_s: float = option(
        MIN_UPLOAD_BYTES_PER_S,
        "after its first second a body must arrive at least this fast on average; else 408",
        minimum=0,
    )
    max_decoding: int = option(MAX_DECODING, "bodies over 64 KiB decoded at once, in worker threads", minimum=1)
    header_timeout_s: float = option(
        HEADER_TIMEOUT_S,
        "request headers must arrive within this of the connection or of the previous answer; else it is closed",
        above=0,
    )
    max_header_bytes: int = option(MAX_HEADER_BYTES, "request headers larger than this get 431", minimum=1024)
    max_connections: int = option(MAX_CONNECTIONS, "open connections at once; one more is closed at once", minimum=1)
    show_paths: bool = option(
        False, "let /healthz and /signature name the export's and checkpoint's paths (default: names only)"
    )


def _serve_command(args: argparse.Namespace) -> int:
    try:
        flags = ServeFlags(**given_values(ServeFlags, args))
        check_values(flags)
    except FlagError as e:
        print(f"stoker serve: {e}", file=sys.stderr)
        return 2
    from .app import ServeConfig  # the web stack: only when serving
    from .connection import ConnectionLimits

    try:
        config = ServeConfig(
            max_uploading=flags.max_uploading,
            max_buffered_bytes=flags.max_buffered_bytes,
            body_timeout_s=flags.body_timeout_s,
            min_upload_bytes_per_s=flags.min_upload_bytes_per_s,
            max_decoding=flags.max_decoding,
            show_paths=flags.show_paths,
        )
        limits = ConnectionLimits(
            header_timeout_s=flags.header_timeout_s,
            max_header_bytes=flags.max_header_bytes,
            max_connections=flags.max_connections,
        )
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
            config=config,
            limits=limits,
        )
    except (StokerError, ValueError, OSError) as e:
        print(f"stoker serve: {e}", file=sys.stderr)
        return 1
    names = ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in server.model.signature["inputs"])
    what = "AOT package" if server.model.kind == "aot" else "torch.export program"
    print(
        f"serving {args.export_dir} ({what}) as model {server.app.name!r} on {server.url}: "
        f"POST /v2/models/{server.app.name}/infer with inputs {names}; GET /metrics "
        f"(bodies up to {server.app.config.max_body_bytes} bytes)",
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
