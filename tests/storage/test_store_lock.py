"""The index lock object on fsspec stores without conditional writes (``stoker.storage.lock``).

Two processes share ``shared://`` (tests/helpers/shared_store.py: an fsspec store over one local
directory, with no conditional writes, whose ``"xb"`` is an ``O_EXCL`` create): the trainer
saving and an evaluator recording results must both land every update. The lock's own rules
(exclusive, removed on exit, waited for, stale ones broken with a warning) are tested in one
process, where ``lock_file`` is called directly (the process-wide lock is not taken there).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
import uuid

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from helpers import shared_store
from helpers.paths import TESTS
from helpers.processes import PYTHON, popen, python_env
from stoker import storage
from stoker.checkpoint import CheckpointManager
from stoker.errors import CheckpointError, StorageError
from stoker.storage import location, stores
from stoker.storage import lock as store_lock


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A fresh ``shared://`` store; its environment for child processes."""
    monkeypatch.setenv(shared_store.ROOT_ENV, str(tmp_path / "store"))
    shared_store.register()
    return {shared_store.ROOT_ENV: str(tmp_path / "store")}


def _url() -> str:
    return f"shared://bucket/{uuid.uuid4().hex[:8]}"


def _plant(lock_url: str, **fields: object) -> None:
    """A lock object as another holder would have left it."""
    owner = {"owner": "someone-else", "pid": 1, "host": "another-host", "pidns": "", "time": time.time(), **fields}
    fs, key = storage.filesystem(location(lock_url)), stores._key(location(lock_url))
    fs.pipe_file(key, json.dumps(owner).encode())


def _exists(url: str) -> bool:
    return storage.exists(location(url))


def test_the_lock_object_names_its_holder_and_is_removed_on_exit(shared):
    lock = _url() + "/checkpoint.json.lock"
    with store_lock.lock_file(location(lock)):
        held = json.loads(storage.read_bytes(location(lock)))
        assert held["pid"] == os.getpid() and held["host"] and abs(held["time"] - time.time()) < 60
    assert not _exists(lock)
    assert not storage.supports_conditional_writes(location(lock))  # why this store needs it


def test_a_second_holder_waits_for_the_first(shared):
    lock = location(_url() + "/checkpoint.json.lock")
    events: list[str] = []
    inside = threading.Event()

    def first() -> None:
        with store_lock.lock_file(lock):
            events.append("first in")
            inside.set()
            time.sleep(0.4)
            events.append("first out")

    t = threading.Thread(target=first)
    t.start()
    inside.wait(10)
    with store_lock.lock_file(lock):
        events.append("second in")
    t.join()
    assert events == ["first in", "first out", "second in"]


@pytest.mark.skipif(not store_lock._pid_namespace(), reason="no /proc/self/ns/pid: only the timeout breaks a lock here")
def test_a_lock_left_by_a_process_that_exited_is_broken_at_once(shared, caplog):
    lock = _url() + "/checkpoint.json.lock"
    dead = subprocess.run([PYTHON, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    _plant(lock, pid=int(dead.stdout), host=store_lock._HOST, pidns=store_lock._pid_namespace())  # a kill -9 mid-update
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="stoker"), store_lock.lock_file(location(lock), stale_after=60):
        assert json.loads(storage.read_bytes(location(lock)))["pid"] == os.getpid()
    assert time.monotonic() - start < 10
    assert any(
        "breaking the stale index lock" in r.getMessage() and f"pid {int(dead.stdout)}" in r.getMessage()
        for r in caplog.records
    )


def test_a_stale_lock_is_broken_after_the_timeout_with_a_warning(shared, caplog):
    lock = _url() + "/checkpoint.json.lock"
    _plant(lock)  # a live-looking holder on another host, taken just now
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="stoker"), store_lock.lock_file(location(lock), stale_after=0.5):
        waited = time.monotonic() - start
    assert waited >= 0.4
    assert any("pid 1 on another-host" in r.getMessage() for r in caplog.records)
    _plant(lock, time=time.time() - 3600)  # taken an hour ago: broken at once
    start = time.monotonic()
    with store_lock.lock_file(location(lock), stale_after=60):
        pass
    assert time.monotonic() - start < 10


def test_an_unreadable_lock_is_broken_after_the_timeout(shared, caplog):
    lock = _url() + "/checkpoint.json.lock"
    storage.filesystem(location(lock)).pipe_file(stores._key(location(lock)), b"")  # created, never written
    with caplog.at_level(logging.WARNING, logger="stoker"), store_lock.lock_file(location(lock), stale_after=0.3):
        pass
    assert any("(unreadable)" in r.getMessage() for r in caplog.records)


def test_a_lock_that_never_becomes_stale_is_an_error_naming_its_holder(shared):
    lock = _url() + "/checkpoint.json.lock"
    _plant(lock, time=time.time() + 3600)  # the holder's clock is an hour ahead
    with pytest.raises(
        StorageError, match=r"cannot take the index lock shared://.*checkpoint.json.lock: held by pid 1 on another-host"
    ):
        with store_lock.lock_file(location(lock), stale_after=0.2):
            pass


