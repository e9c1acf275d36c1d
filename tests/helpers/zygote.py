"""Real Python processes for the tests, forked from one that has imported torch already.

Most of the default run's process-based tests (two replicas, kill -9 then rerun, a trainer beside
an evaluator, the ``stoker`` command line) start a fresh Python that spends 2-3 s of CPU importing
torch before it does the second of work the test is about; on a 2-core machine, with about 130 such
processes, that import was a third of the whole run. So each test worker starts *zygotes*: Pythons
that import torch and numpy, then fork a child per request (two, taken in turn, so that two
processes started one after the other hash strings differently, as fresh interpreters do). The child is a real process
(its own pid, its own memory, really killed by ``kill -9``, talking to its peers over real sockets);
it differs from ``python script.py`` only in not having paid for the import. What it runs is set up
as the interpreter would: ``sys.argv``, ``sys.path`` (the script's folder or ``''`` first, then
``PYTHONPATH``, then the interpreter's own), the environment, the working directory, standard
streams, ``__main__``, fresh random seeds, exit codes (``SystemExit``, an uncaught exception's
traceback and 1, ``-signal`` when killed) and ``atexit`` handlers.

:func:`start` returns a :class:`ForkedProcess` (the part of :class:`subprocess.Popen` the tests
use) or, where a fork cannot mean the same as a fresh interpreter, a real ``subprocess.Popen``:
interpreter options other than ``-m`` / ``-c`` / a script, data on stdin, or an environment that
changes what importing torch reads (``OMP_*``, ``MKL_*``, ``TORCH*``, ``PYTHON*`` but
``PYTHONPATH``, ...). ``STOKER_TEST_FORK=0`` turns the zygote off (every process a fresh
interpreter, as before), for when a test's failure might be the zygote's.

This file is also the zygote itself: ``python zygote.py SOCKET`` (started by :func:`start`).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

#: Environment variables whose value is read while torch or numpy is imported (thread pools,
#: allocators, logging, interpreter flags): a child asking for values other than the zygote's is
#: started as a fresh interpreter instead.
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH", "NUMPY", "LD_", "MALLOC")
_PYTHON_VARIABLES_ALLOWED = ("PYTHONPATH",)

_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!qq")  # pid, wait status


# ---------------------------------------------------------------------------------------------
# The zygote (this file run as a script)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _serve(socket_path: str) -> None:
    import numpy  # noqa: F401  (what the children are spared)
    import torch  # noqa: F401

    # The interpreter's own entries: without this file's folder and the zygote's PYTHONPATH (each
    # child puts its own PYTHONPATH in front of these, as a fresh interpreter would).
    variable = os.environ.get("PYTHONPATH", "")
    own = {os.path.abspath(p) for p in variable.split(os.pathsep)} if variable else set()
    base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the fd
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, wake_r, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # the test worker is gone
        if wake_r in readable:
            os.read(wake_r, 4096)
        while children:  # report every child that has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(_STATUS.pack(pid, status))
                except OSError:
                    pass
                conn.close()
        if listener in readable:
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
            (size,) = _HEADER.unpack(msg)
            request = pickle.loads(_recv_exactly(conn, size))
            pid = os.fork()
            if pid == 0:
                try:
                    listener.close()
                    for c in children.values():
                        c.close()
                    conn.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(request, fds, base_path)  # ends with os._exit
                finally:  # a setup failure (a missing cwd, say) must not leave a second zygote running
                    import traceback

                    traceback.print_exc()
                    os._exit(1)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.sendall(_STATUS.pack(pid, -1))


def _child(request: dict[str, Any], fds: list[int], base_path: list[str]) -> None:
    """Become ``python <request['argv']>``: streams, environment, folder, paths, then run it."""
    import random
    import runpy
    import traceback
    import types

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # A fresh interpreter seeds these from the OS; forked children would otherwise share the zygote's.
    random.seed()
    import numpy as np

    np.random.seed()
    kind, target_name, args = request["kind"], request["target"], request["args"]
    first = {"script": os.path.dirname(os.path.abspath(target_name)), "module": os.getcwd(), "code": ""}[kind]
    # As the interpreter reads PYTHONPATH: an empty entry is the working directory.
    variable = request["env"].get("PYTHONPATH", "")
    pythonpath = [os.path.abspath(p) for p in variable.split(os.pathsep)] if variable else []
    sys.path[:] = [first, *pythonpath, *base_path]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        if kind == "script":
            sys.argv = [target_name, *args]
            runpy.run_path(target_name, run_name="__main__")
        elif kind == "module":
            sys.argv = ["-m", *args]
            runpy._run_module_as_main(target_name, alter_argv=True)  # type: ignore[attr-defined]
        else:
            sys.argv = ["-c", *args]
            exec(compile(target_name, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        # As the interpreter reports it: through sys.excepthook, without this file's and runpy's frames.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            tb = tb.tb_next
        e.__traceback__ = tb  # the hook prints the exception's own traceback, not its third argument
        try:
            sys.excepthook(type(e), e, tb)
        except Exception:
            traceback.print_exception(type(e), e, tb)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # as at interpreter exit: join non-daemon threads
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


# ---------------------------------------------------------------------------------------------
# The test side


class ForkedProcess:
    """A child of the zygote, answering as much of :class:`subprocess.Popen` as the tests use."""

    def __init__(
        self, args: list[str], pid: int, status: socket.socket, stdout: IO[Any] | None, stderr: IO[Any] | None
    ) -> None:
        self.args = args
        self.pid = pid
        self.stdin = None
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._status = status
        self._readers: dict[str, tuple[threading.Thread, list[Any]]] = {}  # communicate()'s, per stream

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._status], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def _read_status(self) -> None:
        try:
            _, status = _STATUS.unpack(_recv_exactly(self._status, _STATUS.size))
            self.returncode = os.waitstatus_to_exitcode(status)
        except EOFError:  # the zygote died: its children's end is unknown
            self.returncode = -signal.SIGKILL
        self._status.close()

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        if input is not None:
            raise ValueError("a forked process has no stdin pipe")
        deadline = None if timeout is None else time.monotonic() + timeout
        readers = self._readers
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None and name not in readers:
                box: list[Any] = []
                thread = threading.Thread(target=lambda s=stream, b=box: b.append(s.read()), daemon=True)
                thread.start()
                readers[name] = (thread, box)
        for thread, _ in readers.values():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        results = []
        for name in ("stdout", "stderr"):
            if name in readers:
                results.append(readers[name][1][0])
                getattr(self, name).close()
            else:
                results.append(None)
        return results[0], results[1]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def _zygote_env(base_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a zygote started from ``base_env`` imports torch under."""
    return {k: v for k, v in base_env.items() if k != "PYTHONHASHSEED"}  # each zygote a hash seed of its own


