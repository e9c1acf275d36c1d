"""``ReadOptions``: how a source reads its examples, one frozen value every source takes.

Every index-based source (:mod:`stoker.data.base`) reads the same way: a batch size, an order
(shuffled from a seed, or not), a number of epochs, one replica's shard, workers that build
batches ahead. Those are the fields of :class:`ReadOptions`, given to a source as ``read=``. The
replica comes from the Estimator: :meth:`ReadOptions.for_replica` reads the ``params`` an
``input_fn`` is called with (its per-replica ``batch_size``, ``num_replicas`` and
``replica_index``), so no ``input_fn`` maps replicas to shards by hand::

    def input_fn(params):
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=1).for_replica(params))

Outside an Estimator give the batch size yourself: ``ReadOptions(batch_size=32, shuffle=False)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .stream.options import StreamOptions

#: What builds batches ahead when ``num_workers > 0`` (``auto``: the source's rule).
WORKER_KINDS: tuple[str, ...] = ("auto", "thread", "process")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How a source reads: the batch, the order, the epochs, the shard and the workers.

    Args:
        batch_size: examples per batch of this replica; ``None`` (the default) takes
            ``params["batch_size"]`` in :meth:`for_replica`. A source refuses ``None``.
        shuffle: reshuffle every epoch from ``(seed, epoch)``; ``None``: the source's default
            (``arrays``: shuffled; file-backed sources: shuffled when training).
        seed: seeds the order and the augmentation.
        num_epochs: ``None`` repeats forever (file-backed sources: forever when training, one
            pass otherwise); ``1`` is one pass (evaluation).
        drop_remainder: drop the last partial batch; ``None``: drop it when repeating forever.
        num_workers: build batches in this many workers (0: in the thread that iterates).
        worker_kind: ``"process"`` (forked worker processes, batches through shared memory),
            ``"thread"`` (threads of this process) or ``"auto"`` (the source's rule,
            :class:`~stoker.data.IndexedSource`).
        start_method: multiprocessing start method for worker processes (default: ``fork`` on
            Linux, the platform default elsewhere).
        skip_bad_examples: replace an unreadable example by the next readable one of the epoch's
            order, counted and logged, instead of raising.
        num_shards, shard_index: read shard ``shard_index`` of ``num_shards`` disjoint shards;
            :meth:`for_replica` sets them to the replica's.
        stream: how files on an object store (``s3://``, ``gs://``, ``az://`` data) are cached
            and fetched ahead (:class:`~stoker.data.stream.StreamOptions`); ``None``: the defaults.
            Local files ignore it.
    """

    batch_size: int | None = None
    shuffle: bool | None = None
    seed: int = 0
    num_epochs: int | None = None
    drop_remainder: bool | None = None
    num_workers: int = 0
    worker_kind: str = "auto"
    start_method: str | None = None
    skip_bad_examples: bool = False
    num_shards: int = 1
    shard_index: int = 0
    stream: StreamOptions | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and not _positive_int(self.batch_size):
            raise ConfigError(f"ReadOptions: batch_size must be a positive integer or None; got {self.batch_size!r}")
        if self.num_epochs is not None and not _positive_int(self.num_epochs):
            raise ConfigError(f"ReadOptions: num_epochs must be None (repeat forever) or >= 1; got {self.num_epochs!r}")
        if not _positive_int(self.num_shards):
            raise ConfigError(f"ReadOptions: num_shards must be a positive integer; got {self.num_shards!r}")
        if not isinstance(self.shard_index, int) or not 0 <= self.shard_index < self.num_shards:
            raise ConfigError(f"ReadOptions: shard_index must be in [0, {self.num_shards}); got {self.shard_index!r}")
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 0:
            raise ConfigError(f"ReadOptions: num_workers must be an integer >= 0; got {self.num_workers!r}")
        if self.worker_kind not in WORKER_KINDS:
            raise ConfigError(
                f"ReadOptions: worker_kind must be one of {', '.join(WORKER_KINDS)}; got {self.worker_kind!r}"
            )
        if self.stream is not None and not isinstance(self.stream, StreamOptions):
            raise ConfigError(
                f"ReadOptions: stream must be a stoker.data.stream.StreamOptions or None; got {self.stream!r}"
            )

    def for_replica(self, params: Mapping[str, Any]) -> ReadOptions:
        """These options for the replica an ``input_fn`` is called for: ``params["num_replicas"]``
        shards, shard ``params["replica_index"]`` (1 and 0 where ``params`` has none, as outside an
        Estimator), and the batch ``params["batch_size"]`` unless :attr:`batch_size` is set.

        Each replica then takes its share of every global batch (rows ``r, r + n, ...`` of the
        epoch's global order, :mod:`stoker.data.base`; ``text_chars``: a contiguous block of
        streams), so a run resumed with another number of replicas and the same global batch
        reads the same global batches."""
        batch_size = self.batch_size
        if batch_size is None:
            if "batch_size" not in params:
                raise ConfigError(
                    "ReadOptions.for_replica: params has no 'batch_size'; give ReadOptions(batch_size=...) "
                    "or pass the params the Estimator calls input_fn with"
                )
            batch_size = params["batch_size"]
        return dataclasses.replace(
            self,
            batch_size=batch_size,
            num_shards=params.get("num_replicas", 1),
            shard_index=params.get("replica_index", 0),
        )

    def batch_size_of(self, who: str) -> int:
        """:attr:`batch_size`, or a :class:`ConfigError` naming ``who`` when it is not set."""
        if self.batch_size is None:
            raise ConfigError(
                f"{who}: the read options have no batch_size; give ReadOptions(batch_size=...), "
                "or ReadOptions(...).for_replica(params) in an input_fn"
            )
        return self.batch_size

    def for_mode(self, train: bool) -> ReadOptions:
        """These options with a file-backed source's defaults where ``shuffle`` or ``num_epochs``
        is ``None``: training shuffles and repeats forever, evaluation is one pass in order."""
        return dataclasses.replace(
            self,
            shuffle=train if self.shuffle is None else self.shuffle,
            num_epochs=(None if train else 1) if self.num_epochs is None else self.num_epochs,
        )


__all__ = ["WORKER_KINDS", "ReadOptions"]
