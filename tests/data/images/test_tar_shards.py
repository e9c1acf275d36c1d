"""The tar shard source (``stoker.data.images.tar_shards``): the image folder written as shards
reads back as the same batches (keys, labels, decoded and augmented pixels), the resume mid-shard
is exact (state_dict round trip and a kill -9 rerun), workers change nothing, and a sample
without a label or an image is named by shard and member in one line."""

from __future__ import annotations

import json
import pickle
import random
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import torch

from helpers.images import make_image_tree
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, popen, python_env, run_process
from stoker.data import DataError, ImageOptions, ReadOptions, image_folder, tar_shards, write_tar_shards
from stoker.data.images.tar_shards import split_of, write_image_tar_shards
from stoker.errors import ConfigError

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def batches(src: object, n: int) -> Batches:
    it = iter(src)  # type: ignore[call-overload]
    out = [next(it) for _ in range(n)]
    getattr(src, "close", lambda: None)()
    return out


def same(a: Batches, b: Batches) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(lx, ly) for (x, lx), (y, ly) in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("images"), classes=3, per_class=6, size=20)


@pytest.fixture(scope="module")
def shards(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_image_tar_shards(tree, out, samples_per_shard=5)  # 18 samples: 4 shards, batches straddle them
    return out


def test_the_shards_hold_the_folder_files_keys_and_labels(tree: Path, shards: Path) -> None:
    paths = sorted(shards.glob("*.tar"))
    assert [p.name for p in paths] == [f"train-00000{k}.tar" for k in range(4)]
    with tarfile.open(paths[1]) as tar:
        assert tar.getnames()[:2] == ["class_0/img_005.jpg", "class_0/img_005.cls"]
        assert tar.extractfile("class_0/img_005.jpg").read() == (tree / "class_0" / "img_005.jpg").read_bytes()  # type: ignore[union-attr]
        assert tar.extractfile("class_1/img_000.cls").read() == b"1"  # type: ignore[union-attr]
    src = tar_shards(shards, read=ReadOptions(batch_size=4), train=False)
    assert src.num_classes == 3 and src.classes == ["0", "1", "2"] and src.num_examples == 18


@pytest.mark.parametrize("train", [True, False])
def test_same_order_augmentation_and_pixels_as_image_folder(tree: Path, shards: Path, train: bool) -> None:
    read = ReadOptions(batch_size=4, seed=5)
    image = ImageOptions(image_size=8, output="uint8", distortions=train)
    n = 9 if train else 5  # 9: past an epoch of 4
    ours = batches(tar_shards(shards, read=read, image=image, train=train), n)
    theirs = batches(image_folder(tree, read=read, image=image, train=train), n)
    assert len(ours) == n
    for (x, lx), (y, ly) in zip(ours, theirs, strict=True):
        if train:  # uint8 images and the colour parameters of each example
            assert torch.equal(x["images"], y["images"]) and torch.equal(x["color"], y["color"])
        else:
            assert torch.equal(x, y)
        assert torch.equal(lx, ly)


def _resume(make: object, total: int, cut: int) -> Batches:
    first_src = make()  # type: ignore[operator]
    first = batches(first_src, cut)
    state = json.loads(json.dumps(first_src.state_dict()))
    second = make()  # type: ignore[operator]
    second.load_state_dict(state)
    return first + batches(second, total - cut)


@pytest.mark.parametrize(("workers", "kind"), [(0, "auto"), (2, "process"), (2, "thread")])
def test_mid_shard_resume_and_workers_give_bitwise_the_same_batches(shards: Path, workers: int, kind: str) -> None:
    def make(num_workers: int = workers) -> object:
        read = ReadOptions(batch_size=4, seed=2, num_workers=num_workers, worker_kind=kind)
        return tar_shards(shards, read=read, image=ImageOptions(image_size=8))

    whole = batches(make(num_workers=0), 7)
    assert same(batches(make(), 7), whole)  # N workers: the batches of none
    for cut in (2, 4, 5):  # mid-epoch, at the epoch boundary (4 batches), after it
        assert same(_resume(make, 7, cut), whole), cut


def test_copies_for_workers_read_the_same_with_their_own_files(shards: Path) -> None:
    src = tar_shards(shards, read=ReadOptions(batch_size=4, seed=1), image=ImageOptions(image_size=8))
    src._encoded(0)
    assert src.samples._fds
    spawned, thread = pickle.loads(pickle.dumps(src)), src._thread_copy()
    assert not spawned.samples._fds and thread.samples is not src.samples and not thread.samples._fds
    ref = batches(src, 2)
    assert same(batches(spawned, 2), ref) and same(batches(thread, 2), ref)


def _write(folder: Path, *samples: dict[str, object]) -> Path:
    (path,) = write_tar_shards(folder, samples)
    return path


def test_a_sample_without_a_label_is_named_by_shard_and_member_in_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, {"__key__": "a", "jpg": b"\xff\xd8", "cls": 0}, {"__key__": "b", "jpg": b"\xff\xd8"})
    with pytest.raises(DataError) as e:
        tar_shards(tmp_path, read=ReadOptions(batch_size=1))
    offset = tar_shards(tmp_path, read=ReadOptions(batch_size=1, skip_bad_examples=True)).samples.indexes[0].offsets[2]
    assert str(e.value) == (
        f"tar_shards: tar shard {path}: member 'b.jpg' at byte {offset}: its sample has no .cls member"
    )


