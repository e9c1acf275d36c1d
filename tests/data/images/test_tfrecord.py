"""The ImageNet TFRecord source (``stoker.data.images.tfrecord``): the same order, augmentation,
resume and sharding as image_folder, copies for workers, bad data named by shard, record and key,
records TensorFlow itself wrote, and the object boxes steering tf_cnn's crop."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.images import make_image_tree
from stoker.data import (
    DataError,
    ImageOptions,
    ReadOptions,
    image_folder,
    imagenet_tfrecords,
    tfrecord_io,
    write_imagenet_tfrecords,
    write_tfrecords,
)
from stoker.data.images.tfrecord import find_shards, imagenet_example, parse_imagenet_example
from stoker.data.tfrecord_index import RecordShards
from stoker.data.tfrecord_io import frame_record, make_example

TF_PYTHON = Path.home() / ".cache" / "stoker-peers" / "tfvenv" / "bin" / "python"


def batches(src: object, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    it = iter(src)  # type: ignore[call-overload]
    out = [next(it) for _ in range(n)]
    getattr(src, "close", lambda: None)()
    return out


def same(
    a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]], shift: int = 0
) -> bool:
    """Bitwise equal images and equal labels (``b``'s labels + ``shift``: records are 1-based)."""
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(lx, ly + shift) for (x, lx), (y, ly) in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("images"), classes=3, per_class=6, size=20)


