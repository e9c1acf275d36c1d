"""Sharded data parallel (FSDP2 ``fully_shard``) and its checkpoints (``torch.distributed.checkpoint``).

Every replica holds a slice of each parameter, gradient and optimizer state; a layer's full
weights are gathered just for its forward and backward. A checkpoint is therefore written by
all replicas together, each its own slices, into ``ckpt-<step>/dcp/``; the chief adds the rest
of the training state and the index as usual. ``stoker checkpoint consolidate`` turns a
``dcp/`` directory into one ``model.safetensors``.

The load path below works for any model, sharded or not, with or without a process group,
so a sharded checkpoint also resumes in one process (or under ``replicated``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from .. import storage
from .process_group import ProcessGroupStrategy

DCP_DIR = "dcp"


class Sharded(ProcessGroupStrategy):
    """FSDP2: parameters, gradients and optimizer state sharded over replicas."""

    shards_state = True

    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        # Shard each direct child that owns parameters as its own unit (so only one unit's
        # full weights exist at a time), then the root for whatever parameters remain.
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
        return model

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        # every value of a full model state dict is a tensor (the stub allows any state value)
        return {k: cast(torch.Tensor, v).detach().cpu() for k, v in full.items()}


def save_sharded(
    directory: storage.Location, model: nn.Module, optimizer: torch.optim.Optimizer, optimizer_key: str = "optimizer"
) -> None:
    """Every replica writes its slices of the model and optimizer state (collective).

    ``optimizer_key``: where the optimizer state goes; pipeline stages each use their own
    (their ``param_groups`` would otherwise collide under one key, with different parameters).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    # str() of a UrlPath is its URL: DCP then picks its fsspec writer by itself
    dcp.save({"model": model_state, optimizer_key: optim_state}, checkpoint_id=str(directory))


def load_sharded(
    directory: storage.Location,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    optimizer_key: str = "optimizer",
) -> None:
    """Load a ``dcp/`` checkpoint into ``model`` (and ``optimizer``), re-slicing as needed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if optimizer is None:
        model_state = get_model_state_dict(model)
        dcp.load({"model": model_state}, checkpoint_id=str(directory))
        set_model_state_dict(model, model_state)
        return
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, optimizer_key: optim_state}, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def consolidate(directory: str | os.PathLike[str] | storage.Location) -> dict[str, torch.Tensor]:
    """The full model weights of a ``dcp/`` checkpoint (local or fsspec URL), without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        source = storage.location(directory)
        if isinstance(source, storage.UrlPath):  # DCP's converter reads local files only: copy it down
            local = Path(tmp) / "dcp"
            for name in storage.files_under(source):
                (local / name).parent.mkdir(parents=True, exist_ok=True)
                (local / name).write_bytes(storage.read_bytes(source / name))
            source = local
        out = Path(tmp) / "full.pt"
        dcp_to_torch_save(str(source), str(out))
        full: dict[str, Any] = torch.load(out, map_location="cpu", weights_only=True)
    return {k: v for k, v in full["model"].items() if isinstance(v, torch.Tensor)}
