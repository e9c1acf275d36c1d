"""Exact resume: stopping and continuing gives bitwise the same weights as one run."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import stoker
from helpers.tiny import TinyNet, make_data, make_estimator, optimizer_state_equal, state_equal, train_input


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("opt", ["adam", "momentum"])
def test_resume_is_bitwise_equal(tmp_path, precision, opt):
    x, y = make_data(100)  # 6 batches of 16 per epoch: the runs cross epoch boundaries
    kwargs = dict(precision=precision, opt=opt, iterations_per_loop=3, save_checkpoints_steps=5)
    if precision == "fp16":
        kwargs.update(loss_scale=stoker.LossScale(init=2.0**20, growth_interval=3))  # overflow, back off, grow
    whole = make_estimator(tmp_path / "whole", **kwargs)
    whole.train(train_input(x, y), max_steps=22)

    first = make_estimator(tmp_path / "split", **kwargs)
    first.train(train_input(x, y), max_steps=11)
    second = make_estimator(tmp_path / "split", **kwargs)  # a new process would build a new one
    second.train(train_input(x, y), max_steps=22)

    assert whole.global_step == second.global_step == 22
    assert state_equal(whole.model, second.model)
    assert optimizer_state_equal(whole.state.optimizer, second.state.optimizer)
    if precision == "fp16":
        assert whole.state.scaler.state_dict() == second.state.scaler.state_dict()
        assert whole.state.scaler.skipped_steps > 0  # the dynamic scale really backed off


def test_two_train_calls_in_one_process_equal_one(tmp_path):
    x, y = make_data(100)
    one = make_estimator(tmp_path / "a")
    one.train(train_input(x, y), max_steps=20)
    two = make_estimator(tmp_path / "b")
    two.train(train_input(x, y), steps=9)
    two.train(train_input(x, y), steps=11)
    assert two.global_step == 20
    assert state_equal(one.model, two.model)


def test_resume_without_model_dir_in_memory(tmp_path):
    x, y = make_data(100)
    one = make_estimator(None)
    one.train(train_input(x, y), max_steps=13)
    two = make_estimator(None)
    two.train(train_input(x, y), max_steps=6)
    two.train(train_input(x, y), max_steps=13)
    assert state_equal(one.model, two.model)


class CountingStateful:
    """A user iterable with state_dict/load_state_dict (a StatefulDataLoader stand-in)."""

    def __init__(self, x, y, batch):
        self.x, self.y, self.batch, self.pos = x, y, batch, 0

    def __iter__(self):
        return self

    def __next__(self):
        n = self.x.shape[0] // self.batch
        i = self.pos % n
        self.pos += 1
        sl = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[sl], self.y[sl]

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


class PlainIterable:
    def __init__(self, x, y, batch):
        self.x, self.y, self.batch = x, y, batch

    def __iter__(self):
        n = self.x.shape[0] // self.batch
        for i in range(10**6):
            sl = slice((i % n) * self.batch, (i % n + 1) * self.batch)
            yield self.x[sl], self.y[sl]


@pytest.mark.parametrize("kind", ["stateful", "plain"])
def test_user_iterables_resume(tmp_path, kind, caplog):
    x, y = make_data(100)
    cls = CountingStateful if kind == "stateful" else PlainIterable
    input_fn = lambda p: cls(x, y, p["batch_size"])  # noqa: E731
    whole = make_estimator(tmp_path / "w", iterations_per_loop=5)
    whole.train(input_fn, max_steps=17)
    make_estimator(tmp_path / "s", iterations_per_loop=5).train(input_fn, max_steps=8)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        resumed = make_estimator(tmp_path / "s", iterations_per_loop=5)
        resumed.train(input_fn, max_steps=17)
    assert state_equal(whole.model, resumed.model)
    replay_warnings = [r for r in caplog.records if "replaying 8 batches" in r.getMessage()]
    assert len(replay_warnings) == (1 if kind == "plain" else 0)


def test_input_state_is_the_consumed_position_not_the_prefetched_one(tmp_path, monkeypatch):
    # In-memory arrays are fetched inline on the CPU; make the infeed start its prefetch thread
    # after a probe of one batch, so the thread really runs ahead of the loop here.
    from stoker.data.arrays import ArraySource
    from stoker.engine import infeed as infeed_module

    monkeypatch.setattr(infeed_module, "PROBE_BATCHES", 1)
    monkeypatch.setattr(infeed_module, "THREAD_PAYS_ABOVE_S", 0.0)
    monkeypatch.setattr(ArraySource, "prefers_inline_fetch", False)
    started = []
    start_thread = infeed_module.Infeed._start_thread
    monkeypatch.setattr(
        infeed_module.Infeed, "_start_thread", lambda self: (started.append(self.consumed), start_thread(self))
    )
    x, y = make_data(100)
    est = make_estimator(tmp_path, iterations_per_loop=4, prefetch_depth=4)
    est.train(train_input(x, y), max_steps=6)  # loops of 4 and 2: the last is not a snapshot boundary
    assert started == [2]  # the warm-up batch and the one probed batch were fetched inline
    import json

    state = json.loads((tmp_path / "ckpt-6" / "input-0.json").read_text())
    # snapshot after batch 4 (epoch 0, batch 4) plus 2 consumed since: position 6 of 6 batches/epoch
    assert state == {
        "skip": 2,
        "source": {
            "batch": 4,
            "batch_size": 16,
            "epoch": 0,
            "num_examples": 100,
            "num_shards": 1,
            "samples": 64,  # examples of the epoch's global order read: 4 batches of 16
            "seed": 0,
            "shard_index": 0,
        },
    }


def cache_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    memory = params["cache"]
    if memory is None:
        memory = torch.zeros(features.shape[0], 8)
    h = torch.tanh(features + memory)
    logits = model(h)
    loss = F.cross_entropy(logits, labels)
    return stoker.EstimatorSpec(loss=loss, cache=h)


def test_carried_cache_is_detached_and_resumed(tmp_path):
    x, y = make_data(100)

    def build(d):
        return stoker.Estimator(
            model=lambda p: TinyNet(dropout=0.0),
            model_fn=cache_fn,
            optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
            config=stoker.RunConfig(model_dir=d, progress_bar=False, iterations_per_loop=3),
            train_batch_size=10,
        )

    whole = build(tmp_path / "w")
    whole.train(train_input(x, y), max_steps=14)
    build(tmp_path / "s").train(train_input(x, y), max_steps=7)
    resumed = build(tmp_path / "s")
    resumed.train(train_input(x, y), max_steps=14)
    assert state_equal(whole.model, resumed.model)
    assert torch.equal(whole.state.cache, resumed.state.cache)
    assert not whole.state.cache.requires_grad
