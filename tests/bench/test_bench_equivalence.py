"""stoker bench trains exactly what tf_cnn_benchmarks trains: per-step losses of a tiny linear
model under ``independent`` (one replica) and ``replicated`` equal a hand-written numpy
implementation of TensorFlow's optimizers (as tf_cnn_benchmarks' VariableUpdateTest)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from stoker.bench import BenchConfig, run_benchmark

IN, CLASSES, BATCH, STEPS = 4, 3, 6, 6
LR, WD = 0.1, 0.01
W0 = np.random.default_rng(0).normal(size=(CLASSES, IN)).astype(np.float32)
BATCHES = [
    (
        np.random.default_rng(s).normal(size=(BATCH, IN)).astype(np.float32),
        np.random.default_rng(s + 10).integers(0, CLASSES, BATCH),
    )
    for s in range(3)
]


def numpy_losses(optimizer: str) -> list[float]:
    """TensorFlow's updates written out: softmax cross-entropy + WD * l2_loss on W = x @ W.T."""
    w = W0.astype(np.float64)
    slots: dict[str, Any] = {
        "accum": np.zeros_like(w),
        "ms": np.ones_like(w),
        "mom": np.zeros_like(w),
        "m": np.zeros_like(w),
        "v": np.zeros_like(w),
    }
    losses = []
    for t, (x, y) in zip(range(1, STEPS + 1), itertools.cycle(BATCHES)):
        x = x.astype(np.float64)
        logits = x @ w.T
        logits -= logits.max(1, keepdims=True)
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        onehot = np.eye(CLASSES)[y]
        losses.append(float(-np.log(p[np.arange(BATCH), y]).mean() + WD * 0.5 * (w**2).sum()))
        g = (p - onehot).T @ x / BATCH + WD * w
        if optimizer == "sgd":
            w = w - LR * g
        elif optimizer == "momentum":  # MomentumOptimizer(use_nesterov=True), momentum 0.9
            slots["accum"] = 0.9 * slots["accum"] + g
            w = w - LR * (g + 0.9 * slots["accum"])
        elif optimizer == "rmsprop":  # RMSPropOptimizer(decay 0.9, momentum 0.9, epsilon 1.0), ms starts at 1
            slots["ms"] = 0.9 * slots["ms"] + 0.1 * g * g
            slots["mom"] = 0.9 * slots["mom"] + LR * g / np.sqrt(slots["ms"] + 1.0)
            w = w - slots["mom"]
        else:  # AdamOptimizer: epsilon after the bias-corrected rate
            slots["m"] = 0.9 * slots["m"] + 0.1 * g
            slots["v"] = 0.999 * slots["v"] + 0.001 * g * g
            lr_t = LR * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            w = w - lr_t * slots["m"] / (np.sqrt(slots["v"]) + 1e-8)
    return losses


def linear_model(params: dict[str, Any]) -> nn.Module:
    model = nn.Linear(IN, CLASSES, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(W0))
    return model


def input_fn(params: dict[str, Any]) -> Any:
    return itertools.cycle([(torch.from_numpy(x), torch.from_numpy(y)) for x, y in BATCHES])


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "rmsprop", "adam"])
def test_losses_match_numpy_for_every_variable_update(optimizer: str) -> None:
    expected = numpy_losses(optimizer)
    got = {}
    for update in ("independent", "replicated"):
        cfg = BenchConfig(
            model="linear",
            optimizer=optimizer,
            variable_update=update,
            batch_size=BATCH,
            num_batches=STEPS,
            num_warmup_batches=0,
            init_learning_rate=LR,
            weight_decay=WD,
            device="cpu",
            display_every=1000,
        )
        result = run_benchmark(cfg, model=linear_model, num_classes=CLASSES, input_fn=input_fn, log=lambda line: None)
        assert result["num_steps"] == STEPS
        got[update] = result["losses"]
        np.testing.assert_allclose(got[update], expected, rtol=2e-5, atol=1e-6, err_msg=f"{optimizer}/{update}")
    assert got["independent"] == got["replicated"]  # one replica: bitwise the same run


def test_gradient_clip_is_by_value() -> None:
    # A huge learning rate makes the clip the only thing bounding the first update.
    cfg = BenchConfig(
        model="linear",
        batch_size=BATCH,
        num_batches=2,
        num_warmup_batches=0,
        init_learning_rate=10.0,
        weight_decay=0.0,
        gradient_clip=0.01,
        device="cpu",
    )
    models: list[nn.Module] = []

    def keep(params: dict[str, Any]) -> nn.Module:
        models.append(linear_model(params))
        return models[-1]

    run_benchmark(cfg, model=keep, num_classes=CLASSES, input_fn=input_fn, log=lambda line: None)
    moved = np.abs(models[0].weight.detach().numpy() - W0)
    assert moved.max() <= 2 * 10.0 * 0.01 + 1e-6  # two steps of at most lr * clip per element
    assert moved.max() > 0
