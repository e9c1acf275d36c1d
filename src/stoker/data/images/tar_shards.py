"""``tar_shards``: image classification samples in tar shards, the WebDataset layout.

**Layout**: shards ``*.tar`` (read in name order), each holding samples as members grouped by
key (:mod:`stoker.data.tar_io`): ``abc.jpg`` (or ``.jpeg``, ``.png``, ``.bmp``: the image),
``abc.cls`` (the class index as decimal text, 0-based), anything else (``abc.json``,
``abc.txt``) kept in the shard and not read. Example ``i`` is the ``i``-th sample counting through
the shards, so the shuffle, the exact resume (a jump: each shard's member index says where every
sample lies, no shard is read from its start) and the per-replica sharding are those of every
:class:`~stoker.data.IndexedSource`, and the images are decoded, cropped and augmented by the
same :class:`~.source.EncodedImageSource` as :func:`~stoker.data.image_folder`'s and
:func:`~stoker.data.imagenet_tfrecords`'s.

A sample without an image or a ``.cls`` member, a ``.cls`` that is not an integer in
``[0, num_classes)`` and a malformed shard raise :class:`~stoker.data.DataError` naming the shard
and the member; with ``skip_bad_examples=True`` such a sample is replaced by the next readable one
of the epoch's order, counted and logged, identically after a resume.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ...storage import Location
from ..base import DataError
from ..options import ReadOptions
from ..stream import DataFile, as_data_file, list_files
from ..stream.listing import where
from ..tar_io import BAD_LABEL, LABEL_EXT, NO_LABEL, TarShards, write_tar_shards
from .examples import EncodedExample
from .folder import IMAGE_EXTENSIONS, scan_image_folder
from .options import ImageOptions
from .source import EncodedImageSource

#: The members that hold a sample's image, in the order they are looked for.
IMAGE_KEYS = ("jpg", "jpeg", "png", "bmp")
_EVAL_SPLITS = ("validation", "val")
#: Batches ahead whose object-store shards are fetched in the background.
READ_AHEAD_BATCHES = 8


def find_tar_shards(data: str | os.PathLike[str], split: str | None = None) -> list[DataFile]:
    """The ``*.tar`` files of the folder (or object-store prefix) ``data`` in name order, hidden ones
    left out, only those whose name starts with ``split`` when it is given. Empty when there are none."""
    return [
        file
        for name, file in list_files(where(data))
        if name.endswith(".tar") and (split is None or name.startswith(split))
    ]


def split_of(data: str | os.PathLike[str], train: bool) -> str | None:
    """The shard name prefix of ``data``'s training or evaluation split: ``train`` when some shards
    start with it, ``validation`` / ``val`` for evaluation when some do, else ``None`` (all shards)."""
    names = [file.name for file in find_tar_shards(data)]
    for prefix in ("train",) if train else _EVAL_SPLITS:
        if any(n.startswith(prefix) for n in names):
            return prefix
    train_prefix = "train" if any(n.startswith("train") for n in names) else None
    return None if train else train_prefix


def _shard_files(data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], split: str | None) -> list[DataFile]:
    """The shards ``data`` names: a folder's (or prefix's) ``*.tar`` starting with ``split``, a
    ``.tar`` file, or a list of them."""
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    files: list[DataFile] = []
    for item in items:
        if str(item).endswith(".tar"):
            files.append(as_data_file(item))  # a DataError when it does not exist
            continue
        found = find_tar_shards(item, split)
        if not found:
            which = f"{split}*.tar" if split else "*.tar"
            raise DataError(f"tar_shards: {item} holds no {which} shards (or does not exist)")
        files.extend(found)
    return files


class TarShardSource(EncodedImageSource):
    """Decoded, augmented image batches from tar shards. See :func:`tar_shards`."""

    name = "tar_shards"

    def __init__(
        self,
        data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        read: ReadOptions,
        image: ImageOptions | None = None,
        train: bool = True,
        split: str | None = None,
        num_classes: int | None = None,
        image_keys: Sequence[str] = IMAGE_KEYS,
        index_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.samples = TarShards(
            _shard_files(data, split), index_dir=index_dir, lenient=read.skip_bad_examples, stream=read.stream
        )
        self.image_keys = tuple(k.lower().lstrip(".") for k in image_keys)
        self._labels = self.samples.labels()
        if num_classes is None:
            if int(self._labels.max(initial=-1)) < 0:
                raise DataError(f"tar_shards: no sample of {data} has a .{LABEL_EXT} member (its class index)")
            num_classes = int(self._labels.max()) + 1
        self.num_classes = int(num_classes)
        if not read.skip_bad_examples:
            for i in (self._labels < 0).nonzero()[0][:1]:
                self._label(int(i))  # raises: the first sample without a readable label, named
        super().__init__(read=read, image=image, train=train)

    @property
    def num_examples(self) -> int:
        return len(self.samples)

    @property
    def classes(self) -> list[str]:
        """Class names by label: ``"0"``, ``"1"`` .. (the shards store numbers only)."""
        return [str(c) for c in range(self.num_classes)]

    def _thread_copy(self) -> TarShardSource:
        view = copy.copy(self)
        view.samples = copy.copy(self.samples)  # its own open files: another thread may close an old one
        return view

    def batch_indices(self, epoch: int, batch: int) -> torch.Tensor:
        """This shard's batch ``batch`` of epoch ``epoch``; for shards on an object store, the
        shards of the next :data:`READ_AHEAD_BATCHES` batches are fetched in the background now."""
        indices = super().batch_indices(epoch, batch)
        if self.samples.remote:
            order = self._plan.shard_order(epoch)  # this replica's examples, as its batches read them
            ahead = order[(batch + 1) * self.batch_size : (batch + 1 + READ_AHEAD_BATCHES) * self.batch_size]
            self.samples.ahead(ahead.tolist())
        return indices

    def _label(self, i: int) -> int:
        label = int(self._labels[i])
        if label == NO_LABEL or label == BAD_LABEL:
            if label == NO_LABEL:
                raise DataError(f"{self.name}: {self.samples.describe(i)}: its sample has no .{LABEL_EXT} member")
            m = self.samples.extensions(i)[LABEL_EXT]
            raise DataError(f"{self.name}: {self.samples.describe(i, m)}: not a class index (a decimal integer)")
        if not 0 <= label < self.num_classes:
            m = self.samples.extensions(i)[LABEL_EXT]
            raise DataError(
                f"{self.name}: {self.samples.describe(i, m)}: label {label} is outside [0, {self.num_classes}); "
                "pass num_classes= for other data"
            )
        return label

    def _encoded(self, index: int, *, one: bool = False) -> EncodedExample:
        """Sample ``index``'s image member read (one ``pread``; ``one``: a lone read, see
        :meth:`TarShards.read_member`) and its label, not decoded."""
        members = self.samples.extensions(index)
        found = next((members[k] for k in self.image_keys if k in members), None)
        if found is None:
            wanted = ", ".join(f".{k}" for k in self.image_keys)
            raise DataError(f"{self.name}: {self.samples.describe(index)}: its sample has no image member ({wanted})")
        label = self._label(index)
        data = self.samples.read_member(index, found, one=one)
        return EncodedExample(data, label, None, self.samples.describe(index, found))

    def _encoded_one(self, index: int) -> EncodedExample:
        """Sample ``index`` read alone: a ranged request when its shard is not in the cache."""
        return self._encoded(index, one=True)


def tar_shards(
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    read: ReadOptions,
    image: ImageOptions | None = None,
    train: bool = True,
    split: str | None = None,
    num_classes: int | None = None,
    image_keys: Sequence[str] = IMAGE_KEYS,
    index_dir: str | os.PathLike[str] | None = None,
) -> TarShardSource:
    """``(images, labels)`` batches from tar shards in the WebDataset layout (``key.jpg`` +
    ``key.cls`` samples; :mod:`stoker.data.images.tar_shards`).

    ``data`` is a folder or an object-store prefix (``s3://``, ``gs://``, ``az://``: its ``*.tar``
    files in name order; with ``split``, those whose name starts with it), a shard, or a list of
    either; object-store shards are read from the machine's cache and fetched ahead of the batches
    that need them (``read.stream``: :class:`~stoker.data.stream.StreamOptions`). The first use of
    a shard builds its member index and caches it (:mod:`stoker.data.tar_io`). ``read``, ``image``
    and ``train`` mean what they mean for :func:`~stoker.data.image_folder`: the same decoders,
    crops, workers and exact resume.

    Args:
        split: with a folder, read only the shards whose name starts with this.
        num_classes: labels must lie in ``[0, num_classes)``; ``None``: the largest ``.cls`` + 1.
        image_keys: the extensions of the image member, looked for in this order.
        index_dir: cache the shard indexes here instead.

    Raises:
        DataError: no shards, a malformed shard, a sample without an image or a label (see
            ``read.skip_bad_examples``).
    """
    return TarShardSource(
        data,
        read=read,
        image=image,
        train=train,
        split=split,
        num_classes=num_classes,
        image_keys=image_keys,
        index_dir=index_dir,
    )


def _folder_samples(root: str | os.PathLike[str], extensions: Sequence[str]) -> Iterator[dict[str, Any]]:
    classes, paths, labels = scan_image_folder(root, extensions)
    for path, label in zip(paths, labels, strict=True):
        rel = Path(path).relative_to(root)
        key = rel.with_suffix("").as_posix().replace(".", "_")  # a key has no dot in its last part
        yield {"__key__": key, rel.suffix.lower().lstrip("."): Path(path).read_bytes(), LABEL_EXT: int(label)}


def write_image_tar_shards(
    image_folder_root: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    prefix: str = "train",
    samples_per_shard: int | None = 1000,
    max_shard_bytes: int | None = 1 << 30,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
) -> list[Location]:
    """Convert a class-per-folder image tree (:func:`~stoker.data.image_folder`'s layout) into tar
    shards ``out_dir/<prefix>-000000.tar`` ... (:func:`~stoker.data.write_tar_shards`): one sample
    per image in the folder's order, the file's bytes as they are (``class_0/img_001.jpg`` becomes
    ``class_0/img_001.jpg`` and ``class_0/img_001.cls`` holding ``0``, labels as ``image_folder``
    numbers them). ``out_dir`` may be an object-store URL. Returns where the shards are."""
    return write_tar_shards(
        out_dir,
        _folder_samples(image_folder_root, extensions),
        prefix=prefix,
        samples_per_shard=samples_per_shard,
        max_shard_bytes=max_shard_bytes,
    )


__all__ = [
    "IMAGE_KEYS",
    "TarShardSource",
    "find_tar_shards",
    "split_of",
    "tar_shards",
    "write_image_tar_shards",
]
