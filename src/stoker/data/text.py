"""``text_chars``: a byte-level stream for language models, in parallel contiguous streams.

Transformer-XL style batching: the corpus (the bytes of the files, concatenated in order) is
cut into ``batch_size * num_shards`` equal contiguous streams; replica ``r`` reads streams
``[r * batch_size, (r + 1) * batch_size)``, one per batch row, and batch ``k`` of an epoch is
the ``k``-th segment of ``seq_len`` bytes of each of its streams. Row ``i`` of batch ``k + 1``
continues row ``i`` of batch ``k``, so a model may carry state (a memory, an RNN state) from
batch to batch (see ``EstimatorSpec.cache``). Nothing is shuffled; every epoch reads the
streams again from their starts. The position is the state, as for every stoker source.

Paths may be URLs (``s3://bucket/corpus/``, ``gs://...``): the files are fetched once into the
machine's cache (:mod:`stoker.data.stream`) and read from there.
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from ..storage import UrlPath, location
from .base import DataError, IndexedSource
from .options import ReadOptions
from .stream import DataFile, FileSet, list_files, local_file, remote_file

PathLike = str | os.PathLike[str]


def _collect(paths: PathLike | Sequence[PathLike], extensions: Sequence[str] | None) -> list[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise DataError("text_chars: no paths given")
    exts = None if extensions is None else tuple(e.lower() for e in extensions)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found: list[Path] = []
            for dirpath, dirnames, filenames in os.walk(p, followlinks=True):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                found.extend(
                    Path(dirpath, f)
                    for f in filenames
                    if not f.startswith(".") and (exts is None or f.lower().endswith(exts))
                )
            found.sort()
            files.extend(found)
        else:
            raise DataError(f"text_chars: {p} does not exist")
    return files


def _text_files(paths: PathLike | Sequence[PathLike], extensions: Sequence[str] | None) -> list[DataFile]:
    """:func:`_collect`'s files for local paths and URLs alike (a URL prefix lists the objects below it)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    exts = None if extensions is None else tuple(e.lower() for e in extensions)
    out: list[DataFile] = []
    for item in items:
        place = location(item)
        if not isinstance(place, UrlPath):
            out.extend(local_file(p) for p in _collect([place], extensions))
            continue
        inside = [f for name, f in list_files(place, recursive=True) if exts is None or name.lower().endswith(exts)]
        out.extend(inside if inside else [remote_file(place)])
    if not items:
        raise DataError("text_chars: no paths given")
    return out


