"""``arrays``: in-memory tensors or numpy arrays, batched by indexing (never per sample).

Deterministic and checkpointable (see :mod:`stoker.data.base`): epoch ``e`` is shuffled by a
generator seeded from ``(seed, e)``, so the position ``(epoch, batch)`` is the whole state and
a resumed run sees exactly the batches it would have seen. Each replica reads a disjoint
shard of every epoch's permutation (example ``i`` of the permutation goes to replica
``i % num_shards``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import UserCodeError
from ._tree import tree_leaves, tree_map
from .base import DataError, IndexedSource, epoch_generator
from .options import ReadOptions

__all__ = ["ArraySource", "arrays", "epoch_generator"]


# Batches are gathered several at a time (one index_select per array for up to CHUNK_BATCHES
# batches, at most CHUNK_BYTES), and each batch is then a slice of that gather: per batch, a
# view costs ~1 us where an index_select costs ~3 us plus the Python around it, which on a
# host-bound model is a few % of a step (benchmarks/overhead.py). Large batches (images) get
# one batch per gather, as before. The order and the batches are the same either way.
CHUNK_BATCHES = 64
CHUNK_BYTES = 4 << 20


class ArraySource(IndexedSource):
    """Batches of ``(features, labels)`` taken from in-memory arrays. See :func:`arrays`."""

    name = "arrays"
    # A batch is one index_select per array (microseconds): handing it to a prefetch thread
    # costs more than making it. benchmarks/overhead.py (MLP, batch 64, 2-core machine), ratio
    # to a hand-written loop with iterations_per_loop=100: inline 1.01x / 0.97x, prefetch
    # thread 0.82x / 0.87x (two interleaved runs each).
    prefers_inline_fetch = True

    def __init__(
        self,
        features: Any,
        labels: Any = None,
        *,
        read: ReadOptions,
        num_classes: int | None = None,
    ) -> None:
        self.features = tree_map(lambda t: t, features)
        self.labels = tree_map(lambda t: t, labels) if labels is not None else None
        leaves = tree_leaves((self.features, self.labels))
        if not leaves:
            raise DataError("arrays: features hold no tensor or array")
        if any(t.dim() == 0 for t in leaves):
            raise DataError("arrays: every feature and label array needs a first (example) dimension")
        sizes = {int(t.shape[0]) for t in leaves}
        if len(sizes) != 1:
            raise DataError(
                f"arrays: every feature and label array needs the same first dimension; got sizes {sorted(sizes)}"
            )
        self._num_examples = sizes.pop()
        if self._num_examples == 0:
            raise DataError("arrays: the arrays are empty")
        if num_classes is not None:
            _check_labels(self.labels, num_classes)
        self.num_classes = num_classes
        super().__init__(read)
        if self.num_workers > 0:
            self.prefers_inline_fetch = False  # the workers do the work; the thread only waits
        row_bytes = sum(t.element_size() * t[:1].numel() for t in leaves)
        # Gathering ahead pays only in the calling thread (a worker builds every n-th batch).
        self._chunk_batches = (
            1
            if self.num_workers > 0
            else max(1, min(CHUNK_BATCHES, CHUNK_BYTES // max(1, row_bytes * self.batch_size)))
        )
        self._chunk: tuple[int, int, int, Any] | None = None  # (epoch, first batch, end batch, gathered)

    @property
    def num_examples(self) -> int:
        return self._num_examples

    def _build(self, epoch: int, batch: int) -> Any:
        if self._chunk_batches == 1:
            return super()._build(epoch, batch)
        chunk = self._chunk
        if chunk is None or chunk[0] != epoch or not chunk[1] <= batch < chunk[2]:
            end = min(batch + self._chunk_batches, self.batches_per_epoch)
            order = self._plan.shard_order(epoch)
            chunk = self._chunk = (
                epoch,
                batch,
                end,
                self.load_batch(order[batch * self.batch_size : end * self.batch_size], epoch),
            )
        lo = (batch - chunk[1]) * self.batch_size
        hi = lo + self.batch_size
        gathered = chunk[3]
        if (
            type(gathered) is tuple
            and len(gathered) == 2
            and type(gathered[0]) is torch.Tensor
            and type(gathered[1]) is torch.Tensor
        ):
            return gathered[0][lo:hi], gathered[1][lo:hi]  # the common case, without tree_map
        return tree_map(lambda t: t[lo:hi], gathered)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_chunk"] = None  # copies (workers) gather their own
        return state

    def load_batch(self, indices: torch.Tensor, epoch: int) -> Any:
        features, labels = self.features, self.labels
        if type(features) is torch.Tensor and type(labels) is torch.Tensor:  # the common case, without tree_map
            return features.index_select(0, indices), labels.index_select(0, indices)
        feats = tree_map(lambda t: t.index_select(0, indices), self.features)
        if self.labels is None:
            return feats
        return feats, tree_map(lambda t: t.index_select(0, indices), self.labels)


def _check_labels(labels: Any, num_classes: int) -> None:
    if not isinstance(labels, (torch.Tensor, np.ndarray)):
        raise UserCodeError("arrays: num_classes checks a single label tensor or array; give labels as one")
    t = torch.as_tensor(labels)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise DataError(f"arrays: num_classes was given but the labels are {t.dtype}, not integers")
    bad = ((t < 0) | (t >= num_classes)).reshape(t.shape[0], -1).any(1).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise DataError(
            f"arrays: label of example {i} is {t[i].tolist()}, outside [0, {num_classes}) "
            f"(num_classes={num_classes}); {bad.shape[0]} example(s) are out of range"
        )


def arrays(
    features: Any,
    labels: Any = None,
    *,
    read: ReadOptions,
    num_classes: int | None = None,
) -> ArraySource:
    """Batches from in-memory arrays: tensors, numpy arrays, or dicts / tuples of them.

    Args:
        features, labels: arrays whose first dimension is the example.
        read: how to read (:class:`~stoker.data.ReadOptions`; in an ``input_fn``,
            ``ReadOptions(...).for_replica(params)``). ``shuffle=None`` shuffles; workers are
            rarely worth it (indexing is cheap).
        num_classes: if given, every label must be an integer in ``[0, num_classes)``; checked
            here, once, with the first offending example named.
    """
    return ArraySource(features, labels, read=read, num_classes=num_classes)
