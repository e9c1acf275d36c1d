"""``cifar_binary``: CIFAR-10 in its binary format, held in memory, augmented per example.

Files (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"):
``data_batch_1.bin`` ... ``data_batch_5.bin`` (training) and ``test_batch.bin`` (evaluation);
each is a sequence of 3073-byte records: one label byte (0-9), then 3072 pixel bytes
(1024 red, 1024 green, 1024 blue, each 32 x 32 row-major). The files are checked when the
source is built, so a truncated download or a wrong file fails at once, naming the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..storage import Location, location
from .base import DataError, IndexedSource, example_uniforms
from .images import normalize_images
from .options import ReadOptions
from .stream import DataFile, FileSet, StreamOptions, as_data_file, is_folder, list_files

log = logging.getLogger("stoker")

TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_RECORD = 1 + 3 * 32 * 32
_PAD = 4


def read_cifar_binary(
    paths: Sequence[str | os.PathLike[str] | DataFile],
    num_classes: int = 10,
    skip_bad_examples: bool = False,
    stream: StreamOptions | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, 3, 32, 32], labels int64 [N])`` from CIFAR binary files (local paths
    or URLs, these through the cache of ``stream``), checked."""
    images, labels = [], []
    skipped = 0
    files = FileSet([as_data_file(p) for p in paths], stream)
    for k in range(len(files)):
        path = files.name(k)
        raw = np.frombuffer(files.read_bytes(k), dtype=np.uint8)
        if raw.size == 0 or raw.size % _RECORD:
            raise DataError(
                f"cifar_binary: {path} is {raw.size} bytes, not a positive multiple of the {_RECORD}-byte "
                f"record (1 label byte + 3072 pixel bytes): {raw.size // _RECORD} whole records and "
                f"{raw.size % _RECORD} bytes left over; the file is truncated or not CIFAR-10 binary"
            )
        records = raw.reshape(-1, _RECORD)
        lab = records[:, 0].astype(np.int64)
        bad = np.flatnonzero(lab >= num_classes)
        keep: slice | np.ndarray = slice(None)
        if bad.size:
            if not skip_bad_examples:
                raise DataError(
                    f"cifar_binary: {path} record {int(bad[0])} has label {int(lab[bad[0]])}, outside "
                    f"0..{num_classes - 1} ({bad.size} bad record(s) in this file); the file is corrupt or "
                    "not CIFAR-10 (CIFAR-100 binary has two label bytes)"
                )
            log.warning(
                "cifar_binary: skipped %d record(s) of %s with a label outside 0..%d (first: record %d)",
                bad.size,
                path,
                num_classes - 1,
                int(bad[0]),
            )
            skipped += int(bad.size)
            keep = lab < num_classes
        images.append(records[keep, 1:].reshape(-1, 3, 32, 32))
        labels.append(lab[keep])
    return np.concatenate(images), np.concatenate(labels)


def _find_files(data_dir: Location, names: tuple[str, ...]) -> list[DataFile]:
    # Accept the folder the archive unpacks to as well as the folder holding it.
    missing: list[str] = []
    for folder in (data_dir, data_dir / "cifar-10-batches-bin"):
        found = dict(list_files(folder))
        if all(n in found for n in names):
            return [found[n] for n in names]
        missing = missing or [n for n in names if n not in found]
    raise DataError(
        f"cifar_binary: {data_dir} lacks {', '.join(missing)}; expected the CIFAR-10 binary files "
        f"{', '.join(names)} there (or in {data_dir / 'cifar-10-batches-bin'})"
    )


class CifarSource(IndexedSource):
    """CIFAR-10 batches from memory. See :func:`cifar_binary`."""

    name = "cifar_binary"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        read: ReadOptions,
        train: bool = True,
        augment: bool | None = None,
    ) -> None:
        self.data_dir = location(data_dir)
        if not is_folder(self.data_dir):
            raise DataError(f"cifar_binary: the data folder {self.data_dir} does not exist")
        self.files = _find_files(self.data_dir, TRAIN_FILES if train else TEST_FILES)
        images, labels = read_cifar_binary(self.files, skip_bad_examples=read.skip_bad_examples, stream=read.stream)
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)
        self.train = bool(train)
        self.augment = self.train if augment is None else bool(augment)
        super().__init__(read.for_mode(self.train))

    @property
    def num_examples(self) -> int:
        return int(self.labels.shape[0])

    def _identity(self) -> dict[str, int]:
        # A different batch size would make the saved batch number point at other examples.
        return {"batch_size": self.batch_size}

    def load_batch(self, indices: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        images = self.images.index_select(0, indices)
        if self.augment:
            # Pad 4 (zeros), take a random 32 x 32 crop, flip half: one gather for the batch, the
            # offsets and flips drawn per example from (seed, epoch, example index).
            u = torch.from_numpy(example_uniforms(self.seed, epoch, indices.numpy(), 3))
            span = 2 * _PAD + 1
            top = (u[:, 0] * span).long()
            left = (u[:, 1] * span).long()
            flip = u[:, 2] < 0.5
            ar = torch.arange(32)
            rows = top[:, None] + ar
            cols = left[:, None] + ar
            cols = torch.where(flip[:, None], cols.flip(1), cols)
            padded = F.pad(images, (_PAD, _PAD, _PAD, _PAD))
            b = torch.arange(images.shape[0])[:, None, None]
            images = padded[b, :, rows[:, :, None], cols[:, None, :]]  # [B, 32, 32, C]
        else:
            images = images.permute(0, 2, 3, 1)
        return normalize_images(images, CIFAR10_MEAN, CIFAR10_STD), self.labels.index_select(0, indices)


def cifar_binary(
    data_dir: str | os.PathLike[str], *, read: ReadOptions, train: bool = True, augment: bool | None = None
) -> CifarSource:
    """``(images, labels)`` batches of CIFAR-10 from its binary files in ``data_dir``.

    Images are float32 ``[batch, 3, 32, 32]`` normalised by the CIFAR-10 mean and std, labels
    int64. Training batches are augmented: zero-pad 4, random 32 x 32 crop, random flip.

    Args:
        data_dir: holds ``data_batch_1.bin`` ... ``data_batch_5.bin`` and ``test_batch.bin``
            (or holds the ``cifar-10-batches-bin`` folder that does): a local path or a URL
            (``s3://``, ``gs://``, ``az://``; the files are fetched once into the machine's cache,
            ``read.stream``).
        read: how to read (:class:`~stoker.data.ReadOptions`); ``shuffle`` and ``num_epochs``
            left ``None`` follow ``train`` (shuffled and forever, else one pass in order);
            ``skip_bad_examples`` drops records whose label is not 0-9 (logged) instead of raising.
        train: the training files, augmented and shuffled; else ``test_batch.bin`` in order.
        augment: pad, crop and flip (default ``train``; tf_cnn_benchmarks' ``--nodistortions`` is False).

    Raises:
        DataError: a file is missing (all missing names are listed), truncated (its size and
            the record size are given) or holds a label above 9 (file and record named).
    """
    return CifarSource(data_dir, read=read, train=train, augment=augment)