class TextSource(IndexedSource):
    """``(inputs, targets)`` int64 ``[batch_size, seq_len]`` byte batches. See :func:`text_chars`."""

    name = "text_chars"
    # A batch is a slice of a tensor in memory: cheaper than a hand-off to a prefetch thread.
    prefers_inline_fetch = True

    def __init__(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        seq_len: int,
        read: ReadOptions,
        extensions: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"text_chars: seq_len must be a positive integer; got {seq_len!r}")
        _check_in_order(read)
        batch_size, num_shards, shard_index = read.batch_size_of(self.name), read.num_shards, read.shard_index
        self.files = _text_files(paths, extensions)
        files = FileSet(self.files, read.stream)
        data = (
            np.concatenate([np.frombuffer(files.read_bytes(k), dtype=np.uint8) for k in range(len(files))])
            if self.files
            else np.zeros(0, np.uint8)
        )
        self.seq_len = seq_len
        self.num_streams = batch_size * num_shards
        self.stream_len = data.size // self.num_streams
        if self.stream_len < seq_len + 1:
            raise DataError(
                f"text_chars: {data.size} bytes in {len(self.files)} file(s) make {self.num_streams} streams "
                f"(batch_size {batch_size} x {num_shards} shard(s)) of {self.stream_len} bytes, shorter than "
                f"seq_len + 1 = {seq_len + 1}; use more text, a smaller batch or a shorter seq_len"
            )
        self._bytes = int(data.size)
        streams = data[: self.num_streams * self.stream_len].reshape(self.num_streams, self.stream_len)
        # Only this replica's streams are kept.
        self.streams = torch.from_numpy(streams[shard_index * batch_size : (shard_index + 1) * batch_size].copy())
        # The streams are read in order, whole batches only; no seed enters them.
        super().__init__(dataclasses.replace(read, shuffle=False, seed=0, drop_remainder=True))

    @property
    def num_examples(self) -> int:
        """Bytes in the corpus (what a resumed run must match)."""
        return self._bytes

    def _identity(self) -> dict[str, int]:
        return {"seq_len": self.seq_len, "num_streams": self.num_streams}

    def _count_batches(self) -> int:
        return (self.stream_len - 1) // self.seq_len  # the targets need one byte past each segment

    def batch_indices(self, epoch: int, batch: int) -> torch.Tensor:
        """The segment number: batch ``k`` is segment ``k`` of every stream of this replica."""
        return torch.tensor([batch])

    def load_batch(self, indices: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(indices[0]) * self.seq_len
        window = self.streams[:, start : start + self.seq_len + 1].long()
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def _check_in_order(read: ReadOptions) -> None:
    """A :class:`ConfigError` for the read options a text stream cannot honour."""
    if read.shuffle:
        raise ConfigError("text_chars: the streams are read in order; give ReadOptions(shuffle=None or False)")
    if read.drop_remainder is False:
        raise ConfigError("text_chars: batches are always whole segments; give ReadOptions(drop_remainder=None)")
    if read.num_workers:
        raise ConfigError("text_chars: a batch is a slice of memory, built inline; give ReadOptions(num_workers=0)")


def text_chars(
    paths: PathLike | Sequence[PathLike],
    *,
    seq_len: int,
    read: ReadOptions,
    extensions: Sequence[str] | None = None,
) -> TextSource:
    """Byte-level ``(inputs, targets)`` batches from text files, in contiguous parallel streams.

    Args:
        paths: files and folders (walked recursively, files sorted; hidden ones skipped),
            concatenated in the order given; local paths or URLs (``s3://``, ``gs://``, ``az://``:
            cached locally, ``read.stream``).
        seq_len: bytes per row of a batch; ``targets`` are ``inputs`` shifted by one byte.
        read: how to read (:class:`~stoker.data.ReadOptions`; in an ``input_fn``,
            ``ReadOptions(...).for_replica(params)``): ``batch_size`` streams (rows) per batch
            for this replica, ``num_epochs`` (``None`` repeats forever) and the shard. The
            streams are read in order: ``shuffle=True``, ``drop_remainder=False`` and workers
            are refused, and the seed does not enter.
        extensions: inside folders, only files ending so (e.g. ``(".py",)``); default all.
    """
    return TextSource(paths, seq_len=seq_len, read=read, extensions=extensions)


def held_out_split(
    files: Sequence[Path], eval_fraction: float, *, who: str = "held_out_split"
) -> tuple[list[Path], list[Path]]:
    """``(training files, held-out files)``: the held-out part is the last whole files holding
    at least ``eval_fraction`` of the bytes (text the model never trains on); at least one file
    stays on each side. ``who`` names the caller in the error raised for fewer than 2 files."""
    if len(files) < 2:
        raise ConfigError(
            f"{who}: {len(files)} text file(s) cannot be split into training and held-out text; "
            "give more files or --eval_text"
        )
    sizes = [f.stat().st_size for f in files]
    want = eval_fraction * sum(sizes)
    held, cut = 0, len(files)
    while cut > 1 and held < want:
        cut -= 1
        held += sizes[cut]
    return list(files[:cut]), list(files[cut:])


def stdlib_corpus(max_bytes: int | None = 4 * 2**20) -> list[Path]:
    """Python standard-library ``.py`` files: a text corpus present on every machine.

    The top-level modules of the running interpreter's standard library, sorted by name, taken
    in that order while their total size stays within ``max_bytes`` (``None``: all of them).
    Deterministic for a given Python installation.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise DataError(f"stdlib_corpus: no .py files in {stdlib}")
    out: list[Path] = []
    total = 0
    for f in files:
        size = f.stat().st_size
        if max_bytes is not None and out and total + size > max_bytes:
            break
        out.append(f)
        total += size
    return out
