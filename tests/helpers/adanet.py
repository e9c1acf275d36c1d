"""Tiny AdaNet searches for the tests: shared builders and data (the job that the crash tests run
as a real subprocess is helpers/scripts/adanet_script.py)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

import stoker
from stoker import adanet

IN, CLASSES = 8, 3


def make_data(n: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


def train_input(x: torch.Tensor, y: torch.Tensor, seed: int = 0):  # noqa: ANN201
    return lambda p: stoker.data.arrays(
        x, y, read=stoker.data.ReadOptions(seed=seed + 100 * p.get("adanet_iteration", 0)).for_replica(p)
    )


def eval_input(x: torch.Tensor, y: torch.Tensor | None = None):  # noqa: ANN201
    return lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p))


class MLP(nn.Module):
    """``depth`` hidden layers with dropout (so resume must restore RNGs); complexity sqrt(depth)."""

    def __init__(
        self, depth: int, width: int = 8, out: int = CLASSES, dropout: float = 0.1, sleep: float = 0.0
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = IN
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU(), nn.Dropout(dropout)]
            d = width
        self.hidden = nn.Sequential(*layers)
        self.logits = nn.Linear(d, out)
        self.depth = depth
        self.sleep = sleep

    def forward(self, x: torch.Tensor) -> adanet.Subnetwork:
        if self.sleep and self.training:
            time.sleep(self.sleep)  # slows the run so a kill lands mid-way; changes no number
        h = self.hidden(x)
        return adanet.Subnetwork(
            last_layer=h, logits=self.logits(h), complexity=math.sqrt(self.depth), shared={"depth": self.depth}
        )


class MLPBuilder(adanet.Builder):
    def __init__(
        self, depth: int, lr: float = 0.01, out: int = CLASSES, sleep: float = 0.0, optimizer: str = "adam"
    ) -> None:
        self.depth, self.lr, self.out, self.sleep, self.optimizer = depth, lr, out, sleep, optimizer

    @property
    def name(self) -> str:
        return f"mlp{self.depth}"

    def build_subnetwork(
        self, features: Any, logits_dimension: int, training: bool, iteration_step: torch.Tensor, previous_ensemble: Any
    ) -> nn.Module:
        return MLP(self.depth, out=logits_dimension, sleep=self.sleep)

    def build_subnetwork_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD(parameters, lr=self.lr)
        return torch.optim.Adam(parameters, lr=self.lr)


class GrowingGenerator(adanet.Generator):
    """simple_dnn-style: as deep as the newest subnetwork of the ensemble, and one deeper."""

    def __init__(self, sleep: float = 0.0, lr: float = 0.01) -> None:
        self.sleep, self.lr = sleep, lr
        self.calls: list[dict[str, Any]] = []

    def generate_candidates(
        self,
        previous_ensemble: adanet.Ensemble | None,
        iteration_number: int,
        previous_ensemble_reports: Sequence[adanet.MaterializedReport],
        all_reports: Sequence[adanet.MaterializedReport],
    ) -> Sequence[adanet.Builder]:
        self.calls.append(
            {
                "iteration": iteration_number,
                "previous_reports": list(previous_ensemble_reports),
                "all_reports": list(all_reports),
            }
        )
        depth = previous_ensemble.weighted_subnetworks[-1].subnetwork.shared["depth"] if previous_ensemble else 1
        return [MLPBuilder(depth, self.lr, sleep=self.sleep), MLPBuilder(depth + 1, self.lr, sleep=self.sleep)]


def run_config(model_dir: str | os.PathLike[str], **changes: Any) -> stoker.RunConfig:
    cfg: dict[str, Any] = {
        "model_dir": str(model_dir),
        "progress_bar": False,
        "iterations_per_loop": 4,
        "save_checkpoints_steps": 8,
        "log_every_n_steps": 10**6,
        "summaries": False,
        "device": "cpu",
    }
    cfg.update(changes)
    return stoker.RunConfig(**cfg)


def make_search(
    model_dir: str | os.PathLike[str], *, steps: int = 24, iterations: int = 3, sleep: float = 0.0, **kwargs: Any
) -> adanet.Estimator:
    """A 3-class search over growing MLPs with learned SCALAR mixture weights."""
    config = kwargs.pop("config", None) or run_config(model_dir, **kwargs.pop("run", {}))
    kwargs.setdefault(
        "ensemblers",
        [adanet.ComplexityRegularizedEnsembler(lambda ps: torch.optim.SGD(ps, lr=0.05), adanet_lambda=0.01)],
    )
    return adanet.Estimator(
        adanet.MultiClassHead(CLASSES),
        kwargs.pop("generator", None) or GrowingGenerator(sleep=sleep),
        steps,
        max_iterations=iterations,
        config=config,
        train_batch_size=kwargs.pop("batch", 16),
        **kwargs,
    )


STEPS, ITERATIONS = 8, 2


def small_search(model_dir: str, **kwargs: object):  # noqa: ANN201
    """``make_search`` with ``ITERATIONS`` iterations of ``STEPS`` steps and a checkpoint every 4
    steps: the search of the object-store tests (memory:// and S3)."""
    return make_search(
        model_dir,
        steps=STEPS,
        iterations=ITERATIONS,
        run={"save_checkpoints_steps": 4, "iterations_per_loop": 4},
        **kwargs,
    )
