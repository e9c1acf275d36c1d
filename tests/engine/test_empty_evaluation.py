"""An evaluation whose input_fn yields nothing is an error in one line, never a result without
metrics (it used to log `eval at step 4: ` and return only the step); in train_and_evaluate the
checkpoint of that step is kept and a rerun with data resumes from it."""

from __future__ import annotations

import json

import pytest

from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.errors import DataError

MESSAGE = (
    "evaluate: input_fn yielded no batch (an empty data set, or a source already at its end); nothing was evaluated"
)


def nothing(params):  # noqa: ANN001, ANN201
    return iter([])


def test_evaluate_on_no_batch_is_one_line(tmp_path):
    x, y = make_data(32)
    est = make_estimator(tmp_path / "m")
    est.train(train_input(x, y), max_steps=4)
    with pytest.raises(DataError) as e:
        est.evaluate(nothing)
    assert str(e.value) == MESSAGE
    assert est.evaluate(eval_input(x, y))["global_step"] == 4  # a real evaluation still works
    index = json.loads((tmp_path / "m" / "checkpoint.json").read_text())
    assert [c.get("metrics", {}).keys() >= {"loss"} for c in index["checkpoints"]] == [True]  # only the real one


def test_train_and_evaluate_keeps_the_checkpoint_and_resumes(tmp_path):
    x, y = make_data(32)
    with pytest.raises(DataError, match="^evaluate: input_fn yielded no batch"):
        make_estimator(tmp_path / "m").train_and_evaluate(train_input(x, y), nothing, max_steps=8, eval_every_n_steps=4)
    assert json.loads((tmp_path / "m" / "checkpoint.json").read_text())["latest"] == "ckpt-4"  # nothing lost
    again = make_estimator(tmp_path / "m")
    results = again.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=8, eval_every_n_steps=4)
    assert results["global_step"] == 8 and "loss" in results
