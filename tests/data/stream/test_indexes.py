"""Shard indexes kept beside the shards on the object store (a real S3-protocol server: moto on
loopback, s3fs as the client): a new machine (an empty stream cache) reads the index objects and
fetches only the shards its batches need; a replaced shard is indexed again, never read with its
old index; a store that refuses the index's PUT still reads, indexes kept in the machine's cache."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import s3fs
import torch

import stoker
from helpers.images import make_image_tree
from stoker.data import ReadOptions
from stoker.data.images import auto_decoder
from stoker.data.images.tar_shards import find_tar_shards
from stoker.data.images.tfrecord import shard_files
from stoker.data.stream import DataFile, StreamOptions
from stoker.data.stream import indexes as store_indexes
from stoker.data.tar_io import TarShards
from stoker.data.tfrecord_index import RecordShards
from stoker.storage import RetryPolicy


def _upload(folder: Path, url: str) -> None:
    fs = fsspec.filesystem("s3")
    for p in sorted(folder.glob("train-*")):
        fs.put_file(str(p), f"{url.removeprefix('s3://')}/{p.name}")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 TFRecord shards of 12 records (36 16 px JPEGs in 3 classes)."""
    tree = make_image_tree(tmp_path_factory.mktemp("tree"), classes=3, per_class=12, size=16)
    out = tmp_path_factory.mktemp("shards")
    stoker.data.write_imagenet_tfrecords(tree, out, num_shards=3)
    return out


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """Every S3 request from now on: ``(method, key, ranged)`` (s3fs's one funnel, ``_call_s3``)."""
    calls: list[tuple[str, str, bool]] = []
    real = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append((method, kwargs.get("Key", ""), "Range" in kwargs))
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return calls


def _source(data: str | Path, cache: Path, **stream: object) -> stoker.data.TFRecordImageSource:
    options = StreamOptions(cache_dir=cache, read_ahead_bytes=0, **stream)  # type: ignore[arg-type]
    read = ReadOptions(batch_size=4, shuffle=False, stream=options)
    image = stoker.data.ImageOptions(image_size=16)  # decoder="auto": the probe reads 16 examples
    return stoker.data.imagenet_tfrecords(data, read=read, image=image, num_classes=4)


