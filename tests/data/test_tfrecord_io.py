"""TFRecord files without TensorFlow (``stoker.data.tfrecord_io``, ``stoker.data.tfrecord_index``):
framing and checksums as TensorFlow writes them, corrupt and truncated records named by file,
record and byte, and the offset index, its cache and reading by index."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from stoker.data import DataError, write_tfrecords
from stoker.data.images.tfrecord import find_shards
from stoker.data.tfrecord_index import INDEX_FOLDER, RecordShards, shard_index
from stoker.data.tfrecord_io import frame_record, read_tfrecords


def masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------- framing
def test_framing_round_trip_is_tensorflows_bytes(tmp_path: Path) -> None:
    # length 5 (uint64 LE) | masked crc32c of the length | data | masked crc32c of the data
    assert frame_record(b"hello") == bytes.fromhex("0500000000000000eab2043e68656c6c6fbb1f1c19")
    assert masked(struct.pack("<Q", 5)) == 0x3E04B2EA and masked(b"hello") == 0x191C1FBB
    path = tmp_path / "r"
    records = [b"", b"hello", bytes(range(256)) * 40]
    assert write_tfrecords(path, records) == 3
    assert path.read_bytes() == b"".join(frame_record(r) for r in records)
    assert list(read_tfrecords(path)) == records
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temporary file left


def _two_record_file(tmp_path: Path) -> tuple[Path, bytearray]:
    path = tmp_path / "train-00000-of-00001"
    write_tfrecords(path, [b"first", b"second record"])
    return path, bytearray(path.read_bytes())


def test_a_corrupt_length_is_caught_by_the_length_checksum(tmp_path: Path) -> None:
    path, raw = _two_record_file(tmp_path)
    offset = 12 + 5 + 4  # record 1
    raw[offset] ^= 0x01  # length 13 -> 12
    path.write_bytes(raw)
    stored = int.from_bytes(raw[offset + 8 : offset + 12], "little")
    computed = masked(bytes(raw[offset : offset + 8]))
    message = (
        f"TFRecord file {path}: record 1 at byte 21: corrupt length field: length checksum mismatch "
        f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
    )
    with pytest.raises(DataError) as sequential:
        list(read_tfrecords(path))
    assert str(sequential.value) == message
    with pytest.raises(DataError) as indexed:
        RecordShards([path])
    assert str(indexed.value) == message + " (skip_bad_examples=True reads the 1 records before it)"
    assert len(RecordShards([path], lenient=True)) == 1


def test_corrupt_data_is_caught_by_the_data_checksum(tmp_path: Path) -> None:
    path, raw = _two_record_file(tmp_path)
    shards = RecordShards([path])  # indexed while whole: the index reads headers only
    raw[21 + 12 + 3] ^= 0xFF  # a byte of "second record"
    path.write_bytes(raw)
    stored = int.from_bytes(raw[-4:], "little")
    computed = masked(bytes(raw[21 + 12 : 21 + 12 + 13]))
    message = (
        f"TFRecord file {path}: record 1 at byte 21: corrupt data: data checksum mismatch "
        f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
    )
    assert shards.read(0) == b"first"
    with pytest.raises(DataError) as indexed:
        shards.read(1)
    assert str(indexed.value) == message
    with pytest.raises(DataError) as sequential:
        list(read_tfrecords(path))
    assert str(sequential.value) == message


def test_a_truncated_file_names_the_record_and_offset(tmp_path: Path) -> None:
    path, raw = _two_record_file(tmp_path)
    path.write_bytes(raw[:-6])  # record 1 loses its last data bytes and checksum
    message = f"TFRecord file {path}: record 1 at byte 21: truncated: the record needs 29 bytes, the file holds 23"
    with pytest.raises(DataError, match="^" + message.replace("(", r"\(")):
        RecordShards([path])
    with pytest.raises(DataError, match=message):
        list(read_tfrecords(path))
    lenient = RecordShards([path], lenient=True)  # skip_bad_examples: the records before the break
    assert len(lenient) == 1 and lenient.read(0) == b"first"
    path.write_bytes(raw[:25])  # 4 bytes of record 1's header
    with pytest.raises(DataError, match=r"record 1 at byte 21: truncated: the file ends 4 bytes into the 12-byte"):
        RecordShards([path])


# ---------------------------------------------------------------------------------- the index
def test_the_index_is_built_once_cached_and_rebuilt_when_the_shard_changes(tmp_path: Path) -> None:
    path = tmp_path / "train-00000-of-00001"
    write_tfrecords(path, [b"a", b"bb", b"ccc"])
    first = shard_index(path)
    assert first.built and first.index_path == tmp_path / INDEX_FOLDER / (path.name + ".idx")
    assert first.offsets.tolist() == [0, 17, 35] and first.lengths.tolist() == [1, 2, 3]
    again = shard_index(path)
    assert not again.built and again.offsets.tolist() == first.offsets.tolist()
    assert find_shards(tmp_path, "train") == [path]  # the cache folder is hidden from the glob

    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # same size, newer mtime
    assert shard_index(path).built and not shard_index(path).built
    with open(path, "ab") as f:  # a record appended: another size
        f.write(frame_record(b"dddd"))
    grown = shard_index(path)
    assert grown.built and grown.lengths.tolist() == [1, 2, 3, 4]


def test_the_index_goes_to_the_user_cache_when_the_data_folder_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    path = data / "train-00000-of-00001"
    write_tfrecords(path, [b"a", b"bb"])
    (data / INDEX_FOLDER).write_text("a file where the index folder would go")  # cannot create it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    built = shard_index(path)
    assert built.built and built.index_path is not None
    assert built.index_path.is_relative_to(tmp_path / "cache" / "stoker" / "tfrecord-index")
    assert not shard_index(path).built


def test_reading_by_index_equals_reading_in_order(tmp_path: Path) -> None:
    for k, lo, hi in ((0, 0, 7), (1, 7, 12), (2, 12, 18)):  # 18 records of several lengths in 3 shards
        write_tfrecords(tmp_path / f"train-0000{k}-of-00003", [b"record %d " % i * (i + 1) for i in range(lo, hi)])
    shards = find_shards(tmp_path, "train")
    assert [p.name for p in shards] == [f"train-0000{k}-of-00003" for k in range(3)]
    sequential = [r for p in shards for r in read_tfrecords(p)]
    by_index = RecordShards(shards)
    assert len(by_index) == len(sequential) == 18
    order = np.random.default_rng(0).permutation(18).tolist()
    assert [by_index.read(i) for i in order] == [sequential[i] for i in order]
    second = RecordShards([shards[1]]).indexes[0].offsets[1]
    assert by_index.describe(8) == f"TFRecord file {shards[1]}: record 1 at byte {second}"