@pytest.fixture(scope="module")
def records(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("records")
    write_imagenet_tfrecords(tree, out, num_shards=3)
    return out


# ---------------------------------------------------------------------------------- the source
def test_examples_keep_the_folder_images_with_1_based_labels(tree: Path, records: Path) -> None:
    example = parse_imagenet_example(RecordShards(find_shards(records, "train")).read(6), "x")
    assert example.label == 2 and example.bbox is None  # class_1's first file
    assert example.data == (tree / "class_1" / "img_000.jpg").read_bytes()
    boxed = parse_imagenet_example(imagenet_example(b"jpeg", 5, bbox=[(0.1, 0.2, 0.6, 0.9)]), "y")
    assert boxed.bbox is not None and boxed.bbox.dtype == np.float32
    assert np.array_equal(boxed.bbox, np.float32([[0.1, 0.2, 0.6, 0.9]]))


@pytest.mark.parametrize("train", [True, False])
def test_same_order_augmentation_and_batches_as_image_folder(tree: Path, records: Path, train: bool) -> None:
    read, image = ReadOptions(batch_size=4, seed=5), ImageOptions(image_size=8)
    ours = batches(imagenet_tfrecords(records, read=read, image=image, train=train, split="train"), 9 if train else 5)
    folder = batches(
        image_folder(tree, read=read, image=image, train=train), 9 if train else 5
    )  # 9: past an epoch of 4
    assert same(ours, folder, shift=1)
    if train:
        assert not torch.equal(ours[0][0], ours[4][0])  # epochs reshuffle


def _resume(make: object, total: int, cut: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    first_src = make()  # type: ignore[operator]
    first = batches(first_src, cut)
    state = json.loads(json.dumps(first_src.state_dict()))
    second = make()  # type: ignore[operator]
    second.load_state_dict(state)
    return first + batches(second, total - cut)


@pytest.mark.parametrize(("workers", "kind"), [(0, "auto"), (2, "process"), (2, "thread")])
def test_mid_epoch_resume_is_bitwise_the_uninterrupted_run(records: Path, workers: int, kind: str) -> None:
    def make() -> object:
        return imagenet_tfrecords(
            records,
            read=ReadOptions(batch_size=4, seed=2, num_workers=workers, worker_kind=kind),
            image=ImageOptions(image_size=8),
        )

    whole = batches(make(), 7)
    for cut in (2, 4, 5):  # mid-epoch, at the epoch boundary (4 batches), after it
        assert same(_resume(make, 7, cut), whole), cut


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_resharding_gives_the_examples_image_folder_gives(tree: Path, records: Path, before: int, after: int) -> None:
    def run(make: object) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        old = [make(num_shards=before, shard_index=r, batch_size=4 // before) for r in range(before)]  # type: ignore[operator]
        seen = [batches(s, 1) for s in old]
        states = [s.state_dict() for s in old]
        new = [make(num_shards=after, shard_index=r, batch_size=4 // after) for r in range(after)]  # type: ignore[operator]
        for s in new:
            s.load_state_dict(s.reshard_state_dict(states))
        return seen + [batches(s, 3) for s in new]

    def ours(**read: int) -> object:
        return imagenet_tfrecords(records, read=ReadOptions(seed=7, **read), image=ImageOptions(image_size=8))

    def folder(**read: int) -> object:
        return image_folder(tree, read=ReadOptions(seed=7, **read), image=ImageOptions(image_size=8))

    mine, theirs = run(ours), run(folder)
    assert all(same(a, b, shift=1) for a, b in zip(mine, theirs, strict=True))
    # and the resharded run goes on with exactly the examples one replica would have read
    whole = batches(
        imagenet_tfrecords(records, read=ReadOptions(seed=7, batch_size=4), image=ImageOptions(image_size=8)), 4
    )
    labels = sorted(torch.cat([lab for part in mine for _, lab in part]).tolist())
    assert labels == sorted(torch.cat([lab for _, lab in whole]).tolist())


def test_a_copy_for_a_spawned_worker_reads_the_same_without_the_open_files(records: Path) -> None:
    src = imagenet_tfrecords(records, read=ReadOptions(batch_size=4, seed=1), image=ImageOptions(image_size=8))
    src.records.read(0)
    assert src.records._fds  # the shard opened by the read
    copy = pickle.loads(pickle.dumps(src))
    assert not copy.records._fds and same(batches(copy, 2), batches(src, 2))


def test_a_copy_for_a_worker_thread_opens_its_own_files(records: Path) -> None:
    src = imagenet_tfrecords(records, read=ReadOptions(batch_size=4, seed=1), image=ImageOptions(image_size=8))
    src.records.read(0)
    view = src._thread_copy()
    assert view.records is not src.records and not view.records._fds  # closing one never closes the other's
    assert same(batches(view, 2), batches(src, 2))


def test_an_example_without_a_label_names_the_shard_record_and_key(tmp_path: Path) -> None:
    good = imagenet_example(b"\xff\xd8", 3)
    write_tfrecords(tmp_path / "train-00000-of-00001", [good, make_example({"image/encoded": b"\xff\xd8"})])
    src = imagenet_tfrecords(
        tmp_path, read=ReadOptions(batch_size=2), image=ImageOptions(image_size=8), train=False, split="train"
    )
    with pytest.raises(DataError) as e:
        src._encoded(1)
    shard = tmp_path / "train-00000-of-00001"
    offset = len(frame_record(good))
    assert str(e.value) == (
        f"imagenet_tfrecords: TFRecord file {shard}: record 1 at byte {offset}: "
        "the Example has no 'image/class/label' feature"
    )
    assert src._encoded(0).label == 3


def test_a_folder_without_shards_says_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"holds no train-\*-of-\* shards; .* should hold either TFRecord shards"):
        imagenet_tfrecords(tmp_path, read=ReadOptions(batch_size=2))


def _corrupt_record(records: Path, tmp_path: Path, record: int) -> Path:
    """A copy of ``records`` with one data byte of global record ``record`` flipped."""
    out = tmp_path / "bad"
    out.mkdir()
    for p in find_shards(records, "train"):
        (out / p.name).write_bytes(p.read_bytes())
    shards = RecordShards(find_shards(out, "train"))
    k, j = shards.locate(record)
    index = shards.indexes[k]
    raw = bytearray(index.path.read_bytes())
    raw[int(index.offsets[j]) + 12 + 100] ^= 0xFF
    index.path.write_bytes(raw)
    return out


def test_skipped_examples_are_counted_and_identical_after_a_resume(
    records: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = _corrupt_record(records, tmp_path, 9)

    def make(skip: bool = True) -> object:
        return imagenet_tfrecords(
            bad, read=ReadOptions(batch_size=4, seed=2, skip_bad_examples=skip), image=ImageOptions(image_size=8)
        )

    strict = make(skip=False)
    with pytest.raises(DataError, match=r"train-00001-of-00003: record 3 at byte \d+: corrupt data: data checksum"):
        batches(strict, 4)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        src = make()
        whole = batches(src, 8)  # two epochs: the bad example is met once in each
    met = [e for e in range(2) if 9 in src.epoch_order(e)[:16].tolist()]  # 16 of 18 read per epoch
    assert len(met) >= 1 and src.bad_examples_skipped == len(met)
    logged = [r.getMessage() for r in caplog.records if "skipped a bad example" in r.getMessage()]
    assert len(logged) == len(met) and all("train-00001-of-00003: record 3 at byte" in m for m in logged)
    assert same(_resume(make, 8, 3), whole) and same(_resume(make, 8, 5), whole)
    clean = batches(
        imagenet_tfrecords(records, read=ReadOptions(batch_size=4, seed=2), image=ImageOptions(image_size=8)), 8
    )
    differs = [i for i in range(8) if not same(whole[i : i + 1], clean[i : i + 1])]
    assert len(differs) == len(met)  # only the batches that held example 9


# ---------------------------------------------------------------------------------- TensorFlow
@pytest.mark.skipif(not TF_PYTHON.exists(), reason="the TensorFlow peer is not installed")
def test_records_tensorflow_wrote_read_the_same(tmp_path: Path, tree: Path) -> None:
    jpeg = (tree / "class_2" / "img_004.jpg").read_bytes()
    (tmp_path / "image.jpg").write_bytes(jpeg)
    script = """
import sys, tensorflow as tf
jpeg = open(sys.argv[1] + "/image.jpg", "rb").read()
with tf.io.TFRecordWriter(sys.argv[1] + "/train-00000-of-00001") as w:
    for label, boxes in ((7, ()), (1000, ((0.1, 0.2, 0.5, 0.75),))):
        f = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
             "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        for i, k in enumerate(("ymin", "xmin", "ymax", "xmax")):
            f["image/object/bbox/" + k] = tf.train.Feature(float_list=tf.train.FloatList(value=[b[i] for b in boxes]))
        w.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
with tf.io.TFRecordWriter(sys.argv[1] + "/plain") as w:
    w.write(b"hello")
# stoker's private-pool Example builds in a process that has TensorFlow's (no "duplicate symbol"):
# run example_class's own source here (the peer has no torch, so stoker.data cannot be imported)
import ast, functools, typing, collections.abc
fn = next(n for n in ast.parse(open(sys.argv[2]).read()).body if getattr(n, "name", "") == "example_class")
ns = {"functools": functools, "Any": typing.Any, "Sequence": collections.abc.Sequence}
exec(compile(ast.Module([fn], []), "example_class", "exec"), ns)
data = tf.train.Example(features=tf.train.Features(feature={"k": tf.train.Feature(
    int64_list=tf.train.Int64List(value=[5]))})).SerializeToString()
assert ns["example_class"]().FromString(data).features.feature["k"].int64_list.value[0] == 5
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
    io_module = Path(tfrecord_io.__file__)
    subprocess.run([str(TF_PYTHON), "-c", script, str(tmp_path), str(io_module)], check=True, env=env, timeout=300)
    assert (tmp_path / "plain").read_bytes() == frame_record(b"hello")
    src = imagenet_tfrecords(
        tmp_path, read=ReadOptions(batch_size=2), image=ImageOptions(image_size=8), train=False, split="train"
    )
    first, second = src._encoded(0), src._encoded(1)
    assert (first.data, first.label, first.bbox) == (jpeg, 7, None)
    assert second.label == 1000 and second.bbox is not None
    assert np.allclose(second.bbox, [[0.1, 0.2, 0.5, 0.75]])
    images, labels = next(iter(src))
    assert images.shape == (2, 3, 8, 8) and labels.tolist() == [7, 1000]


def test_the_object_boxes_steer_tf_cnns_training_crop(tree: Path, tmp_path: Path) -> None:
    from stoker.data.base import example_uniforms
    from stoker.data.images import TRAIN_DRAWS, sample_distorted_box

    jpeg = (tree / "class_0" / "img_000.jpg").read_bytes()  # 20 x 20
    box = [(0.05, 0.1, 0.3, 0.45)]  # a small object near the top left
    write_tfrecords(tmp_path / "train-00000-of-00001", [imagenet_example(jpeg, 1), imagenet_example(jpeg, 1, bbox=box)])
    src = imagenet_tfrecords(
        tmp_path, read=ReadOptions(batch_size=2, seed=3), image=ImageOptions(image_size=8, crop="tf_cnn")
    )
    u = example_uniforms(3, 0, list(range(20)), TRAIN_DRAWS)  # 20 draws of the uniforms
    wholes = [src._plan_example(0, row)[1].box for row in u]
    boxed = [src._plan_example(1, row)[1].box for row in u]
    assert wholes == [sample_distorted_box(20, 20, row, None) for row in u]
    assert boxed == [sample_distorted_box(20, 20, row, np.float32(box)) for row in u]
    assert boxed != wholes  # the box changed some crops
