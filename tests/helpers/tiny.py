"""Shared tiny models and data for stoker's tests."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

import stoker

torch.set_num_threads(1)  # steady and identical arithmetic in every test process


class TinyNet(nn.Module):
    """A small MLP with dropout (so resume must restore the RNG too)."""

    def __init__(self, width: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def classifier_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features)
    if labels is None:
        return stoker.EstimatorSpec(predictions={"logits": logits, "classes": logits.argmax(-1)})
    reduction = "mean" if mode == stoker.ModeKeys.TRAIN else "none"
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction=reduction),
        predictions={"logits": logits, "classes": logits.argmax(-1)},
        eval_metrics={
            "accuracy": stoker.metrics.Accuracy()(logits, labels),
            "top2": stoker.metrics.TopKAccuracy(2)(logits, labels),
        },
    )


def make_data(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


def train_input(x: torch.Tensor, y: torch.Tensor, seed: int = 0):  # noqa: ANN201
    return lambda params: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=seed).for_replica(params))


def eval_input(x: torch.Tensor, y: torch.Tensor | None = None):  # noqa: ANN201
    return lambda params: stoker.data.arrays(
        x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params)
    )


def make_estimator(model_dir: str | os.PathLike[str] | None = None, **config: object) -> stoker.Estimator:
    params = dict(config.pop("params", {}) or {})  # type: ignore[call-overload]
    batch = int(config.pop("batch", 16))  # type: ignore[call-overload]
    opt = config.pop("opt", "adam")
    schedule = config.pop("schedule", True)
    model = config.pop("model", None) or (lambda p: TinyNet())
    cfg = {"model_dir": model_dir, "progress_bar": False, "iterations_per_loop": 4, "log_every_n_steps": 10**6}
    cfg.update(config)
    return stoker.Estimator(
        model=model,
        model_fn=classifier_fn,
        optimizer=(lambda p, ps: torch.optim.Adam(ps, lr=0.01))
        if opt == "adam"
        else (lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
        lr_schedule=(lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)) if schedule else None,
        config=stoker.RunConfig(**cfg),  # type: ignore[arg-type]
        params=params,
        train_batch_size=batch,
    )


def state_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def optimizer_state_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    """Bitwise the same per-parameter state (momentum buffers, Adam moments, steps)."""
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    same = sa.keys() == sb.keys() and all(sa[k].keys() == sb[k].keys() for k in sa)
    return same and all(torch.equal(torch.as_tensor(sa[k][n]), torch.as_tensor(sb[k][n])) for k in sa for n in sa[k])
