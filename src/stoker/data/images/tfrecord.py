"""``imagenet_tfrecords``: tf_cnn_benchmarks' ImageNet TFRecord shards, read without TensorFlow.

**Layout** (as tf_cnn's ``Dataset.tf_record_pattern``): the data folder holds shards named
``train-*-of-*`` (training) and ``validation-*-of-*`` (evaluation), e.g.
``train-00000-of-01024``, each a TFRecord file of serialised ``tf.train.Example`` s (framing,
checksums and the offset index: :mod:`stoker.data.tfrecord_io`). Shards are read in name order;
example ``i`` is the ``i``-th record counting through them, so the shuffle, the exact resume and
the per-replica sharding are those of every :class:`~stoker.data.IndexedSource`.

**Example keys** (those tf_cnn's ``parse_example_proto`` reads):

- ``image/encoded`` (bytes, required): the JPEG.
- ``image/class/label`` (int64, required): the label **as stored**, 1-based, 1..1000 for
  ImageNet, with 0 the "background" class no example uses. tf_cnn's ``ImagenetDataset`` has
  ``num_classes=1001`` and feeds the stored label to a 1001-way classifier unchanged; so does
  this source (``num_classes=1001``; a label outside ``[0, num_classes)`` is a
  :class:`~stoker.data.DataError`). A model trained on it has 1001 logits, as tf_cnn's.
- ``image/object/bbox/{xmin,ymin,xmax,ymax}`` (float lists, optional, normalised to [0, 1]):
  object boxes, handed to the crop as the example's ``bbox``, ``[n, 4]`` in TensorFlow's
  ``(ymin, xmin, ymax, xmax)`` order; ``crop="tf_cnn"`` samples its training crop around them
  as tf_cnn does (TensorFlow's ``sample_distorted_bounding_box``); none (or empty lists) means
  the whole image.

A record whose checksum fails, a truncated record, an Example missing a required key or with a
bad label raise :class:`~stoker.data.DataError` naming the shard, the record number (and byte
offset for framing errors) and what is wrong; with ``skip_bad_examples=True`` the example is
replaced by the next readable one of the epoch's order, counted and logged, identically after a
resume.

**Object storage**: ``data_dir`` may be a URL (``s3://bucket/imagenet``, ``gs://...``, ``az://...``);
the shards are then fetched whole into the machine's cache and read there, the shards of the
coming batches fetched ahead (:mod:`stoker.data.stream`, settings in ``ReadOptions(stream=...)``).
"""

from __future__ import annotations

import copy
import fnmatch
import io
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ...storage import location
from ..base import DataError
from ..options import ReadOptions
from ..stream import DataFile, is_folder, list_files
from ..tfrecord_index import RecordShards
from ..tfrecord_io import example_class, make_example, write_tfrecords
from .examples import EncodedExample
from .folder import IMAGE_EXTENSIONS, scan_image_folder
from .options import ImageOptions
from .source import EncodedImageSource

log = logging.getLogger("stoker")

#: Batches ahead of the one being built whose shards are fetched early (object-store data).
READ_AHEAD_BATCHES = 8
#: tf_cnn's ImageNet classifier width: labels 1..1000 plus the unused background class 0.
IMAGENET_NUM_CLASSES = 1001
ENCODED_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
BBOX_KEYS = ("image/object/bbox/ymin", "image/object/bbox/xmin", "image/object/bbox/ymax", "image/object/bbox/xmax")
_INDEX_SUFFIXES = (".idx", ".index")  # other tools' index files next to the shards (DALI, tfrecord)


def shard_files(data_dir: str | os.PathLike[str], split: str) -> list[DataFile]:
    """The ``<split>-*-of-*`` files of ``data_dir`` (a local folder or a URL) in name order
    (tf_cnn's pattern; hidden files and ``.idx`` / ``.index`` files are not shards), with their
    sizes and versions. Empty when there are none."""
    return [
        f
        for name, f in list_files(location(data_dir))
        if fnmatch.fnmatchcase(name, f"{split}-*-of-*") and not name.endswith(_INDEX_SUFFIXES)
    ]


