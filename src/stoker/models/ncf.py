"""NCF: Neural Collaborative Filtering's NeuMF (He et al., 2017) on MovieLens-20M's id ranges.

tf_cnn_benchmarks' ``ncf`` wraps TensorFlow's official NeuMF with the MLPerf settings: 138,493
users, 26,744 items, a 64-wide generalized matrix factorization (GMF) branch and an MLP branch
of layers (256, 256, 128, 64). Each user (item) has one embedding row of 64 + 128 values: the
first 64 are its GMF factors, the other 128 its half of the MLP's 256-wide input. The GMF
branch multiplies user and item factors elementwise; the MLP concatenates the two halves and
applies dense ReLU layers 256 -> 256 -> 128 -> 64; the two branch outputs are concatenated and
a linear layer gives one logit: did the user interact with the item.

Inputs are ``[B, 2]`` integer ``(user, item)`` ids and the labels 0/1. The loss is the
reference's: softmax cross-entropy over the two logits ``(1, logit)`` (the reference keeps a
constant 1, not 0, in the first column "to match the official models", so it is a sigmoid
cross-entropy of ``logit - 1``). The data is synthetic: uniform ids and labels, as in
tf_cnn_benchmarks, which has no MovieLens input pipeline either.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .registry import register_model

NUM_USERS_20M = 138_493
NUM_ITEMS_20M = 26_744
MF_DIM = 64
MLP_LAYERS: tuple[int, ...] = (256, 256, 128, 64)


def _dense(in_features: int, out_features: int, *, lecun: bool = False) -> nn.Linear:
    """A linear layer with Keras' initialisers: Glorot-uniform (``lecun``: LeCun-uniform) weights, zero bias."""
    layer = nn.Linear(in_features, out_features)
    bound = math.sqrt(3.0 / in_features) if lecun else math.sqrt(6.0 / (in_features + out_features))
    with torch.no_grad():
        if not layer.weight.is_meta:
            nn.init.uniform_(layer.weight, -bound, bound)
            nn.init.zeros_(layer.bias)
    return layer


class NeuMF(nn.Module):
    """GMF and MLP branches over shared per-user and per-item embedding rows; ``[B, 2]`` ids -> ``[B, 1]`` logits."""

    def __init__(
        self,
        num_users: int = NUM_USERS_20M,
        num_items: int = NUM_ITEMS_20M,
        mf_dim: int = MF_DIM,
        mlp_layers: tuple[int, ...] = MLP_LAYERS,
    ) -> None:
        super().__init__()
        self.mf_dim = mf_dim
        width = mf_dim + mlp_layers[0] // 2
        self.embedding_user = nn.Embedding(num_users, width)
        self.embedding_item = nn.Embedding(num_items, width)
        for table in (self.embedding_user, self.embedding_item):
            if not table.weight.is_meta:
                nn.init.normal_(table.weight, std=0.01)
        self.mlp = nn.Sequential(
            *(
                layer
                for cin, cout in zip(mlp_layers, mlp_layers[1:], strict=False)
                for layer in (_dense(cin, cout), nn.ReLU())
            )
        )
        self.logits = _dense(mf_dim + mlp_layers[-1], 1, lecun=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        user = self.embedding_user(ids[:, 0])
        item = self.embedding_item(ids[:, 1])
        d = self.mf_dim
        gmf = user[:, :d] * item[:, :d]
        mlp = self.mlp(torch.cat([user[:, d:], item[:, d:]], dim=1))
        return self.logits(torch.cat([gmf, mlp], dim=1))


def ncf_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference's loss: softmax cross-entropy of the labels over the logits ``(1, logit)``."""
    logits = logits.float()
    return F.cross_entropy(torch.cat([torch.ones_like(logits), logits], dim=1), labels)


def synthetic_interactions(
    batch_size: int, num_classes: int, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform ``[B, 2]`` (user, item) ids over MovieLens-20M's ranges and uniform 0/1 labels."""
    users = torch.randint(0, NUM_USERS_20M, (batch_size, 1), generator=gen, device=device)
    items = torch.randint(0, NUM_ITEMS_20M, (batch_size, 1), generator=gen, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), generator=gen, device=device)
    return torch.cat([users, items], dim=1), labels


@register_model(
    "ncf",
    dataset="movielens",
    default_image_size=0,
    default_batch_size=2048,
    default_learning_rate=0.0005,
    synthetic_batch=synthetic_interactions,
    loss=ncf_loss,
    example="examples",
)
def ncf(num_classes: int) -> nn.Module:
    """NeuMF (GMF 64 + MLP 256-256-128-64) on MovieLens-20M's 138,493 users and 26,744 items."""
    if num_classes != 2:
        raise ConfigError(f"ncf predicts one interaction logit (2 classes); got num_classes={num_classes}")
    return NeuMF()
