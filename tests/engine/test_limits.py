"""Epochs and quick runs: ``max_epochs`` and ``eval_every_n_epochs`` counted on the train input's
length (exact steps, exact on resume, in the log line), and Lightning's ``fast_dev_run``,
``limit_train_batches``, ``limit_eval_batches`` and ``overfit_batches`` (``stoker.engine.limits``):
which batches each reads, exactly, and across a resume."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

import stoker
from helpers.tiny import classifier_fn, make_estimator
from stoker.errors import ConfigError
from stoker.hooks.tracking import TrackerHook

# 64 examples whose features say their index: batches of 16, 4 per epoch
N = 64
X = torch.arange(N, dtype=torch.float32)[:, None].repeat(1, 8)
Y = torch.arange(N) % 3


def train_input(params):  # noqa: ANN001, ANN201
    return stoker.data.arrays(X, Y, read=stoker.data.ReadOptions(seed=5).for_replica(params))


def eval_input(params):  # noqa: ANN001, ANN201
    return stoker.data.arrays(X, Y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params))


def batches_of_epochs(epochs: int, per_epoch: int = 4) -> list[list[int]]:
    """The index batches the train input's first ``per_epoch`` batches of each epoch hold."""
    source = train_input({"batch_size": 16})
    return [source.batch_indices(e, b).tolist() for e in range(epochs) for b in range(per_epoch)]