def _first(source: stoker.data.TFRecordImageSource, n: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    it: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(source)
    return [next(it) for _ in range(n)]


def _same(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


def test_a_new_machine_reads_the_stored_indexes_and_fetches_only_the_shards_a_batch_needs(
    s3_env, shards, tmp_path, requests
):
    _upload(shards, "s3://bucket/new")
    first = _source("s3://bucket/new", tmp_path / "machine-a")  # the first machine indexes and shares
    assert all(index.built for index in first.records.indexes)
    stored = sorted(fsspec.filesystem("s3").ls("bucket/new/.stoker-index"))
    assert [p.rsplit("/", 1)[1] for p in stored] == [f"train-0000{k}-of-00003.idx" for k in range(3)]
    requests.clear()
    fresh = _source("s3://bucket/new", tmp_path / "machine-b")  # a new machine: an empty cache
    batches = iter(fresh)
    read = [next(batches)]
    assert not any(index.built for index in fresh.records.indexes)
    gets = [(key, ranged) for method, key, ranged in requests if method == "get_object"]
    assert sorted(key for key, ranged in gets if key.startswith("new/.stoker-index/")) == [
        f"new/.stoker-index/train-0000{k}-of-00003.idx" for k in range(3)
    ]
    whole = [key for key, ranged in gets if not ranged and not key.startswith("new/.stoker-index/")]
    assert whole == ["new/train-00000-of-00003"]  # batch 0 (records 0-3) is in shard 0 only
    assert fresh.records.files.cache.fetched == 1
    if len(auto_decoder.candidates()) >= 2:  # the probe read its 16 examples by ranged requests
        assert sum(ranged and ".stoker-index/" not in key for key, ranged in gets) >= 10
    assert not any(method == "put_object" for method, _, _ in requests)  # found there: not written again
    assert not any(method == "head_object" and ".stoker-index/" in key for method, key, _ in requests)
    read += [next(batches), next(batches)]
    assert _same(read, _first(_source(shards, tmp_path / "local"), 3))


def test_a_replaced_shard_is_indexed_again_never_read_with_its_old_index(s3_env, shards, tmp_path):
    _upload(shards, "s3://bucket/changed")
    _source("s3://bucket/changed", tmp_path / "machine-a")  # indexes of the old shards on the store
    fs = fsspec.filesystem("s3")
    fs.put_file(str(shards / "train-00000-of-00003"), "bucket/changed/train-00001-of-00003")  # new ETag
    records = RecordShards(
        shard_files("s3://bucket/changed", "train"),
        stream=StreamOptions(cache_dir=tmp_path / "machine-b"),
        progress=False,
    )
    assert [index.built for index in records.indexes] == [False, True, False]
    assert [records.read(12 + j) for j in range(12)] == [records.read(j) for j in range(12)]
    again = RecordShards(records.files.files, stream=StreamOptions(cache_dir=tmp_path / "machine-c"), progress=False)
    assert not any(index.built for index in again.indexes)  # the store's index was replaced by the new one


def test_a_store_that_refuses_the_index_put_still_reads_with_the_machines_cache(
    s3_env, shards, tmp_path, requests, monkeypatch, caplog
):
    _upload(shards, "s3://bucket/readonly")
    files = shard_files("s3://bucket/readonly", "train")
    requests.clear()
    RecordShards(files, stream=StreamOptions(cache_dir=tmp_path / "off", store_indexes=False), progress=False)
    assert not any(method == "put_object" for method, _, _ in requests)
    real = s3fs.S3FileSystem._call_s3

    async def denied(self, method, *args, **kwargs):  # noqa: ANN001, ANN202
        if method == "put_object":
            raise PermissionError("Access Denied")
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", denied)
    monkeypatch.setattr(store_indexes, "_refused", set())
    with caplog.at_level(logging.INFO, logger="stoker"):
        remote = _source("s3://bucket/readonly", tmp_path / "machine")
    assert caplog.text.count("kept in this machine's stream cache only") == 1
    assert not fsspec.filesystem("s3").exists("bucket/readonly/.stoker-index")
    assert _same(_first(remote, 3), _first(_source(shards, tmp_path / "local"), 3))
    again = _source("s3://bucket/readonly", tmp_path / "machine")  # the machine's cache holds them
    assert not any(index.built for index in again.records.indexes) and again.records.files.cache.fetched == 0


def test_tar_shard_indexes_on_the_store_spare_a_new_machine_every_fetch(s3_env, tmp_path):
    tree = make_image_tree(tmp_path / "tree", classes=2, per_class=6, size=8)
    stoker.data.write_image_tar_shards(tree, "s3://bucket/tars", samples_per_shard=4)
    urls = find_tar_shards("s3://bucket/tars")
    first = TarShards(urls, stream=StreamOptions(cache_dir=tmp_path / "a"), progress=False)
    assert all(index.built for index in first.indexes) and first.files.cache.fetched == 3
    fresh = TarShards(urls, stream=StreamOptions(cache_dir=tmp_path / "b"), progress=False)
    assert not any(index.built for index in fresh.indexes) and fresh.files.cache.fetched == 0
    assert fresh.sample(5) == first.sample(5) and fresh.files.cache.fetched == 1
    assert (fresh.labels() == first.labels()).all()
    read = ReadOptions(batch_size=4, stream=StreamOptions(cache_dir=tmp_path / "c"))  # decoder="auto"'s probe
    source = stoker.data.tar_shards("s3://bucket/tars", read=read, image=stoker.data.ImageOptions(image_size=8))
    assert source.samples.files.cache.fetched == 0  # its 12 examples read by ranged requests, no shard fetched


def test_no_index_is_shared_for_an_object_without_a_version(s3_env, requests):
    unversioned = DataFile("s3://bucket/any/train-00000-of-00001", 10, "")  # a store that gives none
    assert store_indexes.read_store_index(unversioned, ".idx", RetryPolicy()) is None
    assert not store_indexes.write_store_index(unversioned, ".idx", b"index", RetryPolicy())
    assert requests == []  # a replaced object of the same size could not be told from the old one