class _Zygote:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = _zygote_env(env)
        self.folder = tempfile.mkdtemp(prefix="stoker-zygote-")
        self.socket_path = os.path.join(self.folder, "socket")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.socket_path],
            env=self.env,
            stdin=subprocess.PIPE,  # its end tells the zygote that this worker is gone
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != "ready\n":
            raise RuntimeError(f"the test zygote did not start (it said {line!r})")
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:
            os.unlink(self.socket_path)
            os.rmdir(self.folder)
        except OSError:
            pass

    def fork(self, request: dict[str, Any], fds: list[int]) -> tuple[int, socket.socket]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.socket_path)
        body = pickle.dumps(request)
        socket.send_fds(conn, [_HEADER.pack(len(body))], fds)
        conn.sendall(body)
        pid, _ = _STATUS.unpack(_recv_exactly(conn, _STATUS.size))
        return pid, conn


#: Two zygotes, taken in turn: each has its own string-hash seed (which a process keeps for life),
#: so two replicas started together, or a reference run and the run compared with it, hash
#: strings differently, as fresh interpreters would; a set's order that leaked into what a run
#: computes or writes would still show up as a difference between them.
ZYGOTES = 2
_zygotes: list[_Zygote] = []
_turn = 0
_zygote_lock = threading.Lock()