class Seen:
    """A model_fn that records the example indices of every training batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, model, features, labels, mode, params):  # noqa: ANN001, ANN204
        if mode == stoker.ModeKeys.TRAIN:
            self.batches.append(features[:, 0].long().tolist())
        return classifier_fn(model, features, labels, mode, params)


def estimator(model_dir: Path | None, seen: Seen | None = None, **config: object) -> stoker.Estimator:
    est = make_estimator(model_dir, **{"iterations_per_loop": 3, **config})
    if seen is not None:
        est.model_fn = seen
    return est


class Evaluations(stoker.hooks.Hook):
    phase = "decisions"
    needs_evaluations = True

    def __init__(self) -> None:
        self.steps: list[int] = []

    def after_evaluation(self, run: stoker.hooks.RunContext, metrics: dict[str, float]) -> None:
        self.steps.append(int(metrics["global_step"]))


# ---------------------------------------------------------------------------- epochs
def test_max_epochs_ends_at_the_step_that_ends_the_epoch_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    seen = Seen()
    est = estimator(tmp_path, seen, save_checkpoints_steps=5)
    est.train(train_input, max_epochs=3)
    assert est.global_step == 12 and seen.batches == batches_of_epochs(3)
    again = Seen()
    estimator(tmp_path, again).train(train_input, max_epochs=3)
    assert again.batches == []
    resumed = Seen()  # from ckpt-10 (a kill before the end): the same batches, bitwise the same weights
    ref = (tmp_path / "ckpt-12" / "model.safetensors").read_bytes()
    shutil.rmtree(tmp_path / "ckpt-12")
    estimator(tmp_path, resumed).train(train_input, max_epochs=3)
    assert resumed.batches == batches_of_epochs(3)[10:]
    assert (tmp_path / "ckpt-12" / "model.safetensors").read_bytes() == ref


def test_an_epoch_counts_optimizer_steps_of_accumulated_batches() -> None:
    est = estimator(None, gradient_accumulation_steps=2)  # micro-batches of 8: 8 of them an epoch, 4 steps
    est.train(train_input, max_epochs=3)
    assert est.global_step == 12
    with pytest.raises(
        ConfigError, match=r"an epoch of the train input is 9 batches, which gradient_accumulation_steps=2"
    ):
        estimator(None, gradient_accumulation_steps=2, batch=14).train(train_input, max_epochs=1)


def test_an_input_without_a_length_is_refused_by_name() -> None:
    def endless(params):  # noqa: ANN001, ANN202
        while True:
            yield X[:16], Y[:16]

    with pytest.raises(ConfigError, match=r"train\(max_epochs=...\) needs an input_fn whose iterable knows its length"):
        estimator(None).train(endless, max_epochs=1)
    with pytest.raises(ConfigError, match="train: give max_steps or max_epochs, not both"):
        estimator(None).train(train_input, max_steps=3, max_epochs=1)


def test_evaluations_every_n_epochs_fall_on_epoch_ends_also_across_a_resume(tmp_path: Path) -> None:
    whole, first, second = Evaluations(), Evaluations(), Evaluations()
    estimator(tmp_path / "whole").train_and_evaluate(
        train_input, eval_input, max_epochs=4, eval_every_n_epochs=1, hooks=[whole]
    )
    assert whole.steps == [4, 8, 12, 16]  # loops of 3 end at the epochs' ends
    estimator(tmp_path / "cut").train_and_evaluate(
        train_input, eval_input, max_epochs=2, eval_every_n_epochs=1, hooks=[first]
    )
    estimator(tmp_path / "cut").train_and_evaluate(
        train_input, eval_input, max_epochs=4, eval_every_n_epochs=1, hooks=[second]
    )
    assert first.steps == [4, 8] and second.steps == [8, 12, 16]  # the resumed step's, again (after_evaluation)
    a, b = (tmp_path / d / "ckpt-16" / "model.safetensors" for d in ("whole", "cut"))
    assert a.read_bytes() == b.read_bytes()
    every_other = Evaluations()
    estimator(None).train_and_evaluate(
        train_input, eval_input, max_steps=13, eval_every_n_epochs=2, hooks=[every_other]
    )
    assert every_other.steps == [8, 13]  # every 2 epochs (8 steps), and the end


def test_the_log_line_says_the_epoch(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="stoker"):
        estimator(None, log_every_n_steps=6).train(train_input, max_epochs=3)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(", loss")[0] for line in lines] == ["step 6", "step 12"]
    assert "epoch 1.50" in lines[0] and "epoch 3.00" in lines[1]


# ---------------------------------------------------------------------------- limits
def test_limit_train_batches_reads_the_first_batches_of_every_epoch_and_resumes_exactly(tmp_path: Path) -> None:
    first_two = [b for i, b in enumerate(batches_of_epochs(4)) if i % 4 < 2]
    seen = Seen()
    est = estimator(tmp_path / "a", seen, limit_train_batches=2)
    est.train(train_input, max_epochs=4)  # an epoch is 2 batches now
    assert est.global_step == 8 and seen.batches == first_two
    cut, rest = Seen(), Seen()
    estimator(tmp_path / "b", cut, limit_train_batches=2, save_checkpoints_steps=3).train(train_input, max_steps=3)
    estimator(tmp_path / "b", rest, limit_train_batches=2).train(train_input, max_steps=8)
    assert cut.batches + rest.batches == first_two
    a, b = (tmp_path / d / "ckpt-8" / "model.safetensors" for d in "ab")
    assert a.read_bytes() == b.read_bytes()
    half = Seen()
    estimator(None, half, limit_train_batches=0.5).train(train_input, max_epochs=2)  # half of 4 batches
    assert half.batches == first_two[:4]


def test_overfit_batches_reads_the_first_batches_over_and_over_and_resumes_exactly(tmp_path: Path) -> None:
    b0, b1 = batches_of_epochs(1)[:2]
    seen, cut, rest = Seen(), Seen(), Seen()
    estimator(tmp_path / "a", seen, overfit_batches=2).train(train_input, max_epochs=3)
    assert seen.batches == [b0, b1] * 3
    estimator(tmp_path / "b", cut, overfit_batches=2, save_checkpoints_steps=3).train(train_input, max_steps=3)
    estimator(tmp_path / "b", rest, overfit_batches=2).train(train_input, max_steps=6)
    assert cut.batches + rest.batches == [b0, b1] * 3
    a, b = (tmp_path / d / "ckpt-6" / "model.safetensors" for d in "ab")
    assert a.read_bytes() == b.read_bytes()
    # and evaluation reads as many batches of the eval input
    est = estimator(tmp_path / "a", overfit_batches=2)
    plain = estimator(tmp_path / "a")
    assert est.evaluate(eval_input) == plain.evaluate(eval_input, steps=2)


def test_limit_eval_batches_reads_the_first_batches_of_each_evaluation(tmp_path: Path) -> None:
    estimator(tmp_path).train(train_input, max_steps=4)
    plain = estimator(tmp_path).evaluate(eval_input, steps=3)
    assert estimator(tmp_path, limit_eval_batches=3).evaluate(eval_input) == plain
    assert estimator(tmp_path, limit_eval_batches=0.75).evaluate(eval_input) == plain
    assert estimator(tmp_path).evaluate(eval_input) != plain


@pytest.mark.parametrize(
    "field, value",
    [("limit_train_batches", 0), ("limit_eval_batches", 1.5), ("overfit_batches", -1), ("limit_train_batches", True)],
)
def test_a_bad_limit_is_named(field: str, value: object) -> None:
    with pytest.raises(
        ConfigError, match=rf"RunConfig.{field} must be None, a positive integer \(batches\) or a fraction"
    ):
        stoker.RunConfig(**{field: value})


def test_limit_train_batches_needs_a_source_with_an_epoch_position() -> None:
    def plain(params):  # noqa: ANN001, ANN202
        return [(X[:16], Y[:16])] * 4

    with pytest.raises(
        ConfigError, match="limit_train_batches cuts every epoch of a source with an .epoch, batch. position"
    ):
        estimator(None, limit_train_batches=2).train(plain, max_steps=2)


# ---------------------------------------------------------------------------- fast_dev_run
class NeverOpened(TrackerHook):
    def _open(self, run):  # noqa: ANN001, ANN202
        raise AssertionError("a quick run opened a tracker")


def test_fast_dev_run_runs_one_batch_of_each_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = tmp_path / "run"
    seen = Seen()
    est = estimator(model_dir, seen, fast_dev_run=True)
    with caplog.at_level(logging.INFO, logger="stoker"):
        est.train(train_input, max_steps=100, hooks=[NeverOpened()])
    assert est.global_step == 1 and seen.batches == batches_of_epochs(1)[:1]
    assert any("fast_dev_run" in r.getMessage() and "NeverOpened left out" in r.getMessage() for r in caplog.records)
    ref = make_estimator(None)
    ref.model.load_state_dict(est.model.state_dict())
    ref.initialize()
    assert est.evaluate(eval_input) == {**ref.evaluate(eval_input, steps=1), "global_step": 1}
    assert len(list(est.predict(eval_input))) == 16  # one batch
    final = est.train_and_evaluate(train_input, eval_input, max_steps=50, eval_every_n_steps=1)
    assert est.global_step == 2 and final["global_step"] == 2  # one more step, and its evaluation
    assert not model_dir.exists()
    three = estimator(None, fast_dev_run=3)
    three.train(train_input)
    assert three.global_step == 3
    with pytest.raises(ConfigError, match="RunConfig.fast_dev_run must be True, False or a positive integer; got -1"):
        stoker.RunConfig(fast_dev_run=-1)
