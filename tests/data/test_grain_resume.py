"""A grain pipeline as the input: its ``get_state``/``set_state`` are checkpointed and a
resumed run is bitwise the same as one run (skipped where grain is not installed)."""

from __future__ import annotations

import logging

import pytest

from helpers.tiny import make_data, make_estimator, state_equal

grain = pytest.importorskip("grain")


def grain_input(x, y):  # noqa: ANN001, ANN201
    """Shuffled (seeded), repeated, batched: a DatasetIterator, which has get_state/set_state."""

    def input_fn(params):  # noqa: ANN001, ANN202
        ds = grain.MapDataset.range(x.shape[0]).shuffle(seed=7).repeat(None)
        ds = ds.map(lambda i: (x[i].numpy(), int(y[i]))).to_iter_dataset().batch(params["batch_size"])
        return iter(ds)

    return input_fn


def test_grain_iterator_state_is_checkpointed_and_resumes_bitwise(tmp_path, caplog):
    x, y = make_data(100)
    input_fn = grain_input(x, y)
    whole = make_estimator(tmp_path / "whole", iterations_per_loop=5)
    whole.train(input_fn, max_steps=17)
    make_estimator(tmp_path / "split", iterations_per_loop=5).train(input_fn, max_steps=8)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        resumed = make_estimator(tmp_path / "split", iterations_per_loop=5)
        resumed.train(input_fn, max_steps=17)
    assert state_equal(whole.model, resumed.model)
    assert not [r for r in caplog.records if "replaying" in r.getMessage()]  # restored by set_state, not replayed
