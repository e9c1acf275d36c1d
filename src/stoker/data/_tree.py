"""Small helpers over nested batches (tensors inside dicts, tuples and lists)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch


def tree_map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    """Apply ``fn`` to every tensor leaf, keeping the structure (numpy arrays become tensors)."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, np.ndarray):
        return fn(torch.as_tensor(tree))
    if isinstance(tree, Mapping):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return type(tree)(*(tree_map(fn, v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v) for v in tree)
    return tree


def tree_leaves(tree: Any) -> list[torch.Tensor]:
    """Every tensor leaf of a nested batch, in a fixed order."""
    out: list[torch.Tensor] = []
    tree_map(out.append, tree)
    return out


def batch_rows(tree: Any) -> int | None:
    """Size of the first dimension of the first tensor leaf (``None`` if there is none)."""
    for leaf in tree_leaves(tree):
        return int(leaf.shape[0]) if leaf.dim() > 0 else None
    return None
