"""A checkpoint_path or warm_start_from that holds no checkpoint is one line naming the argument it
came from and what is wrong: missing, a model_dir without a checkpoint, or neither kind of folder."""

from __future__ import annotations

import pytest
import torch

import stoker
from helpers.tiny import TinyNet, classifier_fn, eval_input, make_data, make_estimator, train_input
from stoker.errors import CheckpointError


@pytest.fixture
def trained(tmp_path):  # noqa: ANN201
    x, y = make_data(32)
    est = make_estimator(tmp_path / "m")
    est.train(train_input(x, y), max_steps=4)
    return est, x, y


def test_checkpoint_path_that_does_not_exist(tmp_path, trained):
    est, x, y = trained
    with pytest.raises(CheckpointError) as e:
        est.evaluate(eval_input(x, y), checkpoint_path=tmp_path / "nope")
    assert str(e.value) == f"checkpoint_path {str(tmp_path / 'nope')!r} does not exist"
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(CheckpointError) as e:
        next(est.predict(eval_input(x), checkpoint_path=other))
    assert str(e.value) == (
        f"checkpoint_path {str(other)!r} is neither a model_dir (with checkpoint.json) nor a checkpoint "
        "directory (with model.safetensors)"
    )


def warm_started(model_dir, source) -> stoker.Estimator:  # noqa: ANN001
    return stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=classifier_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(model_dir=model_dir, progress_bar=False),
        train_batch_size=8,
        warm_start_from=source,
    )


def test_warm_start_from_names_itself(tmp_path, trained):
    _, x, y = trained
    with pytest.raises(CheckpointError) as e:
        warm_started(tmp_path / "a", tmp_path / "missing").train(train_input(x, y), max_steps=2)
    assert str(e.value) == f"warm_start_from {str(tmp_path / 'missing')!r} does not exist"
    empty = tmp_path / "empty"
    make_estimator(empty)  # a model_dir made, never trained (it said checkpoint_path, an argument not given)
    with pytest.raises(CheckpointError) as e:
        warm_started(tmp_path / "b", empty).train(train_input(x, y), max_steps=2)
    assert str(e.value) == (
        f"warm_start_from {str(empty)!r} is neither a model_dir (with checkpoint.json) nor a checkpoint "
        "directory (with model.safetensors)"
    )
    assert warm_started(tmp_path / "c", tmp_path / "m").train(train_input(x, y), max_steps=2).global_step == 2