class _NoExclusiveCreate(MemoryFileSystem):
    """A store whose files cannot be opened with "xb"."""

    protocol = "noexcl"
    store: dict = {}  # noqa: RUF012 - fsspec's memory store is a class attribute
    pseudo_dirs = [""]  # noqa: RUF012

    def _open(self, path, mode="rb", **kwargs):  # noqa: ANN001, ANN003, ANN202
        if "x" in mode:
            raise NotImplementedError("File mode not supported")
        return super()._open(path, mode, **kwargs)


def test_a_store_that_cannot_create_exclusively_is_named_and_still_locks(caplog):
    fsspec.register_implementation("noexcl", _NoExclusiveCreate, clobber=True)
    lock = location("noexcl://bucket/run/checkpoint.json.lock")
    with caplog.at_level(logging.WARNING, logger="stoker"), store_lock.lock_file(lock):
        assert json.loads(storage.read_bytes(lock))["pid"] == os.getpid()
    assert not storage.exists(lock)
    assert any("cannot create a file exclusively" in r.getMessage() for r in caplog.records)


def test_a_reader_waits_out_a_write_in_progress_instead_of_calling_the_index_damaged(shared):
    """Without conditional writes a reader can see the index half written (an empty file here).
    It reads it again under the lock the writer holds until the write is whole; it failed with
    'checkpoint.json is unreadable' while the trainer wrote."""
    url = _url()
    CheckpointManager(url).save(0, {"w": torch.zeros(1)}, {"global_step": 0})
    reader = CheckpointManager(url, writer=False)
    assert [r.step for r in reader.records()] == [0]  # its first read (the recovery check) done
    index = location(url) / "checkpoint.json"
    whole = storage.read_versioned(index)[0]
    fs, key = storage.filesystem(index), stores._key(index)
    got: list[object] = []
    with store_lock.index_lock(index):
        fs.pipe_file(key, b"")  # the writer mid-write
        thread = threading.Thread(target=lambda: got.append(reader.records()))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not got  # waiting for the lock, not failing
        fs.pipe_file(key, whole)
    thread.join(10)
    assert [[r.step for r in rs] for rs in got] == [[0]]  # type: ignore[attr-defined]


def test_an_index_still_unreadable_under_the_lock_is_refused(shared):
    url = _url()
    CheckpointManager(url).save(0, {"w": torch.zeros(1)}, {"global_step": 0})
    reader = CheckpointManager(url, writer=False)
    reader.records()
    storage.filesystem(location(url)).pipe_file(stores._key(location(url) / "checkpoint.json"), b'{"form')
    with pytest.raises(CheckpointError, match=r"checkpoint.json is unreadable .*stoker checkpoint repair"):
        reader.records()
    assert not _exists(url + "/checkpoint.json.lock")


_EVALUATOR = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from helpers import shared_store
shared_store.register()
from stoker import storage
from stoker.checkpoint import CheckpointManager
read_versioned = storage.read_versioned
def slow_read(*args, **kwargs):  # widens the window between reading the index and writing it
    out = read_versioned(*args, **kwargs)
    time.sleep(0.05)
    return out
storage.read_versioned = slow_read
m = CheckpointManager(sys.argv[1], keep_checkpoint_max=0, keep_best=("loss", "min"))
print("ready", flush=True)
done, deadline = [], time.monotonic() + 60  # a lost save would otherwise keep it waiting
while len(done) < int(sys.argv[2]) and time.monotonic() < deadline:
    for step in [r.step for r in m.records() if r.step not in done]:
        m.record_eval(step, {"loss": -float(step)})
        done.append(step)
print(json.dumps(done))
"""


def test_trainer_and_evaluator_processes_on_a_store_without_conditional_writes(shared, monkeypatch):
    """Both wait 50 ms between reading the index and writing it; with unconditional writes
    only the lock object keeps them from overwriting each other's update."""
    n = 10
    url = _url()
    read_versioned = storage.read_versioned

    def slow_read(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = read_versioned(*args, **kwargs)
        time.sleep(0.05)
        return out

    monkeypatch.setattr(storage, "read_versioned", slow_read)
    trainer = CheckpointManager(url, keep_checkpoint_max=0, keep_best=("loss", "min"))
    trainer.save(0, {"w": torch.zeros(1)}, {"global_step": 0})
    proc = popen(
        [PYTHON, "-c", _EVALUATOR, url, str(n), str(TESTS)],
        env={**python_env(), **shared},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", (
        proc.stderr.read() if proc.stderr else ""
    )
    for step in range(1, n):
        trainer.save(step, {"w": torch.full((1,), float(step))}, {"global_step": step})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    evaluated = json.loads(out)
    index = trainer.index()
    assert [r.step for r in index.checkpoints] == list(range(n))  # no save lost
    assert all(r.metrics == {"loss": -float(r.step)} for r in index.checkpoints)  # no evaluation lost
    assert sorted(evaluated) == list(range(n)) and index.best is not None and index.best.step == n - 1
    assert not _exists(url + "/checkpoint.json.lock")
