"""``arrays``: in-memory tensors or numpy arrays, batched by indexing (never per sample).

Deterministic and checkpointable: epoch ``e`` is shuffled by a generator seeded from
``(seed, e)``, so the position ``(epoch, batch)`` is the whole state and a resumed run sees
exactly the batches it would have seen. Each replica reads a disjoint shard of every epoch's
permutation (example ``i`` of the permutation goes to replica ``i % num_shards``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ._tree import tree_leaves, tree_map


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A torch generator whose stream depends only on ``(seed, epoch)``."""
    mixed = np.random.SeedSequence([seed % 2**63, epoch]).generate_state(2, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed % 2**63))


class ArraySource:
    """Batches of ``(features, labels)`` taken from in-memory arrays. See :func:`arrays`."""

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
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"arrays: batch_size must be a positive integer; got {batch_size!r}")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"arrays: num_epochs must be None (repeat forever) or >= 1; got {num_epochs}")
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"arrays: shard_index must be in [0, {num_shards}); got {shard_index}")
        self.features = tree_map(lambda t: t, features)
        self.labels = tree_map(lambda t: t, labels) if labels is not None else None
        leaves = tree_leaves((self.features, self.labels))
        if not leaves:
            raise ValueError("arrays: features hold no tensor or array")
        sizes = {int(t.shape[0]) for t in leaves}
        if len(sizes) != 1:
            raise ValueError(f"arrays: every feature and label array needs the same first dimension; got sizes {sorted(sizes)}")
        self.num_examples = sizes.pop()
        if self.num_examples == 0:
            raise ValueError("arrays: the arrays are empty")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_epochs = num_epochs
        # Training repeats forever and wants full batches; a single pass (eval) keeps them all.
        self.drop_remainder = (num_epochs is None) if drop_remainder is None else drop_remainder
        self.num_shards = num_shards
        self.shard_index = shard_index
        per_shard = len(range(shard_index, self.num_examples, num_shards))
        # Every shard gets the same number of batches (replicas step in lockstep).
        smallest = self.num_examples // num_shards
        if self.drop_remainder:
            self.batches_per_epoch = smallest // batch_size
        else:
            self.batches_per_epoch = -(-per_shard // batch_size)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"arrays: {self.num_examples} examples over {num_shards} shard(s) do not fill one batch "
                f"of {batch_size} with drop_remainder=True; use a smaller batch or drop_remainder=False"
            )
        self.epoch = 0
        self.batch = 0
        self._order: torch.Tensor | None = None

    def __len__(self) -> int:
        """Batches per epoch for this shard."""
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[Any]:
        return self

    def _epoch_order(self) -> torch.Tensor:
        if self._order is None:
            if self.shuffle:
                order = torch.randperm(self.num_examples, generator=epoch_generator(self.seed, self.epoch))
            else:
                order = torch.arange(self.num_examples)
            self._order = order[self.shard_index :: self.num_shards]
        return self._order

    def __next__(self) -> Any:
        if self.batch >= self.batches_per_epoch:
            if self.num_epochs is not None and self.epoch + 1 >= self.num_epochs:
                raise StopIteration
            self.epoch += 1
            self.batch = 0
            self._order = None
        order = self._epoch_order()
        idx = order[self.batch * self.batch_size : (self.batch + 1) * self.batch_size]
        self.batch += 1
        feats = tree_map(lambda t: t.index_select(0, idx), self.features)
        if self.labels is None:
            return feats
        return feats, tree_map(lambda t: t.index_select(0, idx), self.labels)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "num_examples": self.num_examples,
            "num_shards": self.num_shards,
            "shard_index": self.shard_index,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "num_examples", "num_shards"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"arrays: the saved input state has {key}={state[key]} but this source has "
                    f"{key}={getattr(self, key)}; resume with the same data, seed and number of replicas"
                )
        self.epoch = int(state["epoch"])
        self.batch = int(state["batch"])
        self._order = None


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
    )
