"""stoker.data.mix(per="example"): each example of a global batch drawn from a source by weight;
a golden sequence, each source's examples in its stream's order, exact proportions, bitwise resume
(state round trip, another number of replicas, under the Estimator), stopping strategies, errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers.images import make_id_tree
from helpers.mixes import mixed_input
from helpers.tiny import make_data, make_estimator, state_equal
from stoker.data import ImageOptions, ReadOptions, arrays, image_folder, mix, text_chars
from stoker.errors import CheckpointMismatchError, ConfigError

X = torch.arange(200, dtype=torch.float32).reshape(100, 2)  # row i is (2i, 2i + 1)
Y = torch.arange(100)  # an example's label is its id: a: 0-59, b: 60-99


def sources(batch: int = 8, *, replicas: int = 1, replica: int = 0, epochs: int | None = None) -> dict[str, Any]:
    read = ReadOptions(batch_size=batch, seed=1, num_epochs=epochs, num_shards=replicas, shard_index=replica)
    return {
        "a": (arrays(X[:60], Y[:60], read=read), 0.7),
        "b": (arrays(X[60:], Y[60:], read=dataclasses.replace(read, seed=2)), 0.3),
    }


def blend(batch: int = 8, *, seed: int = 3, **kwargs: Any) -> Any:
    strategy = kwargs.pop("stopping_strategy", "first_exhausted")
    return mix(sources(batch, **kwargs), seed=seed, per="example", stopping_strategy=strategy)


def labels(m: Any, n: int) -> list[list[int]]:
    return [next(m)[1].tolist() for _ in range(n)]


def stream(source: Any, length: int) -> list[int]:
    """A source's global stream: its epochs' global orders one after another."""
    out: list[int] = []
    epoch = 0
    while len(out) < length:
        out += source.epoch_order(epoch).tolist()
        epoch += 1
    return out[:length]


def test_a_fixed_seed_draws_a_golden_blend_of_each_sources_stream_in_order() -> None:
    m = blend()
    assert m.sources_of(0).tolist() == [0, 0, 1, 0, 0, 0, 0, 0]  # golden: a change must be deliberate
    got = labels(m, 30)
    assert got[0] == [8, 41, 99, 10, 15, 49, 12, 48]
    src = sources()
    for i, name in enumerate(("a", "b")):  # each source's rows are its stream, in order, across epochs
        rows = [label for g, batch in enumerate(got) for k, label in enumerate(batch) if m.sources_of(g)[k] == i]
        offset = 0 if name == "a" else 60
        assert [r - offset for r in rows] == stream(src[name][0], len(rows))
    assert m.taken == {"a": sum(r < 60 for b in got for r in b), "b": sum(r >= 60 for b in got for r in b)}


def test_realised_proportions_of_examples_match_the_weights() -> None:
    m = blend(32)
    n = 4000 * 32
    counts = np.bincount(np.concatenate([m.sources_of(g) for g in range(4000)]), minlength=2)
    assert abs(counts[0] / n - 0.7) < 5 * (0.21 / n) ** 0.5, counts
    labels(m, 10)
    assert m.realised_proportions() == {"a": m.taken["a"] / 320, "b": m.taken["b"] / 320}
    early = blend(32)
    labels(early, 6)
    assert early.realised_proportions(early.state_dict(), ahead=4) == m.realised_proportions()


def test_a_state_round_trip_resumes_bitwise() -> None:
    whole = blend()
    labels(whole, 11)
    state = json.loads(json.dumps(whole.state_dict()))
    rest = [next(whole) for _ in range(25)]
    resumed = blend()
    resumed.load_state_dict(state)
    again = [next(resumed) for _ in range(25)]
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(rest, again, strict=True))


def test_advance_is_as_many_batches_read_and_the_infeed_jumps_with_it() -> None:
    from stoker.engine.infeed import Infeed

    whole = blend(epochs=2, stopping_strategy="all_exhausted")
    read = labels(whole, 30)
    jumped = blend(epochs=2, stopping_strategy="all_exhausted")
    jumped.advance(21)
    assert labels(jumped, 9) == read[21:] and jumped.state_dict() == whole.state_dict()
    start = blend()
    state = start.state_dict()
    labels(start, 5)
    resumed = blend()  # a checkpoint's snapshot and 5 batches consumed after it
    with Infeed(resumed, device=torch.device("cpu"), restore={"source": state, "skip": 5}) as infeed:
        assert resumed.step == 5 and next(infeed).labels.tolist() == read[5]
    with pytest.raises(ConfigError, match="mix: cannot advance 100 batches: the data ends after"):
        blend(epochs=1).advance(100)


def test_any_number_of_replicas_reads_the_same_global_batches_and_resumes_across_them() -> None:
    one = labels(blend(8), 20)

    def global_batches(ms: list[Any], n: int) -> list[list[int]]:
        out = []
        for _ in range(n):
            rows = [next(m)[1].tolist() for m in ms]
            batch = [0] * 8
            for r, part in enumerate(rows):
                batch[r :: len(ms)] = part  # replica r's rows are r, r + n, ...
            out.append(batch)
        return out

    two = [blend(4, replicas=2, replica=r) for r in range(2)]
    first = global_batches(two, 7)
    four = [blend(2, replicas=4, replica=r) for r in range(4)]
    saved = [m.state_dict() for m in two]
    for m in four:  # 2 replicas of 4 -> 4 of 2, the same global batch
        m.load_state_dict(m.reshard_state_dict(saved))
    middle = global_batches(four, 6)
    back = blend(8)
    back.load_state_dict(back.reshard_state_dict([m.state_dict() for m in four]))
    assert first + middle + labels(back, 7) == one
    with pytest.raises(CheckpointMismatchError, match="mix: the saved input has global batch 8 but this one 16"):
        blend(16).load_state_dict(saved[0])


def test_first_exhausted_ends_before_a_batch_that_would_read_past_a_source() -> None:
    m = blend(epochs=1)  # a: 60 examples, b: 40, one pass each
    got = [label for batch in labels_until_end(m) for label in batch]
    assert len(set(got)) == len(got)  # no example twice
    assert m.ended and m.exhausted == {"a"}  # a, at 0.7, runs out first
    assert m.taken["a"] <= 60 < m.taken["a"] + np.bincount(m.sources_of(m.step), minlength=2)[0]


def test_all_exhausted_reads_a_finished_source_over_again_until_both_ran_out() -> None:
    m = blend(epochs=1, stopping_strategy="all_exhausted")
    got = labels_until_end(m)
    a_rows = [label for batch in got for label in batch if label < 60]
    assert m.exhausted == {"a", "b"} and len(a_rows) > 60
    assert a_rows[60:] == a_rows[: len(a_rows) - 60]  # the stream over again, from its start
    assert sum(label >= 60 for batch in got for label in batch) <= 40


def labels_until_end(m: Any) -> list[list[int]]:
    return [batch[1].tolist() for batch in m]


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("strategy", ["first_exhausted", "all_exhausted"])
def test_threads_building_ahead_give_the_batches_built_when_asked(strategy: str) -> None:
    def threaded() -> Any:
        return mix(sources(epochs=2), seed=3, per="example", stopping_strategy=strategy, num_threads=2)

    inline = list(blend(epochs=2, stopping_strategy=strategy))  # runs out of a, starts over, ends
    m = threaded()
    first = [next(m) for _ in range(10)]
    state = json.loads(json.dumps(m.state_dict()))
    rest = list(m)
    resumed = threaded()
    resumed.load_state_dict(state)
    again = list(resumed)
    m.close()
    resumed.close()
    assert len(inline) > 20 and same(first + rest, inline) and same(again, rest)


def test_the_estimator_resumes_an_example_mixture_bitwise(tmp_path: Path) -> None:
    x, y = make_data(100)
    whole = make_estimator(tmp_path / "whole")
    whole.train(mixed_input(x, y, per="example"), max_steps=12)
    make_estimator(tmp_path / "split").train(mixed_input(x, y, per="example"), max_steps=6)
    again = make_estimator(tmp_path / "split")
    again.train(mixed_input(x, y, per="example"), max_steps=12)
    assert state_equal(whole.model, again.model)
    other = make_estimator(tmp_path / "batch")  # and per="batch" trains on other batches
    other.train(mixed_input(x, y), max_steps=12)
    assert not state_equal(whole.model, other.model)


def test_image_sources_blend_with_their_own_augmentation(tmp_path: Path) -> None:
    data = make_id_tree(tmp_path / "ids", count=12)
    image = ImageOptions(image_size=12, decoder="pillow")

    def folder(seed: int, replicas: int = 1, replica: int = 0) -> Any:
        read = ReadOptions(batch_size=8 // replicas, seed=seed, num_shards=replicas, shard_index=replica)
        return image_folder(data, read=read, image=image)

    one = mix({"a": (folder(5), 0.5), "b": (folder(6), 0.5)}, seed=1, per="example")
    threaded = mix({"a": (folder(5), 0.5), "b": (folder(6), 0.5)}, seed=1, per="example", num_threads=2)
    two = [mix({"a": (folder(5, 2, r), 0.5), "b": (folder(6, 2, r), 0.5)}, seed=1, per="example") for r in range(2)]
    for _ in range(3):
        images, ids = next(one)
        parts = [next(m) for m in two]
        built_ahead = next(threaded)  # by threads, each reading through its own copy of the sources
        assert torch.equal(images, built_ahead[0]) and torch.equal(ids, built_ahead[1])
        assert images.shape == (8, 3, 12, 12)
        assert torch.equal(images[0::2], parts[0][0]) and torch.equal(images[1::2], parts[1][0])
        assert torch.equal(ids[0::2], parts[0][1]) and torch.equal(ids[1::2], parts[1][1])
    threaded.close()


def test_what_cannot_be_blended_example_by_example_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sources\['a'\] has num_workers=2; an example-wise blend"):
        mix({"a": (arrays(X, Y, read=ReadOptions(batch_size=4, num_workers=2)), 1.0)}, per="example")
    (tmp_path / "t.txt").write_bytes(b"x" * 4096)
    text = text_chars(tmp_path / "t.txt", seq_len=8, read=ReadOptions(batch_size=2))
    with pytest.raises(ConfigError, match=r"sources\['t'\] must be a stoker.data source that reads any example"):
        mix({"t": (text, 1.0)}, per="example")
    with pytest.raises(ConfigError, match="mix: num_threads=2 builds per='example' blends; a per='batch' mixture"):
        mix(sources(), num_threads=2)
    with pytest.raises(ConfigError, match="mix: num_threads must be an integer >= 0; got -1"):
        mix(sources(), per="example", num_threads=-1)
    with pytest.raises(ConfigError, match="mix: per must be one of batch, example; got 'row'"):
        mix(sources(), per="row")
    with pytest.raises(CheckpointMismatchError, match="mixed per batch, this one per example"):
        blend().load_state_dict(mix(sources()).state_dict())