def find_shards(data_dir: str | os.PathLike[str], split: str) -> list[Path]:
    """The ``<split>-*-of-*`` files of the local folder ``data_dir`` in name order (for a URL:
    :func:`shard_files`). Empty when there are none."""
    return [Path(f.url) for f in shard_files(Path(data_dir), split)]


def expected_layouts(data_dir: str | os.PathLike[str]) -> str:
    """The sentence every "no data found" message ends with: the layouts stoker reads."""
    return (
        f"{data_dir} should hold either TFRecord shards named train-*-of-* / validation-*-of-* "
        "(tf_cnn_benchmarks' ImageNet layout, read by stoker.data.imagenet_tfrecords), *.tar shards of "
        "key.jpg + key.cls samples (the WebDataset layout, read by stoker.data.tar_shards) or one folder "
        "of images per class (read by stoker.data.image_folder)"
    )


def _feature_values(features: Any, key: str, kind: str, name: str, required: bool) -> Sequence[Any]:
    container = features.feature
    if key not in container:
        if required:
            raise DataError(f"imagenet_tfrecords: {name}: the Example has no {key!r} feature")
        return ()
    feature = container[key]
    which = feature.WhichOneof("kind")
    if which is None:
        return ()
    if which != kind:
        raise DataError(f"imagenet_tfrecords: {name}: {key!r} holds a {which}, expected a {kind}")
    return getattr(feature, kind).value


def parse_imagenet_example(data: bytes, name: str, num_classes: int = IMAGENET_NUM_CLASSES) -> EncodedExample:
    """The image, label and boxes of one serialised Example in tf_cnn's ImageNet layout."""
    from google.protobuf.message import DecodeError

    try:
        example = example_class().FromString(data)
    except DecodeError as e:
        raise DataError(f"imagenet_tfrecords: {name}: not a tf.train.Example: {e}") from None
    features = example.features
    encoded = _feature_values(features, ENCODED_KEY, "bytes_list", name, required=True)
    labels = _feature_values(features, LABEL_KEY, "int64_list", name, required=True)
    if len(encoded) != 1 or not encoded[0]:
        raise DataError(f"imagenet_tfrecords: {name}: {ENCODED_KEY!r} must hold one non-empty image")
    if len(labels) != 1:
        raise DataError(f"imagenet_tfrecords: {name}: {LABEL_KEY!r} must hold one label; it holds {len(labels)}")
    label = int(labels[0])
    if not 0 <= label < num_classes:
        raise DataError(
            f"imagenet_tfrecords: {name}: label {label} is outside [0, {num_classes}) "
            f"(tf_cnn's ImageNet labels are 1..1000, 0 is background); pass num_classes= for other data"
        )
    coords = [_feature_values(features, k, "float_list", name, required=False) for k in BBOX_KEYS]
    bbox = None
    if any(len(c) for c in coords):
        if len({len(c) for c in coords}) != 1:
            sizes = ", ".join(f"{k.rsplit('/', 1)[1]}={len(c)}" for k, c in zip(BBOX_KEYS, coords, strict=True))
            raise DataError(f"imagenet_tfrecords: {name}: the box lists differ in length ({sizes})")
        bbox = np.stack([np.asarray(c, dtype=np.float32) for c in coords], axis=1)
    return EncodedExample(bytes(encoded[0]), label, bbox, name)


