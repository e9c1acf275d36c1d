"""The engine's components on their own, as a watching evaluator or the harness would use them:
no Estimator, no private names, the same numbers as the facade."""

from __future__ import annotations

import pytest
import torch

import stoker
from helpers.tiny import TinyNet, classifier_fn, eval_input, make_data, make_estimator, state_equal, train_input
from stoker.checkpoint import CheckpointManager
from stoker.distributed import make_strategy
from stoker.engine import (
    EvaluationRun,
    InputPlan,
    ModelState,
    PredictionRun,
    TrainingRun,
    bind_model_fn,
    default_hooks,
)
from stoker.spec import ModeKeys


def _parts(model_dir, with_optimizer: bool = True, batch: int = 16):  # noqa: ANN001, ANN202
    config = stoker.RunConfig(
        model_dir=str(model_dir), progress_bar=False, iterations_per_loop=4, log_every_n_steps=10**6
    )
    strategy = make_strategy(config.strategy, config.device, config.distributed_timeout)
    state = ModelState(
        model=lambda p: TinyNet(),
        params={},
        config=config.state_config,
        precision=config.make_precision(),
        strategy=strategy,
        checkpoints=CheckpointManager(model_dir, keep_checkpoint_max=config.keep_checkpoint_max, writer=True),
        optimizer=(lambda p, ps: torch.optim.Adam(ps, lr=0.01)) if with_optimizer else None,
        lr_schedule=(lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5))
        if with_optimizer
        else None,
    )
    inputs = InputPlan(params=state.params, config=config.input_config, strategy=strategy, train_batch_size=batch)
    return config, state, inputs


def test_an_evaluation_run_alone_reads_what_the_estimator_wrote(tmp_path):
    x, y = make_data(203)
    est = make_estimator(tmp_path)
    est.train(train_input(x, y), max_steps=8)
    expected = est.evaluate(eval_input(x, y))
    config, state, inputs = _parts(tmp_path, with_optimizer=False)
    results = EvaluationRun(state, inputs, bind_model_fn(classifier_fn), config=config.eval_config).run(
        eval_input(x, y), checkpoint_path=tmp_path / "ckpt-8"
    )
    assert results == expected
    assert state.weights_of == tmp_path / "ckpt-8" and state.global_step == 8
    rows = list(PredictionRun(state, inputs, bind_model_fn(classifier_fn)).run(eval_input(x), single=False))
    torch.testing.assert_close(torch.cat([r["logits"] for r in rows]), est.model.eval()(x).detach())


def test_a_training_run_alone_resumes_the_estimators_run_bitwise(tmp_path):
    x, y = make_data(100)
    whole = make_estimator(tmp_path / "w")
    whole.train(train_input(x, y), max_steps=12)
    make_estimator(tmp_path / "s").train(train_input(x, y), max_steps=5)
    config, state, inputs = _parts(tmp_path / "s")
    hooks = default_hooks(config.loop_config, config.checkpoint_config)
    run = TrainingRun(
        state, inputs, bind_model_fn(classifier_fn), hooks, loop=config.loop_config, info=stoker.config.run_info(config)
    )
    run.run(train_input(x, y), max_steps=12)
    assert state.global_step == 12 and state.holds == tmp_path / "s" / "ckpt-12"
    assert state_equal(whole.model, state.model)


def test_input_plan_refuses_a_batch_replicas_cannot_share():
    config = stoker.RunConfig(gradient_accumulation_steps=3)
    strategy = make_strategy(config.strategy, config.device, config.distributed_timeout)
    with pytest.raises(
        ValueError, match=r"train_batch_size=16 is not divisible by 3 \(1 replicas x 3 accumulation steps\)"
    ):
        InputPlan(params={}, config=config.input_config, strategy=strategy, train_batch_size=16)
    plan = InputPlan(
        params={"w": 1}, config=config.input_config, strategy=strategy, train_batch_size=12, eval_batch_size=5
    )
    assert plan.mode_params(ModeKeys.TRAIN) == {
        "w": 1,
        "batch_size": 4,
        "num_replicas": 1,
        "replica_index": 0,
        "cache": None,
    }
    assert plan.per_replica(ModeKeys.EVAL) == 5 and plan.per_replica(ModeKeys.PREDICT) == 5
