"""File-based sources read from object storage (a real S3-protocol server: moto on loopback,
s3fs as the client) equal the same sources read from local disk: TFRecord shards, CIFAR-10
binaries, text; the TFRecord offset index built once per shard set; a kill -9 mid-epoch and a
rerun on s3:// data bitwise equal to an uninterrupted run over the local copy."""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import time
from pathlib import Path

import fsspec
import pytest
import torch

import stoker
from helpers.images import make_image_tree, write_cifar
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, popen, python_env, run_process
from stoker.data import ReadOptions
from stoker.data.stream import StreamOptions

SCRIPT = SCRIPTS / "stream_train_script.py"


def _upload(folder: Path, url: str) -> None:
    fs = fsspec.filesystem("s3")
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts):
            fs.put_file(str(p), f"{url.removeprefix('s3://')}/{p.relative_to(folder).as_posix()}")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = make_image_tree(tmp_path_factory.mktemp("tree"), classes=3, per_class=12, size=16)
    out = tmp_path_factory.mktemp("shards")
    stoker.data.write_imagenet_tfrecords(tree, out, num_shards=3)
    return out


def _batches(source, n: int) -> list:  # noqa: ANN001
    it = iter(source)
    return [next(it) for _ in range(n)]


def _same(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


def test_tfrecords_from_s3_equal_local_and_are_indexed_once(s3_env, shards, tmp_path):
    _upload(shards, "s3://bucket/tfr")
    stream = StreamOptions(cache_dir=tmp_path / "cache")
    image = stoker.data.ImageOptions(image_size=16)

    def source(data: str | Path, **read: object) -> stoker.data.TFRecordImageSource:
        options = ReadOptions(batch_size=5, seed=7, stream=stream, **read)  # type: ignore[arg-type]
        return stoker.data.imagenet_tfrecords(data, read=options, image=image, num_classes=4)

    expected = _batches(source(shards), 9)  # past the end of the first epoch (7 batches)
    remote = source("s3://bucket/tfr")
    assert remote.num_examples == 36
    assert all(index.built for index in remote.records.indexes)
    assert _same(_batches(remote, 9), expected)
    assert "s3://bucket/tfr/train-00001-of-00003: record 2" in remote.records.describe(14)
    # Another process (or a restart) of this machine: the indexes and the shards come from the cache.
    again = source("s3://bucket/tfr", num_workers=2, worker_kind="process")
    assert not any(index.built for index in again.records.indexes) and again.records.files.cache.fetched == 0
    assert _same(_batches(again, 9), expected)


def test_a_cache_smaller_than_the_shards_is_said_and_still_reads_them(s3_env, shards, tmp_path, caplog):
    _upload(shards, "s3://bucket/small")
    size = sum(p.stat().st_size for p in shards.glob("train-*"))
    stream = StreamOptions(cache_dir=tmp_path / "cache", cache_limit=size // 2)
    read = ReadOptions(batch_size=6, seed=1, stream=stream)
    image = stoker.data.ImageOptions(image_size=16)
    with caplog.at_level("WARNING", logger="stoker"):
        remote = stoker.data.imagenet_tfrecords("s3://bucket/small", read=read, image=image, num_classes=4)
    assert "exceed the stream cache's limit" in caplog.text
    local = stoker.data.imagenet_tfrecords(shards, read=read, image=image, num_classes=4)
    assert _same(_batches(remote, 8), _batches(local, 8))  # evicted shards are fetched again
    assert remote.records.files.cache.held_bytes() <= size // 2


def test_tfrecord_shards_are_fetched_ahead_of_their_batches(s3_env, shards, tmp_path):
    _upload(shards, "s3://bucket/ahead")
    stream = StreamOptions(cache_dir=tmp_path / "cache")
    read = ReadOptions(batch_size=4, shuffle=False, stream=stream)
    source = stoker.data.imagenet_tfrecords("s3://bucket/ahead", read=read, num_classes=4, train=True)
    files = source.records.files
    for k in range(len(files)):
        files.cache.path_of(files.files[k]).unlink()  # indexed and cached; now evicted
    source.batch_indices(0, 0)  # batch 0 is in shard 0; the next 8 batches reach shards 1 and 2
    deadline = time.monotonic() + 30
    while not all(files.cached(k) for k in range(len(files))):
        assert time.monotonic() < deadline, "the read-ahead fetched nothing"
        time.sleep(0.02)


def test_cifar_and_text_from_s3_equal_local(s3_env, tmp_path):
    cifar = write_cifar(tmp_path / "cifar" / "cifar-10-batches-bin", per_file=6)
    _upload(tmp_path / "cifar", "s3://bucket/cifar")
    stream = StreamOptions(cache_dir=tmp_path / "cache")
    read = ReadOptions(batch_size=4, seed=2, stream=stream)
    local = stoker.data.cifar_binary(cifar.parent, read=read)
    remote = stoker.data.cifar_binary("s3://bucket/cifar", read=read)
    assert torch.equal(remote.images, local.images) and _same(_batches(remote, 10), _batches(local, 10))
    missing = "s3://bucket/cifar/cifar-10-batches-bin"
    fsspec.filesystem("s3").rm_file(f"{missing.removeprefix('s3://')}/test_batch.bin")
    with pytest.raises(stoker.data.DataError, match=r"cifar_binary: s3://bucket/cifar lacks test_batch.bin"):
        stoker.data.cifar_binary("s3://bucket/cifar", read=read, train=False)

    text = tmp_path / "text"
    (text / "b").mkdir(parents=True)
    (text / "a.txt").write_bytes(bytes(range(256)) * 3)
    (text / "b" / "c.txt").write_bytes(b"stoker " * 90)
    (text / "b" / "skip.md").write_bytes(b"#" * 500)
    _upload(text, "s3://bucket/text")
    text_read = ReadOptions(batch_size=2, num_epochs=1, stream=stream)
    local_text = stoker.data.text_chars(text, seq_len=16, read=text_read, extensions=(".txt",))
    remote_text = stoker.data.text_chars("s3://bucket/text", seq_len=16, read=text_read, extensions=(".txt",))
    assert remote_text.num_examples == local_text.num_examples == 768 + 630
    assert _same(list(remote_text), list(local_text))


def _command(model_dir: Path, data: str | Path, cache: Path, *extra: str) -> list[str]:
    return [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--data", str(data), "--cache", str(cache), *extra]


def _final_weights(model_dir: Path, step: int) -> tuple[dict, bytes]:
    raw = (model_dir / f"ckpt-{step}" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


@pytest.mark.slow  # three training processes: ~20 s
def test_kill_9_mid_epoch_on_s3_data_then_rerun_equals_a_local_run(s3_env, shards, tmp_path):
    _upload(shards, "s3://bucket/crash")
    env = python_env()
    ref = in_background(_command(tmp_path / "ref", shards, tmp_path / "ref-cache"), env=env)
    crashed = tmp_path / "crashed"
    argv = _command(crashed, "s3://bucket/crash", tmp_path / "cache", "--sleep", "0.05")
    proc = popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (crashed / "checkpoint.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    time.sleep(0.2)  # mid-epoch: 36 examples make 4 batches of 8 an epoch, checkpoints every 3 steps
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (crashed / "ckpt-24").exists(), "the run finished before the kill; slow it down"
    done = run_process(argv[:-2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resumed from {crashed}" in done.stderr
    finished(ref)
    assert _final_weights(crashed, 24) == _final_weights(tmp_path / "ref", 24)
