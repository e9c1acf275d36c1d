"""Bad data fails loudly, naming the file; skip_bad_examples replaces it deterministically."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from helpers.images import make_image_tree, write_cifar
from stoker.data import DataError, ImageOptions, ReadOptions, cifar_binary, image_folder, text_chars
from stoker.data.images import IMAGENET_MEAN, IMAGENET_STD, ImagePreprocessor
from stoker.errors import CheckpointMismatchError, ConfigError


def corrupt(path: Path, how: str) -> Path:
    data = path.read_bytes()
    path.write_bytes(b"this is not an image" * 10 if how == "garbage" else data[: len(data) // 2])
    return path


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_corrupt_jpeg_names_the_file(tmp_path: Path, workers: int, how: str) -> None:
    root = make_image_tree(tmp_path, classes=2, per_class=4, size=32)
    bad = corrupt(root / "class_1" / "img_002.jpg", how)
    src = image_folder(root, read=ReadOptions(batch_size=8, num_workers=workers), image=ImageOptions(image_size=8))
    with pytest.raises(DataError, match=f"cannot read image {bad}"):
        next(iter(src))
    src.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_bad_examples_replaces_with_the_next_example_and_logs(
    tmp_path: Path, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    root = make_image_tree(tmp_path, classes=2, per_class=4, size=16)
    bad = corrupt(root / "class_0" / "img_002.jpg", "garbage")  # example 2 in file order
    good = image_folder(
        make_image_tree(tmp_path / "good", classes=2, per_class=4, size=16),
        read=ReadOptions(batch_size=8),
        image=ImageOptions(image_size=8),
        train=False,
    )
    expected_images, expected_labels = next(good)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        src = image_folder(
            root,
            read=ReadOptions(batch_size=8, skip_bad_examples=True, num_workers=workers),
            image=ImageOptions(image_size=8),
            train=False,
        )
        images, labels = next(iter(src))
        src.close()
    assert torch.isfinite(images).all() and images.shape == (8, 3, 8, 8)
    # slot 2 holds example 3 (the next in this epoch's order), with its label
    assert torch.equal(images[2], expected_images[3]) and labels[2] == expected_labels[3]
    keep = [0, 1, 3, 4, 5, 6, 7]
    assert torch.equal(images[keep], expected_images[keep]) and torch.equal(labels[keep], expected_labels[keep])
    assert src.bad_examples_skipped == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "stoker"]
    assert any(str(bad) in m and "1 skipped so far" in m for m in messages), messages


def test_each_skip_message_counts_up_to_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_image_tree(tmp_path, classes=2, per_class=4, size=16)
    corrupt(root / "class_0" / "img_001.jpg", "garbage")
    corrupt(root / "class_1" / "img_001.jpg", "garbage")  # two bad examples in one batch
    with caplog.at_level(logging.WARNING, logger="stoker"):
        src = image_folder(
            root, read=ReadOptions(batch_size=8, skip_bad_examples=True), image=ImageOptions(image_size=8), train=False
        )
        next(iter(src))
        src.close()
    counts = [r.getMessage().rsplit("; ", 1)[1] for r in caplog.records if "skipped a bad example" in r.getMessage()]
    assert counts == ["1 skipped so far", "2 skipped so far"] and src.bad_examples_skipped == 2


def test_a_file_pillow_cannot_identify_is_named_without_a_memory_address(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path, classes=1, per_class=2, size=16)
    bad = root / "class_0" / "img_000.png"
    bad.write_bytes(b"\x89PNG but not really a PNG")
    src = image_folder(root, read=ReadOptions(batch_size=3), image=ImageOptions(image_size=8), train=False)
    with pytest.raises(DataError) as info:
        next(iter(src))
    src.close()
    message = str(info.value)
    assert str(bad) in message and "not an image format Pillow reads" in message
    assert "0x" not in message and "BytesIO" not in message, message


def test_skip_bad_examples_in_training_is_deterministic(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path, classes=2, per_class=6, size=16)
    corrupt(root / "class_1" / "img_000.jpg", "truncated")
    runs = []
    for workers in (0, 2):
        src = image_folder(
            root,
            read=ReadOptions(batch_size=4, skip_bad_examples=True, num_workers=workers, seed=2),
            image=ImageOptions(image_size=8),
        )
        runs.append([next(src) for _ in range(9)])  # three epochs of 3 batches
        assert src.bad_examples_skipped == 3  # once per epoch
        src.close()
    for (xa, ya), (xb, yb) in zip(*runs, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_all_images_bad_is_an_error_even_when_skipping(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path, classes=1, per_class=3, size=16)
    for f in (root / "class_0").iterdir():
        corrupt(f, "garbage")
    src = image_folder(root, read=ReadOptions(batch_size=2, skip_bad_examples=True), image=ImageOptions(image_size=8))
    with pytest.raises(DataError, match="no readable example"):
        next(src)


def test_image_folder_tree_errors_name_the_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"{tmp_path / 'nope'} does not exist"):
        image_folder(tmp_path / "nope", read=ReadOptions(batch_size=2))
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.jpg").write_bytes(b"")
    with pytest.raises(DataError, match=f"{tmp_path / 'flat'} has no class folders"):
        image_folder(tmp_path / "flat", read=ReadOptions(batch_size=2))
    root = make_image_tree(tmp_path / "tree", classes=2, per_class=2, size=8)
    (root / "class_2_empty").mkdir()
    (root / "class_2_empty" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=f"class folder {root / 'class_2_empty'} holds no images"):
        image_folder(root, read=ReadOptions(batch_size=2))


def test_image_folder_classes_formats_and_hidden_folders(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path, classes=2, per_class=3, size=10, fmt="png")
    (root / ".ipynb_checkpoints").mkdir()  # hidden: not a class
    (root / "class_1" / "readme.txt").write_text("not an image")  # not an image extension: ignored
    Image.new("L", (9, 12), 40).save(root / "class_1" / "gray.PNG")  # grayscale, upper-case extension
    src = image_folder(root, read=ReadOptions(batch_size=7), image=ImageOptions(image_size=7), train=False)
    assert src.classes == ["class_0", "class_1"] and src.num_examples == 7
    images, labels = next(src)
    assert images.shape == (7, 3, 7, 7) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    gray = (images[3] * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) * 255
    assert torch.allclose(gray, torch.full_like(gray, 40.0), atol=0.01)  # grey level 40 in all three channels


def test_cifar_truncated_file_names_file_and_sizes(tmp_path: Path) -> None:
    d = write_cifar(tmp_path, per_file=4)
    path = d / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=rf"{path} is 12192 bytes, not a positive multiple of the 3073-byte record"):
        cifar_binary(d, read=ReadOptions(batch_size=2))
    cifar_binary(d, read=ReadOptions(batch_size=2), train=False)  # the test file is fine


def test_cifar_bad_label_names_file_and_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = write_cifar(tmp_path, per_file=4)
    path = d / "data_batch_2.bin"
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
    raw[3, 0] = 11
    raw.tofile(path)
    with pytest.raises(DataError, match=rf"{path} record 3 has label 11"):
        cifar_binary(d, read=ReadOptions(batch_size=2))
    with caplog.at_level(logging.WARNING, logger="stoker"):
        src = cifar_binary(d, read=ReadOptions(batch_size=2, skip_bad_examples=True))
    assert src.num_examples == 19
    assert any("skipped 1 record" in r.getMessage() for r in caplog.records)
    assert int(src.labels.max()) <= 9


def test_cifar_missing_files_are_listed(tmp_path: Path) -> None:
    d = write_cifar(tmp_path, per_file=2, files=("data_batch_1.bin", "data_batch_3.bin"))
    with pytest.raises(DataError, match="lacks data_batch_2.bin, data_batch_4.bin, data_batch_5.bin"):
        cifar_binary(d, read=ReadOptions(batch_size=2))
    with pytest.raises(DataError, match="lacks test_batch.bin"):
        cifar_binary(d, read=ReadOptions(batch_size=2), train=False)
    nested = write_cifar(tmp_path / "dl" / "cifar-10-batches-bin", per_file=2)
    assert cifar_binary(nested.parent, read=ReadOptions(batch_size=2), train=False).num_examples == 2


def test_arrays_label_out_of_range_names_example_and_value() -> None:
    y = torch.tensor([0, 2, 1, 5, 2, -1])
    with pytest.raises(DataError, match=r"label of example 3 is 5, outside \[0, 3\).*2 example\(s\)"):
        stoker.data.arrays(torch.zeros(6, 2), y, read=stoker.data.ReadOptions(batch_size=2), num_classes=3)
    stoker.data.arrays(torch.zeros(6, 2), y.clamp(0, 2), read=stoker.data.ReadOptions(batch_size=2), num_classes=3)
    with pytest.raises(DataError, match="not integers"):
        stoker.data.arrays(torch.zeros(6, 2), y.float(), read=stoker.data.ReadOptions(batch_size=2), num_classes=3)


def test_text_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"{tmp_path / 'missing.txt'} does not exist"):
        text_chars(tmp_path / "missing.txt", seq_len=4, read=ReadOptions(batch_size=2))
    (tmp_path / "small.txt").write_bytes(b"0123456789")
    with pytest.raises(DataError, match="shorter than seq_len"):
        text_chars(tmp_path / "small.txt", seq_len=8, read=ReadOptions(batch_size=2))
    # The streams are read in order, whole segments, inline: read options that say otherwise are refused.
    for refused, message in [
        (ReadOptions(batch_size=1, shuffle=True), "read in order"),
        (ReadOptions(batch_size=1, drop_remainder=False), "always whole segments"),
        (ReadOptions(batch_size=1, num_workers=2), "built inline"),
    ]:
        with pytest.raises(ConfigError, match=f"text_chars: .*{message}"):
            text_chars(tmp_path / "small.txt", seq_len=2, read=refused)


def test_argument_errors(tmp_path: Path) -> None:
    # Each a StokerError named after what went wrong, and still the ValueError users catch.
    x = torch.zeros(10, 2)
    with pytest.raises(ConfigError, match="batch_size"):
        stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=0))
    with pytest.raises(ConfigError, match="shard_index"):
        stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=2, num_shards=2, shard_index=2))
    with pytest.raises(ConfigError, match="num_workers"):
        stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=2, num_workers=-1))
    with pytest.raises(ConfigError, match="do not fill one batch"):
        stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=11))
    with pytest.raises(DataError, match="the arrays are empty"):
        stoker.data.arrays(torch.zeros(0, 2), read=stoker.data.ReadOptions(batch_size=2))
    src = stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=2))
    with pytest.raises(CheckpointMismatchError, match="does not fit"):
        src.load_state_dict({**src.state_dict(), "batch": 9})
    with pytest.raises(CheckpointMismatchError, match="seed=1 but this source has seed=0"):
        src.load_state_dict({**src.state_dict(), "seed": 1})
    assert issubclass(CheckpointMismatchError, ValueError) and issubclass(ConfigError, ValueError)


def test_image_source_option_errors(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path, classes=2, per_class=2, size=16)
    for option, value in [
        ("crop", "random"),
        ("output", "float16"),
        ("resize_method", "lanczos"),
        ("image_size", 0),
        ("decoder", "turbo"),
    ]:
        with pytest.raises(ConfigError, match=f"ImageOptions: {option} must be"):
            ImageOptions(**{option: value})
    with pytest.raises(ConfigError, match="ReadOptions: worker_kind must be one of auto, thread, process"):
        ReadOptions(batch_size=2, worker_kind="fiber")
    with pytest.raises(ConfigError, match="image_folder: the read options have no batch_size"):
        image_folder(root, read=ReadOptions())
    with pytest.raises(ConfigError, match="mean and std need 3 values"):
        ImagePreprocessor((0.5,), (0.5,))
    with pytest.raises(ConfigError, match="expects uint8 images"):
        ImagePreprocessor()(torch.zeros(1, 4, 4, 3))