@pytest.mark.parametrize(
    ("second", "words"),
    [
        ({"__key__": "b", "cls": 1}, r"member 'b.cls' at byte \d+: its sample has no image member \(.jpg, .jpeg"),
        ({"__key__": "b", "jpg": b"x", "cls": "one"}, r"member 'b.cls' at byte \d+: not a class index"),
        ({"__key__": "b", "jpg": b"x", "cls": 5}, r"member 'b.cls' at byte \d+: label 5 is outside \[0, 2\)"),
    ],
)
def test_bad_samples_are_named_and_skipped_identically(tmp_path: Path, second: dict, words: str) -> None:
    path = _write(tmp_path, {"__key__": "a", "jpg": b"x", "cls": 1}, second)
    src = tar_shards(tmp_path, read=ReadOptions(batch_size=1, skip_bad_examples=True), num_classes=2, train=False)
    with pytest.raises(DataError, match=f"^tar_shards: tar shard {path}: {words}"):
        src._encoded(1)
    assert src._encoded(0).label == 1


def test_a_folder_without_shards_or_labels_says_so(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"holds no \*.tar shards"):
        tar_shards(tmp_path, read=ReadOptions(batch_size=2))
    _write(tmp_path, {"__key__": "a", "jpg": b"x"})
    with pytest.raises(DataError, match=r"no sample of .* has a .cls member"):
        tar_shards(tmp_path, read=ReadOptions(batch_size=2))


def test_the_splits_are_found_by_name(tmp_path: Path) -> None:
    for name in ("train", "validation"):
        write_tar_shards(tmp_path, [{"__key__": "a", "cls": 0}], prefix=name)
    assert (split_of(tmp_path, True), split_of(tmp_path, False)) == ("train", "validation")
    assert split_of(tmp_path / "none", False) is None


# ------------------------------------------------------------------ kill -9 and rerun (test_object_store_data.py's)
MAX_STEPS = 24  # the script's: 18 samples in batches of 8 make 2 batches an epoch, so runs cross epochs and shards


def _command(model_dir: Path, data: str | Path, cache: Path, *extra: str) -> list[str]:
    script = str(SCRIPTS / "stream_train_script.py")
    return [PYTHON, script, "--model_dir", str(model_dir), "--data", str(data), "--cache", str(cache), *extra]


def _final_weights(model_dir: Path) -> bytes:
    """The tensor bytes of the final checkpoint (the safetensors header's order varies by process)."""
    raw = (model_dir / f"ckpt-{MAX_STEPS}" / "model.safetensors").read_bytes()
    return raw[8 + int.from_bytes(raw[:8], "little") :]


@pytest.mark.slow  # ~25 s: two tiny trainings in real processes, with worker processes
@pytest.mark.parametrize("where", ["local", "s3"])
def test_kill_9_mid_shard_then_rerun_is_bitwise_an_uninterrupted_local_run(
    request: pytest.FixtureRequest, shards: Path, tmp_path: Path, where: str
) -> None:
    data: str | Path = shards
    if where == "s3":
        import fsspec

        request.getfixturevalue("s3_env")
        for p in sorted(shards.glob("*.tar")):
            fsspec.filesystem("s3").put_file(str(p), f"bucket/crash/{p.name}")
        data = "s3://bucket/crash"
    env = python_env()
    ref = in_background(_command(tmp_path / "ref", shards, tmp_path / "ref-cache"), env=env)
    crashed = tmp_path / "crashed"
    argv = _command(crashed, data, tmp_path / "cache", "--sleep", "0.1")
    proc = popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (crashed / "checkpoint.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    time.sleep(random.uniform(0.0, 0.2))
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (crashed / f"ckpt-{MAX_STEPS}").exists(), "the run finished before the kill; slow it down"
    done = run_process(argv[:-2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resumed from {crashed}" in done.stderr
    finished(ref)
    assert _final_weights(crashed) == _final_weights(tmp_path / "ref")


# ------------------------------------------------------------------ shards on S3 (moto on loopback)
def test_shards_written_to_s3_read_and_resume_as_the_local_ones(
    s3_env: None, tree: Path, shards: Path, tmp_path: Path
) -> None:
    import fsspec

    from stoker.data.stream import StreamOptions

    written = write_image_tar_shards(tree, "s3://bucket/tars", samples_per_shard=5)
    assert [str(p) for p in written] == [f"s3://bucket/tars/train-00000{k}.tar" for k in range(4)]
    fs = fsspec.filesystem("s3")
    assert [fs.cat_file(f"bucket/tars/{p.name}") for p in written] == [
        p.read_bytes() for p in sorted(shards.glob("*.tar"))
    ]
    with pytest.raises(ConfigError, match="s3://bucket/tars already holds 4 train-"):
        write_image_tar_shards(tree, "s3://bucket/tars")
    stream = StreamOptions(cache_dir=tmp_path / "cache")

    def make(data: str | Path, workers: int = 0) -> object:
        read = ReadOptions(batch_size=4, seed=2, num_workers=workers, worker_kind="process", stream=stream)
        return tar_shards(data, read=read, image=ImageOptions(image_size=8))

    local = batches(make(shards), 6)
    remote = make("s3://bucket/tars")
    assert remote.samples.remote and remote.samples.indexes[0].index_path.is_relative_to(tmp_path / "cache")  # type: ignore[attr-defined]
    assert same(batches(remote, 6), local)
    assert same(_resume(lambda: make("s3://bucket/tars", workers=2), 6, 3), local)  # mid-shard, in workers
    again = make("s3://bucket/tars")  # a restart: the indexes and the shards come from the cache
    assert not any(i.built for i in again.samples.indexes) and again.samples.files.cache.fetched == 0  # type: ignore[attr-defined]
    with pytest.raises(DataError, match="s3://bucket/none holds no \\*.tar shards"):
        make("s3://bucket/none")