def _next_zygote(env: Mapping[str, str]) -> _Zygote:
    global _turn
    with _zygote_lock:
        if len(_zygotes) < ZYGOTES:
            _zygotes.append(_Zygote(env))
        index = _turn % len(_zygotes)
        _turn += 1
        if _zygotes[index].proc.poll() is not None:  # it died (killed from outside, say): a new one
            _zygotes[index].close()
            _zygotes[index] = _Zygote(env)
        return _zygotes[index]


def _parse(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, target, args)`` for ``-m mod ...``, ``-c code ...`` or ``script ...``; None otherwise."""
    if not argv:
        return None
    if argv[0] == "-m" and len(argv) >= 2:
        return "module", argv[1], list(argv[2:])
    if argv[0] == "-c" and len(argv) >= 2:
        return "code", argv[1], list(argv[2:])
    if not argv[0].startswith("-"):
        return "script", str(argv[0]), list(argv[1:])
    return None


def _forkable_env(env: Mapping[str, str], zygote_env: Mapping[str, str]) -> bool:
    for key in set(env) | set(zygote_env):
        if env.get(key) == zygote_env.get(key):
            continue
        if key.startswith("PYTHON") and key not in _PYTHON_VARIABLES_ALLOWED:
            return False
        if key.startswith(IMPORT_TIME_PREFIXES):
            return False
    return True


def enabled() -> bool:
    """Whether :func:`start` forks (``STOKER_TEST_FORK=0`` turns it off; POSIX only)."""
    return os.environ.get("STOKER_TEST_FORK", "1") != "0" and hasattr(os, "fork") and hasattr(socket, "send_fds")


def _stream_fd(choice: Any, default_fd: int, opened: list[int]) -> tuple[int, int | None]:
    """The fd the child gets for one stream, and our read end when it is a pipe."""
    if choice is None:
        return default_fd, None
    if choice == subprocess.PIPE:
        r, w = os.pipe()
        opened.append(w)
        return w, r
    if choice == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd, None
    if choice == subprocess.STDOUT:
        raise ValueError("STDOUT is resolved by the caller")
    return (choice if isinstance(choice, int) else choice.fileno()), None


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    stdin: Any = None,
    text: bool = True,
    base_env: Mapping[str, str],
) -> ForkedProcess | subprocess.Popen[Any]:
    """``[sys.executable, *argv]`` as a forked child of this worker's zygote where that means the
    same as a fresh interpreter, else as a fresh interpreter. ``base_env``: the environment the
    zygote imports torch under (the tests' standard one)."""
    argv = [str(a) for a in argv]
    parsed = _parse(argv)
    if (
        not enabled()
        or parsed is None
        or stdin not in (None, subprocess.DEVNULL)
        or not _forkable_env(env, _zygotes[0].env if _zygotes else _zygote_env(base_env))
    ):
        return subprocess.Popen(
            [sys.executable, *argv], env=dict(env), cwd=cwd, stdout=stdout, stderr=stderr, stdin=stdin, text=text
        )
    zygote = _next_zygote(base_env)
    opened: list[int] = []
    try:
        in_fd, _ = _stream_fd(stdin, 0, opened)
        out_fd, out_r = _stream_fd(stdout, 1, opened)
        if stderr == subprocess.STDOUT:
            err_fd, err_r = out_fd, None
        else:
            err_fd, err_r = _stream_fd(stderr, 2, opened)
        kind, target, args = parsed
        request = {
            "kind": kind,
            "target": target,
            "args": args,
            "env": dict(env),
            "cwd": os.path.abspath(cwd) if cwd is not None else os.getcwd(),
        }
        pid, status = zygote.fork(request, [in_fd, out_fd, err_fd])
    finally:
        for fd in opened:
            os.close(fd)

    def reader(fd: int | None) -> IO[Any] | None:
        if fd is None:
            return None
        return open(fd, "r" if text else "rb", closefd=True)

    return ForkedProcess([sys.executable, *argv], pid, status, reader(out_r), reader(err_r))


if __name__ == "__main__":
    _serve(sys.argv[1])
