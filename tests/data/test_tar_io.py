"""Tar shards in the WebDataset layout (``stoker.data.tar_io``): the writer and the reader agree,
shards split where asked and appear whole, the member index is cached and rebuilt when a shard
changes, a sample is read where it lies, and malformed shards are named by shard, member and byte."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from stoker.data import DataError, write_tar_shards
from stoker.data.tar_io import BAD_LABEL, NO_LABEL, TarShards, index_locations, split_name
from stoker.errors import ConfigError


def samples(n: int, payload: int = 100) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    return [
        {
            "__key__": f"dir/s{i:04d}",
            "jpg": rng.integers(0, 256, payload + i, dtype=np.uint8).tobytes(),
            "cls": i % 3,
            "json": {"i": i, "name": f"s{i}"},
            "txt": f"caption {i} é",
        }
        for i in range(n)
    ]


def reader(folder: Path, **kwargs: object) -> TarShards:
    return TarShards(sorted(folder.glob("*.tar")), progress=False, **kwargs)  # type: ignore[arg-type]


def test_split_name_is_webdatasets_key_rule() -> None:
    assert split_name("a/b.c/abc.seg.PNG") == ("a/b.c/abc", "seg.png")
    assert split_name("abc.jpg") == ("abc", "jpg")
    assert split_name("noext") is None


def test_written_samples_read_back_exactly_in_order(tmp_path: Path) -> None:
    given = samples(11)
    paths = write_tar_shards(tmp_path, given, samples_per_shard=4)
    assert [p.name for p in paths] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    with tarfile.open(paths[0]) as tar:  # a plain tar any tool reads, members grouped by key
        assert tar.getnames()[:4] == ["dir/s0000.jpg", "dir/s0000.cls", "dir/s0000.json", "dir/s0000.txt"]
    shards = reader(tmp_path)
    assert len(shards) == 11 and [len(i) for i in shards.indexes] == [4, 4, 3]
    for i, sample in enumerate(given):
        got = shards.sample(i)
        assert got["__key__"] == f"dir/s{i:04d}".encode()
        assert got["jpg"] == sample["jpg"]
        assert got["cls"] == str(i % 3).encode()
        assert json.loads(got["json"]) == sample["json"]
        assert got["txt"].decode() == sample["txt"]
    assert shards.labels().tolist() == [i % 3 for i in range(11)]


def test_shards_close_at_the_byte_limit_and_the_bytes_are_reproducible(tmp_path: Path) -> None:
    paths = write_tar_shards(tmp_path / "a", samples(20, payload=3000), max_shard_bytes=20_000)
    assert len(paths) > 3
    assert all(p.stat().st_size <= 20_000 for p in paths)
    assert sum(len(i) for i in reader(tmp_path / "a").indexes) == 20
    again = write_tar_shards(tmp_path / "b", samples(20, payload=3000), max_shard_bytes=20_000)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]  # no time or owner in the headers


def test_a_failed_write_leaves_only_whole_shards(tmp_path: Path) -> None:
    def broken():  # noqa: ANN202
        yield from samples(7)
        raise RuntimeError("the source of the samples failed")

    with pytest.raises(RuntimeError):
        write_tar_shards(tmp_path, broken(), samples_per_shard=5)
    assert sorted(os.listdir(tmp_path)) == ["shard-000000.tar"]  # the second shard's temporary file is gone
    assert len(reader(tmp_path)) == 5


@pytest.mark.parametrize(
    ("sample", "words"),
    [
        ({"__key__": "a.b", "jpg": b"x"}, "without a dot"),
        ({"jpg": b"x"}, "'__key__'"),
        ({"__key__": "a", "jpg": 1.5}, "'jpg' is a float"),
        ({"__key__": "a", "JPG": b"x"}, "lower-case"),
        ({"__key__": "a"}, "no members"),
    ],
)
def test_the_writer_refuses_samples_that_would_not_read_back(tmp_path: Path, sample: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        write_tar_shards(tmp_path, [sample])


def test_the_writer_refuses_old_shards_and_repeated_keys(tmp_path: Path) -> None:
    write_tar_shards(tmp_path, samples(2))
    with pytest.raises(ConfigError, match="already holds 1 shard-\\*.tar"):
        write_tar_shards(tmp_path, samples(2))
    with pytest.raises(ConfigError, match="two samples in a row have the key 'a'"):
        write_tar_shards(tmp_path / "new", [{"__key__": "a", "jpg": b"1"}, {"__key__": "a", "cls": 1}])


def test_the_index_is_cached_and_rebuilt_when_the_shard_changes(tmp_path: Path) -> None:
    (path,) = write_tar_shards(tmp_path, samples(3))
    first = reader(tmp_path).indexes[0]
    assert first.built and first.index_path == tmp_path / ".stoker-index" / "shard-000000.tar.tidx"
    second = reader(tmp_path).indexes[0]
    assert not second.built and second.names == first.names
    assert np.array_equal(second.offsets, first.offsets) and np.array_equal(second.labels, first.labels)
    path.unlink()
    write_tar_shards(tmp_path, samples(4))  # a different shard under the same name
    third = reader(tmp_path)
    assert third.indexes[0].built and len(third) == 4


def test_an_unwritable_folder_caches_the_index_in_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    write_tar_shards(tmp_path / "data", samples(2))
    (tmp_path / "data" / ".stoker-index").write_text("a file where the index folder would go")
    index = reader(tmp_path / "data").indexes[0]
    assert index.index_path == index_locations(index.shard)[1]
    assert index.index_path.is_relative_to(tmp_path / "cache") and index.index_path.is_file()
    assert not reader(tmp_path / "data").indexes[0].built


def test_a_sample_mid_shard_is_read_where_it_lies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tar_shards(tmp_path, samples(50, payload=2000))
    shards = reader(tmp_path)  # the index: built now, before the reads are counted
    reads: list[tuple[int, int]] = []
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        reads.append((n, offset))
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    got = shards.sample(37)
    index = shards.indexes[0]
    members = index.members(37)
    assert reads == [(int(index.sizes[m]), int(index.offsets[m])) for m in members]  # one pread per member
    assert sum(n for n, _ in reads) == sum(len(v) for k, v in got.items() if k != "__key__")


def test_labels_missing_or_not_integers_are_marked(tmp_path: Path) -> None:
    write_tar_shards(
        tmp_path, [{"__key__": "a", "jpg": b"1"}, {"__key__": "b", "cls": "x"}, {"__key__": "c", "cls": " 7\n"}]
    )
    assert reader(tmp_path).labels().tolist() == [NO_LABEL, BAD_LABEL, 7]


def corrupt(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("pax", [False, True])
def test_a_malformed_header_is_named_by_shard_member_and_byte(tmp_path: Path, pax: bool) -> None:
    given = samples(6)
    if pax:  # a long name: a PAX record, so tarfile reads this shard's headers
        given[0]["__key__"] = "long" * 30 + "/s"
    (path,) = write_tar_shards(tmp_path, given)
    index = reader(tmp_path).indexes[0]
    m = int(index.starts[3])  # the first member of sample 3: its header is the 512 bytes before its data
    header = int(index.offsets[m]) - 512
    corrupt(path, header, b"\xff" * 40)
    with pytest.raises(DataError) as e:
        reader(tmp_path)
    message = str(e.value)
    assert "\n" not in message
    assert f"tar shard {path}: malformed member header at byte {header} after member 'dir/s0002.txt'" in message
    lenient = reader(tmp_path, lenient=True)  # the samples before the break
    assert len(lenient) == 3 and lenient.sample(2)["__key__"] == b"dir/s0002"


def test_a_truncated_shard_and_a_non_tar_are_named(tmp_path: Path) -> None:
    (path,) = write_tar_shards(tmp_path / "t", samples(4, payload=3000))
    index = reader(tmp_path / "t").indexes[0]
    last = int(index.starts[3])
    path.write_bytes(path.read_bytes()[: int(index.offsets[last]) + 10])
    with pytest.raises(DataError, match=f"tar shard {path}: member 'dir/s0003.jpg' at byte .* is truncated"):
        reader(tmp_path / "t")
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "x.tar").write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(DataError, match="tar shard .*x.tar: not a tar file"):
        reader(tmp_path / "n")


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_fast_header_scan_indexes_as_tarfile_does(tmp_path: Path, fmt: int) -> None:
    from stoker.data.tar_io import _scan, _scan_tarfile, _scan_ustar

    path = tmp_path / "x.tar"
    deep = "d" * 60 + "/" + "e" * 60  # over 100 bytes: ustar's prefix field, GNU's long name, PAX's path
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in [("a/", None), ("a/k1.jpg", b"x" * 700), ("a/k1.cls", b"4"), (f"{deep}/k2.jpg", b"y")]:
            info = tarfile.TarInfo(name.rstrip("/"))
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with open(path, "rb") as f:
        fast, slow = _scan_ustar(f.fileno(), "x"), _scan_tarfile(f, "x")
    # ustar splits the long name into its prefix field, read here; GNU's long names and PAX
    # records are left to tarfile.
    assert (fast is not None) == (fmt == tarfile.USTAR_FORMAT)
    scan, error = _scan(path, "x")
    assert error is None and slow[1] is None and (fast is None or fast[0].__dict__ == scan.__dict__)
    assert scan.names == slow[0].names == ["a/k1.jpg", "a/k1.cls", f"{deep}/k2.jpg"]
    assert (scan.offsets, scan.sizes, scan.starts, scan.labels) == (
        slow[0].offsets,
        slow[0].sizes,
        slow[0].starts,
        slow[0].labels,
    )
