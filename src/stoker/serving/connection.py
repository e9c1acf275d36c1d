"""The HTTP connection of ``stoker serve``: uvicorn's h11 protocol with limits of its own.

A connection costs the server a socket and a task before any request exists, so these bounds
cannot live in the ASGI application and do not depend on a proxy in front:

- request headers: at most ``max_header_bytes`` (431, in h11's own buffer limit: a larger head
  is never accumulated), and complete within ``header_timeout_s`` of the connection opening or
  of the previous answer (slowloris: the connection is closed, with a 408 when part of a head
  had arrived). An idle keep-alive connection is closed after uvicorn's ``timeout_keep_alive``.
- connections: at most ``max_connections`` open at once; one more is closed at once.
- a malformed request: 400 (or 431) with a JSON body ``{"error": ...}``, as every other answer
  (uvicorn's own is plain text).
- closing after an answer given before the body was read (413, 408, 503 with
  ``Connection: close``) lingers: the answer is sent, the write side shut, and whatever the
  client still sends is dropped unparsed for up to ``linger_s`` and ``linger_bytes``, so the
  client reads the answer instead of "connection reset" (closing a socket with unread data
  resets it), and the server spends nothing on a body it refused.

Each closing is counted in ``stoker_serve_connections_closed_total{reason}``. h11 (not
httptools, which has no header limit) parses every request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import HEADER_TIMEOUT_S, KEEP_ALIVE_S, LINGER_BYTES, LINGER_S, MAX_CONNECTIONS, MAX_HEADER_BYTES


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """The bounds every connection is held to (see the module doc)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES
    max_connections: int = MAX_CONNECTIONS
    keep_alive_s: int = KEEP_ALIVE_S
    linger_s: float = LINGER_S
    linger_bytes: int = LINGER_BYTES


def protocol_class(limits: ConnectionLimits, closed: Callable[[str], None]) -> type[H11Protocol]:
    """uvicorn's h11 protocol held to ``limits``; ``closed(reason)`` is called for each connection
    the server closes on its own."""
    return type("GuardedH11Protocol", (_Guarded,), {"limits": limits, "on_closed": staticmethod(closed)})


class _Lingering:
    """A transport whose ``close()`` lingers (see the module doc); everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, limits: ConnectionLimits) -> None:
        self._transport = transport
        self._limits = limits
        self.lingering = False
        self.dropped = 0
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        transport = self._transport
        if self.lingering or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        transport.write_eof()  # the answer goes out, then end-of-file; reading goes on
        transport.resume_reading()
        self._timer = asyncio.get_running_loop().call_later(self._limits.linger_s, transport.close)

    def drop(self, data: bytes) -> None:
        self.dropped += len(data)
        if self.dropped > self._limits.linger_bytes:
            self.end()

    def end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()


class _Guarded(H11Protocol):
    limits: ConnectionLimits
    on_closed: Callable[[str], None]
    _head_timer: asyncio.TimerHandle | None = None
    _lingering: _Lingering | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._lingering = _Lingering(transport, self.limits)
        super().connection_made(cast(asyncio.Transport, self._lingering))
        if len(self.connections) > self.limits.max_connections:
            self.on_closed("too_many_connections")
            transport.abort()
            return
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._unwatch_head()
        if self._lingering is not None and self._lingering.lingering:
            self._lingering.end()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self._lingering is not None and self._lingering.lingering:
            self._lingering.end()  # the client has sent all it will: nothing left to drop
        return None

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None and self._lingering.lingering:
            self._lingering.drop(data)  # a refused body's rest: dropped, never parsed
            return
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()  # the next request's head has header_timeout_s from now

    def _watch_head(self) -> None:
        """Time the request head while one is awaited (h11 has not seen a whole one)."""
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_too_slow)
        elif not waiting:
            self._unwatch_head()

    def _unwatch_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        partial = bool(self.conn.trailing_data[0])
        self.on_closed("header_timeout" if partial else "idle")
        if partial:  # a client that sent part of a head is told why; a silent one just closed
            limit = self.limits.header_timeout_s
            self._write_raw(408, f"the request headers did not arrive within {limit:g} s")
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as JSON; 431 for a head over the limit."""
        limit = self.limits.max_header_bytes
        if len(self.conn.trailing_data[0]) > limit:
            self.on_closed("header_too_large")
            status, message = 431, f"the request headers are larger than {limit} bytes"
        else:
            self.on_closed("bad_request")
            status, message = 400, "the request is not valid HTTP/1.1 (malformed or ambiguous framing)"
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        try:
            for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                output = self.conn.send(event)
                if output:
                    self.transport.write(output)
        except h11.LocalProtocolError:  # h11 will not answer in its state: say it without it
            self._write_raw(status, message)
        self.transport.close()

    def _write_raw(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        reason = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)


def uvicorn_settings(limits: ConnectionLimits, closed: Callable[[str], None]) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments that apply ``limits``."""
    return {
        "http": protocol_class(limits, closed),
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "timeout_keep_alive": limits.keep_alive_s,
        "limit_concurrency": None,  # the connection bound above, answered in JSON by the app beyond it
    }


__all__ = ["ConnectionLimits", "protocol_class", "uvicorn_settings"]