class TFRecordImageSource(EncodedImageSource):
    """Decoded, augmented image batches from ImageNet TFRecord shards. See :func:`imagenet_tfrecords`."""

    name = "imagenet_tfrecords"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        read: ReadOptions,
        image: ImageOptions | None = None,
        train: bool = True,
        split: str | None = None,
        num_classes: int = IMAGENET_NUM_CLASSES,
        index_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.data_dir = location(data_dir)
        self.split = split or ("train" if train else "validation")
        shards = shard_files(self.data_dir, self.split)
        if not shards:
            if not is_folder(self.data_dir):
                raise DataError(f"imagenet_tfrecords: the data folder {self.data_dir} does not exist")
            raise DataError(
                f"imagenet_tfrecords: {self.data_dir} holds no {self.split}-*-of-* shards; "
                f"{expected_layouts(self.data_dir)}"
            )
        self.records = RecordShards(shards, index_dir=index_dir, lenient=read.skip_bad_examples, stream=read.stream)
        self.num_classes = int(num_classes)
        super().__init__(read=read, image=image, train=train)

    @property
    def num_examples(self) -> int:
        return len(self.records)

    @property
    def classes(self) -> list[str]:
        """Class names by label: ``"background"`` then ``"1"`` .. (the records store numbers only)."""
        return ["background", *map(str, range(1, self.num_classes))]

    def _thread_copy(self) -> TFRecordImageSource:
        view = copy.copy(self)
        view.records = copy.copy(self.records)  # its own open files: another thread may close an old one
        return view

    def batch_indices(self, epoch: int, batch: int) -> torch.Tensor:
        """This shard's batch ``batch`` of epoch ``epoch``; for shards on an object store, the
        shards of the next :data:`READ_AHEAD_BATCHES` batches are fetched in the background now."""
        indices = super().batch_indices(epoch, batch)
        if self.records.remote:
            self.records.ahead(self._coming_examples(epoch, batch + 1, READ_AHEAD_BATCHES))
        return indices

    def _coming_examples(self, epoch: int, batch: int, count: int) -> Iterator[int]:
        """The examples of this shard's next ``count`` batches of epoch ``epoch`` from ``batch`` on
        (not past the epoch: its order is the one computed now)."""
        for b in range(batch, min(batch + count, self.batches_per_epoch)):
            yield from super().batch_indices(epoch, b).tolist()

    def _encoded(self, index: int) -> EncodedExample:
        """Example ``index`` read (both checksums checked) and parsed, not decoded."""
        return parse_imagenet_example(self.records.read(index), self.records.describe(index), self.num_classes)

    def _encoded_one(self, index: int) -> EncodedExample:
        """Example ``index`` read alone: a ranged request when its shard is not in the cache."""
        return parse_imagenet_example(self.records.read_one(index), self.records.describe(index), self.num_classes)


def imagenet_tfrecords(
    data_dir: str | os.PathLike[str],
    *,
    read: ReadOptions,
    image: ImageOptions | None = None,
    train: bool = True,
    split: str | None = None,
    num_classes: int = IMAGENET_NUM_CLASSES,
    index_dir: str | os.PathLike[str] | None = None,
) -> TFRecordImageSource:
    """``(images, labels)`` batches from tf_cnn_benchmarks' ImageNet TFRecord shards, no TensorFlow.

    Reads ``data_dir/train-*-of-*`` (``train=True``) or ``data_dir/validation-*-of-*``; the keys,
    the 1-based labels with the background class 0 (``num_classes=1001``) and the boxes are in
    :mod:`stoker.data.images.tfrecord`. Images are float32 ``[batch, 3, image_size, image_size]``
    normalised by the ImageNet mean and std (``output="uint8"``: uint8 ``[batch, image_size,
    image_size, 3]``, to normalise on the device), labels int64 as stored. The first use of a shard
    builds its offset index (a tqdm bar when that takes more than a second) and caches it
    (:mod:`stoker.data.tfrecord_io`: ``<data_dir>/.stoker-index/``, or the user cache when the
    data folder is read-only).

    ``read``, ``image`` and ``train`` mean what they mean for :func:`~stoker.data.image_folder`
    (the decode-and-crop batch builder is :class:`~stoker.data.images.EncodedImageSource`);
    ``crop="tf_cnn"`` crops around the example's object boxes as tf_cnn does. With
    ``read.skip_bad_examples`` an unreadable example (bad checksum, truncated record, missing
    key, undecodable image) is replaced by the next readable one in the epoch's order, counted
    in ``.bad_examples_skipped`` and logged, and a shard whose framing breaks contributes the
    records before the break; otherwise these raise :class:`~stoker.data.DataError`.

    Args:
        data_dir: the folder holding the shards: a local path or a URL (``s3://``, ``gs://``,
            ``az://``, ``file://``; object-store shards are cached locally, ``read.stream``).
        split: the shard name prefix (default ``train`` / ``validation`` by ``train``).
        num_classes: labels must lie in ``[0, num_classes)``.
        index_dir: cache the shard indexes here instead.

    Raises:
        DataError: the folder is missing or holds no ``<split>-*-of-*`` shards, or a shard is
            corrupt (see ``read.skip_bad_examples``).
    """
    return TFRecordImageSource(
        data_dir, read=read, image=image, train=train, split=split, num_classes=num_classes, index_dir=index_dir
    )


