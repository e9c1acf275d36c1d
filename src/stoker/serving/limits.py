"""The defaults of ``stoker serve``'s bounds, in one place with no dependencies (the command's
flags read them without importing the web stack). What each bound stops is in docs/export.md,
"Security"; :class:`~stoker.serving.app.ServeConfig` and
:class:`~stoker.serving.connection.ConnectionLimits` hold them."""

from __future__ import annotations

# bodies (stoker.serving.app)
BODY_TIMEOUT_S = 30.0  # a body must arrive within this (408)
MIN_UPLOAD_BYTES_PER_S = 16 * 2**10  # after UPLOAD_GRACE_S, a body slower than this on average gets 408
UPLOAD_GRACE_S = 1.0
MAX_UPLOADING = 256  # bodies arriving at once (503)
BUFFERED_BODIES = 16  # max_buffered_bytes defaults to this many max_body_bytes (503)
MAX_DECODING = 1  # bodies over OFF_LOOP_BYTES decoded at once
OFF_LOOP_BYTES = 64 * 2**10  # bodies larger than this are decoded (and answered) in a worker thread
DISCARD_BYTES = 2**20  # of a body refused unread, read and dropped before the answer

# connections (stoker.serving.connection)
HEADER_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 64 * 2**10
MAX_CONNECTIONS = 1024
KEEP_ALIVE_S = 5
LINGER_S = 2.0
LINGER_BYTES = 64 * 2**20
