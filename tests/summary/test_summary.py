"""stoker's synchronous events writer writes what torch's SummaryWriter writes."""

from __future__ import annotations

import struct

import pytest

from stoker.summary import EVENTS_DIR, ScalarWriter
from stoker.summary import writer as summary

pytest.importorskip("tensorboard")


def records_after_the_first(path) -> bytes:  # noqa: ANN001
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw[16 + n :]  # the first record is the file version, stamped with the creation time


def test_events_are_byte_identical_to_summary_writer_and_read_by_tensorboard(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setattr(summary.time, "time", lambda: 1700000000.25)
    values = [(100, {"loss": 0.123456789, "learning_rate": 1e-3}), (200, {"loss": 0.5, "learning_rate": 1e-30})]
    ours = ScalarWriter(tmp_path / "ours")
    theirs = SummaryWriter(log_dir=str(tmp_path / "theirs"))
    for step, scalars in values:
        ours.write(step, scalars, prefix="train/")
        ours.flush()
        for tag, value in scalars.items():
            theirs.add_scalar(f"train/{tag}", value, step, walltime=1700000000.25)
    ours.close()
    theirs.close()
    (mine,) = (tmp_path / "ours" / EVENTS_DIR).iterdir()
    (reference,) = (tmp_path / "theirs").iterdir()
    assert mine.name.startswith("events.out.tfevents.1700000000.")
    assert records_after_the_first(mine) == records_after_the_first(reference)
    acc = EventAccumulator(str(mine.parent))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["train/learning_rate", "train/loss"]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("train/loss")] == [(100, 0.123457), (200, 0.5)]