def imagenet_example(
    jpeg: bytes,
    label: int,
    *,
    bbox: Sequence[Sequence[float]] = (),
    height: int = 0,
    width: int = 0,
    filename: str = "",
    synset: str = "",
) -> bytes:
    """A serialised ``tf.train.Example`` in tf_cnn's ImageNet layout (the keys of its
    ``build_imagenet_data.py``); ``bbox`` rows are ``(ymin, xmin, ymax, xmax)`` in [0, 1]."""
    boxes = np.asarray(bbox, dtype=np.float32).reshape(-1, 4)
    features: dict[str, bytes | int | list[float]] = {
        "image/height": height,
        "image/width": width,
        "image/colorspace": b"RGB",
        "image/channels": 3,
        LABEL_KEY: label,
        "image/class/synset": synset.encode(),
        "image/class/text": synset.encode(),
        "image/format": b"JPEG",
        "image/filename": filename.encode(),
        ENCODED_KEY: jpeg,
    }
    for column, key in enumerate(BBOX_KEYS):
        features[key] = boxes[:, column].tolist()
    return make_example(features)


def _jpeg_bytes(path: str) -> tuple[bytes, int, int]:
    """The file's bytes if it is an RGB JPEG, else re-encoded as one (quality 95), and its size:
    tf_cnn decodes with ``decode_jpeg``, as ``build_imagenet_data.py`` converts PNG and CMYK."""
    from PIL import Image  # the images extra: imported when a folder is converted, not with stoker.data

    try:
        with Image.open(path) as im:
            if im.format == "JPEG" and im.mode == "RGB":
                return Path(path).read_bytes(), im.width, im.height
            out = io.BytesIO()
            im.convert("RGB").save(out, format="JPEG", quality=95)
            return out.getvalue(), im.width, im.height
    except Exception as e:  # Pillow's many exception types for unreadable files
        raise DataError(f"write_imagenet_tfrecords: cannot read image {path}: {type(e).__name__}: {e}") from e


def write_imagenet_tfrecords(
    image_folder_root: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    num_shards: int,
    split: str = "train",
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
) -> list[Path]:
    """Convert a class-per-folder image tree (:func:`~stoker.data.image_folder`'s layout) into
    ``num_shards`` TFRecord shards ``out_dir/<split>-0000k-of-0000n`` in tf_cnn's ImageNet layout.

    Labels are 1-based: the ``c``-th class folder in sorted order is label ``c + 1`` (0 stays
    the background class); files keep the folder order and are cut into ``num_shards``
    contiguous runs (the last ones may be shorter). Non-JPEG images are re-encoded as JPEG.
    Returns the shard paths. No TensorFlow needed; TensorFlow reads the result.
    """
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ConfigError(f"write_imagenet_tfrecords: num_shards must be a positive integer; got {num_shards!r}")
    classes, paths, labels = scan_image_folder(image_folder_root, extensions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(paths), num_shards + 1).round().astype(int)
    written = []
    for k in range(num_shards):

        def examples(lo: int = int(bounds[k]), hi: int = int(bounds[k + 1])) -> Iterator[bytes]:
            for i in range(lo, hi):
                jpeg, width, height = _jpeg_bytes(paths[i])
                yield imagenet_example(
                    jpeg,
                    int(labels[i]) + 1,
                    height=height,
                    width=width,
                    filename=os.path.basename(paths[i]),
                    synset=classes[int(labels[i])],
                )

        shard = out / f"{split}-{k:05d}-of-{num_shards:05d}"
        write_tfrecords(shard, examples())
        written.append(shard)
    return written


__all__ = [
    "IMAGENET_NUM_CLASSES",
    "TFRecordImageSource",
    "expected_layouts",
    "find_shards",
    "shard_files",
    "imagenet_example",
    "imagenet_tfrecords",
    "parse_imagenet_example",
    "write_imagenet_tfrecords",
]
