"""Elastic determinism, in one process: each example's augmentation is keyed by (seed, epoch,
example index) alone, so a global batch is the same tensor whatever the number of replicas or
workers, and a position re-sharded 2 -> 1 -> 2 goes on with the uninterrupted run's global
batches. (The same with real processes, a kill -9 and the Estimator: tests/distributed/test_elastic_resume.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from helpers.images import make_id_tree
from stoker.data import ImageOptions, ReadOptions, example_rng, example_uniforms, image_folder
from stoker.errors import CheckpointMismatchError

GLOBAL = 8  # examples per global batch
SIZE = 12


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_id_tree(tmp_path_factory.mktemp("ids"), count=20)  # 2 global batches per epoch, 4 dropped


def replicas(tree: Path, n: int, workers: int = 0, kind: str = "auto") -> list[stoker.data.ImageFolderSource]:
    """The ``n`` replicas' sources of one run: random crops, flips and colour distortions."""
    return [
        image_folder(
            tree,
            read=ReadOptions(
                batch_size=GLOBAL // n, num_shards=n, shard_index=r, seed=5, num_workers=workers, worker_kind=kind
            ),
            image=ImageOptions(image_size=SIZE, distortions=True, decoder="pillow"),
        )
        for r in range(n)
    ]


def global_batches(sources: list[stoker.data.ImageFolderSource], steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` global batches: replica ``r``'s rows are rows ``r, r + n, ...`` of the global batch."""
    n = len(sources)
    out = []
    for _ in range(steps):
        images = torch.empty((GLOBAL, 3, SIZE, SIZE))
        ids = torch.empty(GLOBAL, dtype=torch.int64)
        for r, source in enumerate(sources):
            images[r::n], ids[r::n] = next(source)
        out.append((ids, images))
    for source in sources:
        source.close()
    return out


def equal(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(p, q) for (x, p), (y, q) in zip(a, b, strict=True)
    )


def test_an_examples_random_numbers_depend_on_seed_epoch_and_index_alone() -> None:
    every = example_uniforms(3, 1, np.arange(50), 8)
    # the same example's row in any batch, any order, any company: no replica, worker or call count in the key
    assert np.array_equal(example_uniforms(3, 1, [41, 7, 7, 0], 8), every[[41, 7, 7, 0]])
    assert np.array_equal(example_uniforms(3, 1, [7], 8)[0], every[7])
    for other in (example_uniforms(3, 2, np.arange(50), 8), example_uniforms(4, 1, np.arange(50), 8)):
        assert not np.isclose(other, every).all(axis=1).any()  # another epoch or seed: other numbers
    draws = example_rng(3, 1, 7).random(6)
    assert np.array_equal(example_rng(3, 1, 7).random(6), draws)
    for key in ((3, 1, 8), (3, 2, 7), (4, 1, 7)):
        assert not np.isclose(example_rng(*key).random(6), draws).any()


def test_global_batches_are_the_same_tensors_for_any_replicas_and_workers(tree: Path) -> None:
    one = global_batches(replicas(tree, 1), 5)  # 2.5 epochs
    assert sorted(one[0][0].tolist() + one[1][0].tolist()) != list(range(16))  # shuffled, 4 of 20 dropped
    assert equal(global_batches(replicas(tree, 2), 5), one)
    assert equal(global_batches(replicas(tree, 4, workers=2, kind="thread"), 5), one)
    assert equal(global_batches(replicas(tree, 2, workers=2, kind="process"), 5), one)


def test_a_position_resharded_2_1_2_goes_on_with_the_uninterrupted_global_batches(tree: Path) -> None:
    whole = global_batches(replicas(tree, 1), 8)  # 4 epochs
    two = replicas(tree, 2)
    seen = global_batches(two, 3)  # into the second epoch
    assert [s.state_dict()["samples"] for s in two] == [GLOBAL, GLOBAL]  # one global batch of epoch 1 read
    one = replicas(tree, 1)
    one[0].load_state_dict(one[0].reshard_state_dict([s.state_dict() for s in two]))
    seen += global_batches(one, 2)
    two = replicas(tree, 2)
    for s in two:
        s.load_state_dict(s.reshard_state_dict([one[0].state_dict()]))
    seen += global_batches(two, 3)
    assert equal(seen, whole)


def test_resharding_says_when_the_global_batch_cannot_be_kept() -> None:
    x = torch.arange(40.0).reshape(40, 1)

    def run(n: int, batch: int) -> list[stoker.data.ArraySource]:
        return [
            stoker.data.arrays(x, read=ReadOptions(batch_size=batch, num_shards=n, shard_index=r)) for r in range(n)
        ]

    saved = [s.state_dict() for s in run(2, 3)]  # a global batch of 6
    with pytest.raises(
        CheckpointMismatchError, match=r"global batch of 6 examples does not divide among 4.*\(1, 2, 3, 6\)"
    ):
        run(4, 1)[0].reshard_state_dict(saved)
    with pytest.raises(CheckpointMismatchError, match=r"global batch changed \(6 -> 9\); keep the global batch: 2"):
        run(3, 3)[0].reshard_state_dict(saved)
    with pytest.raises(CheckpointMismatchError, match="the input states of 1 of its 2 replicas"):
        run(3, 2)[0].reshard_state_dict(saved[:1])
    # the global sample count is the position: one that disagrees with the batch is refused
    source = run(1, 6)[0]
    next(source)
    with pytest.raises(CheckpointMismatchError, match="says 12 examples of the epoch were read, not 6"):
        source.load_state_dict({**source.state_dict(), "samples": 12})
    # a state saved before the count was recorded re-shards from its batch x global batch
    old = [{k: v for k, v in s.state_dict().items() if k != "samples"} for s in run(2, 3)]
    for s in old:
        s["batch"] = 2
    moved = run(3, 2)[1].reshard_state_dict(old)
    assert (moved["batch"], moved["samples"], moved["shard_index"]) == (2, 12, 1)
