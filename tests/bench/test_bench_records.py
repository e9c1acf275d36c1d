"""``stoker bench --data_dir`` picks TFRecord shards, tar shards or an image folder by what the folder holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_main
from helpers.images import make_image_tree
from stoker.data import write_image_tar_shards, write_imagenet_tfrecords

BENCH = ["bench", "--model=trivial", "--batch_size=4", "--num_batches=2", "--num_warmup_batches=0", "--device=cpu"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("folder"), classes=2, per_class=6, size=16)


def test_bench_trains_on_tfrecord_shards(capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path) -> None:
    write_imagenet_tfrecords(folder, tmp_path, num_shards=2)
    code, out, err = run_main(capsys, *BENCH, f"--data_dir={tmp_path}", "--datasets_num_private_threads=1")
    assert code == 0, err
    assert "Dataset:     imagenet (TFRecord shards)" in out.splitlines()
    assert "total images/sec:" in out
    assert (tmp_path / ".stoker-index" / "train-00000-of-00002.idx").exists()


def test_bench_trains_and_evaluates_on_tar_shards(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    write_image_tar_shards(folder, tmp_path, samples_per_shard=5)  # train-000000.tar ...
    small = make_image_tree(tmp_path / "small", classes=2, per_class=3, size=16)
    write_image_tar_shards(small, tmp_path, prefix="validation", samples_per_shard=5)
    train = tmp_path / "train"
    code, out, err = run_main(capsys, *BENCH, f"--data_dir={tmp_path}", f"--train_dir={train}")
    assert code == 0, err
    assert "Dataset:     imagenet (tar shards)" in out.splitlines() and "total images/sec:" in out
    assert (tmp_path / ".stoker-index" / "train-000000.tar.tidx").exists()
    one_pass = [flag for flag in BENCH if not flag.startswith("--num_batches")]
    code, out, err = run_main(capsys, *one_pass, f"--data_dir={tmp_path}", f"--train_dir={train}", "--eval")
    assert code == 0, err
    assert "[6 examples]" in out  # one pass over the validation shards, not the 12 training samples


def test_bench_names_the_image_folder_layout(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    code, out, err = run_main(capsys, *BENCH, f"--data_dir={folder}", "--nouse_datasets")
    assert code == 0, err
    assert "Dataset:     imagenet (image folder)" in out.splitlines()


def test_bench_refuses_empty_and_mixed_folders_saying_what_it_expects(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    expected = "should hold either TFRecord shards named train-*-of-* / validation-*-of-*"
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_main(capsys, *BENCH, f"--data_dir={empty}")
    assert code == 2 and "no TFRecord shards, and not an image folder" in err and expected in err
    mixed = tmp_path / "mixed"
    make_image_tree(mixed, classes=2, per_class=2, size=8)
    write_imagenet_tfrecords(folder, mixed, num_shards=1)
    code, _, err = run_main(capsys, *BENCH, f"--data_dir={mixed}")
    assert code == 2 and "holds both train-*-of-* TFRecord shards and folders of images" in err and expected in err


def test_bench_reads_tfrecord_and_tar_shards_and_cifar_from_s3(
    s3_env: dict[str, str], capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    """``--data_dir=s3://...`` (a real S3-protocol server, moto) works as a local folder does."""
    import fsspec

    fs = fsspec.filesystem("s3")
    for shard in write_imagenet_tfrecords(folder, tmp_path / "tfr", num_shards=2):
        fs.put_file(str(shard), f"bucket/bench-tfr/{shard.name}")
    code, out, err = run_main(capsys, *BENCH, "--data_dir=s3://bucket/bench-tfr", "--datasets_num_private_threads=1")
    assert code == 0, err
    assert "Dataset:     imagenet (TFRecord shards)" in out.splitlines() and "total images/sec:" in out
    records = np.zeros((8, 3073), np.uint8)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        fs.pipe_file(f"bucket/bench-cifar/cifar-10-batches-bin/{name}", records.tobytes())
    code, out, err = run_main(capsys, *BENCH, "--data_dir=s3://bucket/bench-cifar")
    assert code == 0, err
    assert "Dataset:     cifar10" in out.splitlines() and "total images/sec:" in out
    for shard in write_image_tar_shards(folder, tmp_path / "tar", samples_per_shard=5):
        fs.put_file(str(shard), f"bucket/bench-tar/{shard.name}")
    code, out, err = run_main(capsys, *BENCH, "--data_dir=s3://bucket/bench-tar")
    assert code == 0, err
    assert "Dataset:     imagenet (tar shards)" in out.splitlines() and "total images/sec:" in out
    code, _, err = run_main(capsys, *BENCH, "--data_dir=s3://bucket/nothing")
    assert code == 2 and "--data_dir=s3://bucket/nothing: no objects under this prefix" in err
