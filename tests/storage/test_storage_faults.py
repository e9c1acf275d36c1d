"""Storage faults on the local filesystem: a wrapper fails the n-th file write.

Each fault must leave the previous checkpoint loadable and the latest, name the path and the
cause, and either let training continue (transient faults) or stop it so that rerunning the
same command resumes bitwise.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from pathlib import Path

import pytest
import torch

import stoker
from helpers.tiny import make_data, make_estimator, train_input
from stoker.checkpoint import CheckpointManager
from stoker.errors import StorageError
from stoker.storage import RetryPolicy
from stoker.storage import stores as storage

FAST = RetryPolicy(attempts=4, backoff=0.001, max_backoff=0.01, timeout=30.0)


class FailNth:
    """Wraps ``storage._write_durably``: the writes numbered in ``fail`` raise ``error`` (or hang)."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, fail: set[int], error: OSError | None, hang: float = 0.0
    ) -> None:
        self.real = storage._write_durably
        self.fail, self.error, self.hang, self.n = fail, error, hang, 0
        self.lock = threading.Lock()
        monkeypatch.setattr(storage, "_write_durably", self)

    def __call__(self, path: Path, data: bytes) -> str:
        with self.lock:
            self.n += 1
            n = self.n
        if n in self.fail:
            if self.hang:
                threading.Event().wait(self.hang)  # a store that stops answering
            if self.error is not None:
                raise self.error
        return self.real(path, data)


def _latest(model_dir: Path) -> str:
    return json.loads((model_dir / "checkpoint.json").read_text())["latest"]


def _weights(model_dir: Path, step: int) -> bytes:
    return (model_dir / f"ckpt-{step}" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("ref")
    x, y = make_data(64)
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(x, y), max_steps=12)
    return model_dir


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device or quota exceeded"),
        (OSError(errno.EROFS, "Read-only file system"), "the location is read-only or not writable"),
    ],
    ids=["ENOSPC", "read-only"],
)
def test_permanent_fault_stops_training_resumably(tmp_path, monkeypatch, reference, error, cause):
    x, y = make_data(64)
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=4)
    faults = FailNth(monkeypatch, {2}, error)  # the second file of ckpt-8
    est = make_estimator(tmp_path, save_checkpoints_steps=4, checkpoint_io=stoker.CheckpointIO(retry=FAST))
    with pytest.raises(
        StorageError,
        match=(
            rf"checkpoint ckpt-8 was not written: cannot write {tmp_path}/\.tmp-ckpt-8-\w+/\S+: {cause}.*ckpt-4' "
            rf"stays the latest"
        ),
    ):
        est.train(train_input(x, y), max_steps=12)
    assert faults.n == 3 + 2  # 3 files, the manifest and the index of ckpt-8 attempted, no retry of a permanent fault
    assert _latest(tmp_path) == "ckpt-4"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("ckpt-", "."))) == ["ckpt-4"]
    monkeypatch.setattr(storage, "_write_durably", faults.real)  # space freed: rerun the same command
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=12)
    assert _weights(tmp_path, 12) == _weights(reference, 12)


def test_transient_faults_are_retried_and_training_continues(tmp_path, monkeypatch, reference, caplog):
    x, y = make_data(64)
    faults = FailNth(monkeypatch, {2, 5, 6}, OSError(errno.EAGAIN, "Resource temporarily unavailable"))
    with caplog.at_level(logging.WARNING, logger="stoker"):
        make_estimator(tmp_path, save_checkpoints_steps=4, checkpoint_io=stoker.CheckpointIO(retry=FAST)).train(
            train_input(x, y), max_steps=12
        )
    assert faults.n > 12  # every checkpoint written, plus the retries
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 3 and all("Resource temporarily unavailable" in m for m in retries), retries
    assert _latest(tmp_path) == "ckpt-12" and _weights(tmp_path, 12) == _weights(reference, 12)


def test_transient_fault_that_persists_gives_up_after_bounded_attempts(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, retry=FAST)
    m.save(4, {"w": torch.ones(2)}, {"global_step": 4})
    FailNth(monkeypatch, set(range(1, 100)), OSError(errno.EBUSY, "Device or resource busy"))
    with pytest.raises(
        StorageError,
        match=r"cannot write .*tmp-ckpt-8.* after 4 attempts: OSError: \[Errno 16\] Device or resource busy",
    ):
        m.save(8, {"w": torch.zeros(2)}, {"global_step": 8})
    assert m.latest_step() == 4 and torch.equal(m.load(m.latest_path()).model_state["w"], torch.ones(2))


def test_a_store_that_stops_answering_times_out_with_a_clear_error(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, retry=RetryPolicy(attempts=2, backoff=0.001, timeout=0.3))
    m.save(4, {"w": torch.ones(2)}, {"global_step": 4})
    FailNth(monkeypatch, {1}, None, hang=3.0)
    with pytest.raises(
        StorageError,
        match=r"cannot write .*tmp-ckpt-8.*: the store did not answer within 0.3 s; .*ckpt-4' stays the latest",
    ):
        m.save(8, {"w": torch.zeros(2)}, {"global_step": 8})
    assert m.latest_step() == 4 and m.load(m.latest_path()).step == 4


def test_retry_policy_is_a_run_config_field():
    with pytest.raises(TypeError):
        stoker.RunConfig(
            checkpoint_io=stoker.CheckpointIO(retry=RetryPolicy(attempts=2)),
            no_such_field=1,  # type: ignore[call-arg]
        )
    assert stoker.RunConfig().checkpoint_io.retry.attempts == 5
