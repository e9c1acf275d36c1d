"""Built-in input sources: deterministic given a seed, checkpointable with ``state_dict``.

Every source but :func:`synthetic_images` is index-based (:mod:`stoker.data.base`): the
position ``(epoch, batch)`` is its whole state, so resuming is a jump, exact with or without
worker processes. Each takes how to read as one :class:`ReadOptions` (``read=``: batch size,
order, epochs, workers, and the replica's shard from ``ReadOptions.for_replica(params)``);
image sources also take what to make of each image as one :class:`ImageOptions` (``image=``).

- :func:`arrays`: in-memory tensors / numpy arrays.
- :func:`image_folder`: a class-per-folder tree of JPEG/PNG files (ImageNet layout).
- :func:`imagenet_tfrecords`: tf_cnn_benchmarks' ImageNet TFRecord shards (``train-*-of-*``),
  read without TensorFlow (:func:`write_tfrecords`, :func:`write_imagenet_tfrecords` write them).
- :func:`tar_shards`: image samples in tar shards, the WebDataset layout (``key.jpg`` + ``key.cls``;
  :func:`write_tar_shards`, :func:`write_image_tar_shards` write them).
- :func:`cifar_binary`: CIFAR-10's binary files.
- :func:`text_chars`: byte-level language-model streams (:func:`stdlib_corpus`: a corpus
  on every machine).
- :func:`synthetic_images`: one random batch on the device, for benchmarks.
- :func:`mix`: several sources mixed by weight, each batch (or each example) from one drawn
  from a seed.

The file-based sources take local paths or URLs (``s3://``, ``gs://``, ``az://``, ``file://``):
object-store files are fetched whole into the machine's cache and read there
(:mod:`stoker.data.stream`, :class:`StreamOptions`).

This package imports nothing of stoker but :mod:`stoker.errors`, :mod:`stoker.storage` (URLs,
retries), :mod:`stoker._cache` (where the C helpers and the stream cache are) and
:mod:`stoker.resolve` (``worker_kind="auto"``): a source knows nothing of the engine that reads it.
"""

from .arrays import ArraySource, arrays
from .base import DataError, IndexedSource, epoch_generator, example_rng, example_uniforms
from .cifar import CifarSource, cifar_binary
from .images import (
    ImageFolderSource,
    ImageOptions,
    TarShardSource,
    TFRecordImageSource,
    image_folder,
    imagenet_tfrecords,
    tar_shards,
    write_image_tar_shards,
    write_imagenet_tfrecords,
)
from .mix import Mixture, mix
from .mix_examples import ExampleMixture
from .options import ReadOptions
from .stream import StreamOptions
from .synthetic import RepeatedBatch, SyntheticImages, synthetic_images
from .tar_io import write_tar_shards
from .text import TextSource, stdlib_corpus, text_chars
from .tfrecord_io import write_tfrecords

__all__ = [
    "ArraySource",
    "CifarSource",
    "DataError",
    "ExampleMixture",
    "ImageFolderSource",
    "ImageOptions",
    "IndexedSource",
    "Mixture",
    "ReadOptions",
    "RepeatedBatch",
    "StreamOptions",
    "SyntheticImages",
    "TFRecordImageSource",
    "TarShardSource",
    "TextSource",
    "arrays",
    "cifar_binary",
    "epoch_generator",
    "example_rng",
    "example_uniforms",
    "image_folder",
    "imagenet_tfrecords",
    "mix",
    "stdlib_corpus",
    "synthetic_images",
    "tar_shards",
    "text_chars",
    "write_image_tar_shards",
    "write_imagenet_tfrecords",
    "write_tar_shards",
    "write_tfrecords",
]
