"""``ReadOptions``: one frozen value for how every source reads, the replica taken from params."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stoker.data import ReadOptions, arrays
from stoker.errors import ConfigError


def test_for_replica_takes_the_batch_and_the_shard_from_params() -> None:
    read = ReadOptions(seed=3, num_epochs=1)
    mine = read.for_replica({"batch_size": 4, "num_replicas": 3, "replica_index": 2, "cache": None})
    assert mine == ReadOptions(batch_size=4, seed=3, num_epochs=1, num_shards=3, shard_index=2)
    assert read.batch_size is None and read.num_shards == 1  # frozen: the original is unchanged
    # A batch size given explicitly wins; outside an Estimator there is one replica.
    assert ReadOptions(batch_size=8).for_replica({"batch_size": 4}) == ReadOptions(batch_size=8)


def test_replicas_read_with_for_replica_partition_every_epoch() -> None:
    x = torch.arange(24.0)[:, None]
    read = ReadOptions(seed=5, num_epochs=2)
    shards = [
        arrays(x, read=read.for_replica({"batch_size": 4, "num_replicas": 3, "replica_index": r})) for r in range(3)
    ]
    seen = [[int(v) for batch in source for v in batch[:, 0]] for source in shards]
    for epoch in range(2):  # each replica reads 8 examples an epoch; together all 24, once each
        together = sorted(v for s in seen for v in s[8 * epoch : 8 * (epoch + 1)])
        assert together == list(range(24))
    # The same examples as the shards given by hand (what every input_fn used to write).
    by_hand = arrays(x, read=ReadOptions(batch_size=4, seed=5, num_epochs=2, num_shards=3, shard_index=1))
    assert [int(v) for batch in by_hand for v in batch[:, 0]] == seen[1]


def test_for_mode_fills_only_what_is_left_to_the_source() -> None:
    assert ReadOptions().for_mode(True) == ReadOptions(shuffle=True, num_epochs=None)
    assert ReadOptions().for_mode(False) == ReadOptions(shuffle=False, num_epochs=1)
    given = ReadOptions(shuffle=True, num_epochs=3)
    assert given.for_mode(False) == given


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_size", 0, "batch_size must be a positive integer or None; got 0"),
        ("batch_size", True, "batch_size must be a positive integer or None; got True"),
        ("num_epochs", 0, r"num_epochs must be None \(repeat forever\) or >= 1; got 0"),
        ("num_shards", 0, "num_shards must be a positive integer; got 0"),
        ("shard_index", 1, r"shard_index must be in \[0, 1\); got 1"),
        ("num_workers", -1, "num_workers must be an integer >= 0; got -1"),
        ("worker_kind", "fiber", "worker_kind must be one of auto, thread, process; got 'fiber'"),
    ],
)
def test_a_bad_value_is_refused_where_it_is_written(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"ReadOptions: {message}"):
        ReadOptions(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"ReadOptions: {message}"):
        dataclasses.replace(ReadOptions(), **{field: value})


def test_a_source_needs_a_batch_size_and_for_replica_needs_one_in_params() -> None:
    with pytest.raises(ConfigError, match="arrays: the read options have no batch_size"):
        arrays(torch.zeros(4, 1), read=ReadOptions())
    with pytest.raises(ConfigError, match="ReadOptions.for_replica: params has no 'batch_size'"):
        ReadOptions().for_replica({"num_replicas": 2, "replica_index": 0})
