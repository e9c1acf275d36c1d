"""Elastic determinism, in one process: each example's augmentation is keyed by (seed, epoch,
example index) alone, so a global batch is the same tensor whatever the number of replicas or
workers, and a position re-sharded 2 -> 1 -> 2 goes on with the uninterrupted run's global
batches. (The same with real processes, a kill -9 and the Estimator: tests/distributed/test_elastic_resume.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import stoker
from helpers.images import make_id_tree, write_cifar
from stoker.data import (
    ImageOptions,
    ReadOptions,
    cifar_binary,
    example_rng,
    example_uniforms,
    image_folder,
    tar_shards,
    write_image_tar_shards,
)
from stoker.data.images import ImagePreprocessor
from stoker.errors import CheckpointMismatchError

GLOBAL = 8  # examples per global batch
SIZE = 12
Batches = list[tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("elastic")
    tree = make_id_tree(root / "ids", count=20)  # 2 global batches per epoch, 4 dropped
    write_image_tar_shards(tree, root / "tar", samples_per_shard=7)
    return {"tree": tree, "tar": root / "tar", "cifar": write_cifar(root / "cifar", per_file=8)}


def replicas(data: dict[str, Path], kind: str, n: int, workers: int = 0, worker_kind: str = "auto") -> list[Any]:
    """The ``n`` replicas' sources of one run of ``kind``: every random op of stoker.data's sources
    (the two crops, flips, colour distortions; CIFAR's pad-and-crop and flip)."""

    def read(r: int) -> ReadOptions:
        return ReadOptions(
            batch_size=GLOBAL // n, num_shards=n, shard_index=r, seed=5, num_workers=workers, worker_kind=worker_kind
        )

    if kind == "cifar":
        return [cifar_binary(data["cifar"], read=read(r)) for r in range(n)]
    image = ImageOptions(
        image_size=SIZE, distortions=True, decoder="pillow", crop="tf_cnn" if kind == "tf_cnn" else "inception"
    )
    if kind == "tar":
        return [tar_shards(data["tar"], read=read(r), image=image) for r in range(n)]
    return [image_folder(data["tree"], read=read(r), image=image) for r in range(n)]


def global_batches(sources: list[Any], steps: int) -> Batches:
    """``steps`` global batches ``(labels, images)``: replica ``r``'s rows are rows ``r, r + n, ...``."""
    n = len(sources)
    out = []
    for _ in range(steps):
        parts = [next(source) for source in sources]
        images = torch.empty((GLOBAL, *parts[0][0].shape[1:]))
        labels = torch.empty(GLOBAL, dtype=torch.int64)
        for r, (x, y) in enumerate(parts):
            images[r::n], labels[r::n] = x, y
        out.append((labels, images))
    for source in sources:
        source.close()
    return out


def equal(a: Batches, b: Batches) -> bool:
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


@pytest.mark.parametrize("kind", ["inception", "tf_cnn", "tar", "cifar"])
def test_global_batches_are_the_same_tensors_for_any_replicas_and_workers(data: dict[str, Path], kind: str) -> None:
    one = global_batches(replicas(data, kind, 1), 5)  # 2.5 epochs (CIFAR: 40 examples, 5 per epoch)
    assert equal(global_batches(replicas(data, kind, 2), 5), one)
    assert equal(global_batches(replicas(data, kind, 4, workers=2, worker_kind="thread"), 5), one)
    if kind == "inception":
        assert sorted(one[0][0].tolist() + one[1][0].tolist()) != list(range(16))  # shuffled, 4 of 20 dropped
        assert equal(global_batches(replicas(data, kind, 2, workers=2, worker_kind="process"), 5), one)


def test_uint8_batches_and_the_steps_distortion_are_the_same_for_any_replicas(data: dict[str, Path]) -> None:
    """``output="uint8"``: the images and colour parameters cross over as they are, and the step's
    distortion and normalisation (on the CPU: image by image) give each example the same tensor."""
    image = ImageOptions(image_size=SIZE, distortions=True, decoder="pillow", output="uint8")
    preprocess = ImagePreprocessor(distortions=True)

    def run(n: int) -> list[torch.Tensor]:
        sources = [
            image_folder(
                data["tree"], read=ReadOptions(batch_size=GLOBAL // n, num_shards=n, shard_index=r, seed=5), image=image
            )
            for r in range(n)
        ]
        out = []
        for _ in range(3):
            rows = torch.empty((GLOBAL, 3, SIZE, SIZE))
            for r, source in enumerate(sources):
                features, _ = next(source)
                rows[r::n] = preprocess(features["images"], features["color"])
            out.append(rows)
        return out

    assert all(torch.equal(a, b) for a, b in zip(run(1), run(2), strict=True))


@pytest.mark.parametrize("layouts", [(2, 1, 2), (4, 2, 4)])
def test_a_position_resharded_goes_on_with_the_uninterrupted_global_batches(
    data: dict[str, Path], layouts: tuple[int, int, int]
) -> None:
    whole = global_batches(replicas(data, "inception", 1), 8)  # 4 epochs
    seen: Batches = []
    states: list[dict[str, Any]] = []
    for n, steps in zip(layouts, (3, 2, 3), strict=True):
        sources = replicas(data, "inception", n)
        for source in sources:
            if states:
                source.load_state_dict(source.reshard_state_dict(states))
        seen += global_batches(sources, steps)
        states = [source.state_dict() for source in sources]
        if not seen[3:]:  # one global batch of the second epoch read, on every replica
            assert [s["samples"] for s in states] == [GLOBAL] * n
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
