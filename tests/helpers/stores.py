"""Checks shared by the object-store tests (S3 through moto, GCS through fake-gcs-server)."""

from __future__ import annotations

import torch


def stale_index_write_is_refused_and_loses_nothing(url: str) -> None:
    """On a store with conditional writes: an index write based on a version another writer
    has since replaced is refused, and a second writer's update (an evaluation) made after
    re-reading lands on top of the first's (a save), losing neither."""
    from stoker import storage
    from stoker.checkpoint import CheckpointManager

    index = storage.location(url) / "checkpoint.json"
    trainer = CheckpointManager(url, keep_checkpoint_max=0)
    trainer.save(1, {"w": torch.ones(1)}, {"global_step": 1})
    stale = CheckpointManager(url, keep_checkpoint_max=0)
    data, version = storage.read_versioned(index)
    trainer.save(2, {"w": torch.ones(1)}, {"global_step": 2})  # changes the index after `version`
    assert not storage.put_if(index, data, version)  # a stale write is refused
    stale.record_eval(1, {"loss": 0.5})  # re-read, applied on top of the trainer's update
    records = trainer.index().checkpoints
    assert [r.step for r in records] == [1, 2] and records[0].metrics == {"loss": 0.5}


def slow_checkpoint_writes(seconds: float) -> None:
    """Make every checkpoint file write sleep ``seconds`` first, in this process: it widens the
    window in which a kill lands inside a checkpoint write (the crash tests' child scripts)."""
    import time

    from stoker.storage import stores as storage  # where write_all looks _write_one up

    real = storage._write_one

    def slow(path, data, retry):  # noqa: ANN001, ANN202
        time.sleep(seconds)
        return real(path, data, retry)

    storage._write_one = slow
