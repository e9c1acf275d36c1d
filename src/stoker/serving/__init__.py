"""Serving an export over HTTP: ``stoker serve``, an Open Inference Protocol (KServe v2) server.

Owns the server (:mod:`~stoker.serving.server`: start, stop, readiness), the ASGI application
(:mod:`~stoker.serving.app`: routes, request limits, Prometheus metrics), the connection
(:mod:`~stoker.serving.connection`: header, idle and connection limits), the wire protocol
(:mod:`~stoker.serving.protocol`: request decoding and validation, response encoding), the
dynamic batcher (:mod:`~stoker.serving.batcher`) and the command (:mod:`~stoker.serving.cli`).
It serves what :mod:`stoker.export` wrote and imports only that package, :mod:`stoker.errors`
and ``stoker._version``: never the engine or the Estimator, so a serving process loads no
training code. See docs/export.md.
"""

from .batcher import BatchingConfig
from .protocol import RequestError, validate_inputs
from .server import Server, make_server

__all__ = ["BatchingConfig", "RequestError", "Server", "make_server", "validate_inputs"]
