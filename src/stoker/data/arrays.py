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

from ._tree import tree_leaves, tree_map
from .base import DataError, IndexedSource, epoch_generator

__all__ = ["ArraySource", "arrays", "epoch_generator"]


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
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        num_epochs: int | None = None,
        drop_remainder: bool | None = None,
        num_shards: int = 1,
        shard_index: int = 0,
        num_classes: int | None = None,
        num_workers: int = 0,
        start_method: str | None = None,
    ) -> None:
        self.features = tree_map(lambda t: t, features)
        self.labels = tree_map(lambda t: t, labels) if labels is not None else None
        leaves = tree_leaves((self.features, self.labels))
        if not leaves:
            raise ValueError("arrays: features hold no tensor or array")
        if any(t.dim() == 0 for t in leaves):
            raise ValueError("arrays: every feature and label array needs a first (example) dimension")
        sizes = {int(t.shape[0]) for t in leaves}
        if len(sizes) != 1:
            raise ValueError(f"arrays: every feature and label array needs the same first dimension; got sizes {sorted(sizes)}")
        self._num_examples = sizes.pop()
        if self._num_examples == 0:
            raise ValueError("arrays: the arrays are empty")
        if num_classes is not None:
            _check_labels(self.labels, num_classes)
        self.num_classes = num_classes
        super().__init__(
            batch_size=batch_size, shuffle=shuffle, seed=seed, num_epochs=num_epochs,
            drop_remainder=drop_remainder, num_shards=num_shards, shard_index=shard_index,
            num_workers=num_workers, start_method=start_method,
        )
        if num_workers > 0:
            self.prefers_inline_fetch = False  # the workers do the work; the thread only waits

    @property
    def num_examples(self) -> int:
        return self._num_examples

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
        raise TypeError("arrays: num_classes checks a single label tensor or array; give labels as one")
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
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    num_epochs: int | None = None,
    drop_remainder: bool | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    num_classes: int | None = None,
    num_workers: int = 0,
    start_method: str | None = None,
) -> ArraySource:
    """Batches from in-memory arrays: tensors, numpy arrays, or dicts / tuples of them.

    Args:
        features, labels: arrays whose first dimension is the example.
        batch_size: examples per batch (give ``params["batch_size"]``: the per-replica batch).
        shuffle: reshuffle every epoch from ``(seed, epoch)``.
        num_epochs: ``None`` repeats forever (training); ``1`` is one pass (evaluation).
        drop_remainder: drop the last partial batch; default True when repeating forever.
        num_shards, shard_index: read one disjoint shard (give ``params["num_replicas"]`` and
            ``params["replica_index"]``).
        num_classes: if given, every label must be an integer in ``[0, num_classes)``; checked
            here, once, with the first offending example named.
        num_workers: index in worker processes (rarely worth it: indexing is cheap).
        start_method: multiprocessing start method for the workers (default fork on Linux).
    """
    return ArraySource(
        features,
        labels,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        num_shards=num_shards,
        shard_index=shard_index,
        num_classes=num_classes,
        num_workers=num_workers,
        start_method=start_method,
    )
