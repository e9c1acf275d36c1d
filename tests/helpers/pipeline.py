"""The pipeline tests' model: a small sequential classifier (also built by helpers/scripts/pipe_script.py)."""

from __future__ import annotations

from torch import nn


def make_model(params: dict) -> nn.Module:  # noqa: ARG001
    # four pipeline units with parameters, so 2 and 4 stages both have work
    return nn.Sequential(
        nn.Sequential(nn.Linear(8, 16), nn.Tanh()),
        nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
        nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
        nn.Linear(16, 3),
    )
