"""stoker's synchronous events writer writes what torch's SummaryWriter writes."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from helpers.processes import python_env
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


def test_opening_the_writer_leaves_tensorboards_file_layer_unimported(tmp_path):
    # its tensorflow_stub imports boto3 and fsspec for gfile: 0.3-0.8 s of every run's start
    pytest.importorskip("google_crc32c")
    code = (
        "import sys\n"
        "from stoker.summary import ScalarWriter\n"
        f"w = ScalarWriter({str(tmp_path)!r}); w.write(1, {{'loss': 0.5}}); w.close()\n"
        "print(sorted(m for m in ('tensorboard.compat.tensorflow_stub', 'boto3', 'fsspec') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert len(list((tmp_path / EVENTS_DIR).iterdir())) == 1


def test_writers_opened_in_one_second_get_files_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setattr(summary.time, "time", lambda: 1700000000.25)
    monkeypatch.delitem(sys.modules, "tensorboard.summary.writer.event_file_writer", raising=False)
    monkeypatch.setattr(summary, "_uids", iter([7, 7, 8]))  # a counter that repeats: the name is taken
    first, second = summary.EventFileWriter(tmp_path), summary.EventFileWriter(tmp_path)
    first.close()
    second.close()
    assert sorted(p.name.rsplit(".", 1)[1] for p in tmp_path.iterdir()) == ["7", "8"]
