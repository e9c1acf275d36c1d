"""Sharded data parallel (FSDP2 ``fully_shard``) and its checkpoints (``torch.distributed.checkpoint``).

Every replica holds a slice of each parameter, gradient and optimizer state; a layer's full
weights are gathered just for its forward and backward. A checkpoint is therefore written by
all replicas together, each its own slices, into ``ckpt-<step>/dcp/``; the chief adds the rest
of the training state and the index as usual. ``stoker checkpoint consolidate`` turns a
``dcp/`` directory into one ``model.safetensors``.

The load path below works for any model, sharded or not, with or without a process group,
so a sharded checkpoint also resumes in one process (or under ``replicated``).

Nothing a ``dcp/`` directory holds is unpickled in a way that runs code: DCP itself reads
``.metadata`` with the plain ``pickle.load`` and every non-tensor entry of the slices with
``torch.load(weights_only=False)``; here both go through stoker's decoders instead (the
restricted metadata unpickler of :mod:`stoker.checkpoint.safe_load`, and torch's
``weights_only`` unpickler), whoever calls: resume, evaluate, export, warm start and
``stoker checkpoint consolidate``.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from .. import storage
from ..errors import CheckpointError, CorruptCheckpointError
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
    directory: storage.Location,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    optimizer_key: str = "optimizer",
    extra: dict[str, dict[str, torch.Tensor]] | None = None,
) -> None:
    """Every replica writes its slices of the model and optimizer state (collective).

    ``optimizer_key``: where the optimizer state goes; pipeline stages each use their own
    (their ``param_groups`` would otherwise collide under one key, with different parameters).
    ``extra``: more tensors by key, sharded as they are (``RunConfig.ema``'s average: ``"ema"``).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    # str() of a UrlPath is its URL: DCP then picks its fsspec writer by itself
    dcp.save({"model": model_state, optimizer_key: optim_state, **(extra or {})}, checkpoint_id=str(directory))


def load_sharded(
    directory: storage.Location,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    optimizer_key: str = "optimizer",
    extra: dict[str, dict[str, torch.Tensor]] | None = None,
) -> None:
    """Load a ``dcp/`` checkpoint into ``model`` (and ``optimizer``), re-slicing as needed;
    ``extra``: tensors saved under more keys (``save_sharded``'s), loaded into those given."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    from .safe_dcp import SafeLoadPlanner, reader

    if optimizer is None:
        model_state = get_model_state_dict(model)
        dcp.load({"model": model_state, **(extra or {})}, storage_reader=reader(directory), planner=SafeLoadPlanner())
        set_model_state_dict(model, model_state)
        return
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load(
        {"model": model_state, optimizer_key: optim_state, **(extra or {})},
        storage_reader=reader(directory),
        planner=SafeLoadPlanner(),
    )
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def consolidate(directory: str | os.PathLike[str] | storage.Location, key: str = "model") -> dict[str, torch.Tensor]:
    """The full model weights of a ``dcp/`` checkpoint (local or fsspec URL), without a process group
    (``key="ema"``: ``RunConfig.ema``'s average of them, where the checkpoint holds one).

    Raises ``CorruptCheckpointError`` (naming the directory) for a ``.metadata`` or a slice
    entry that stoker's decoders refuse; nothing of it is unpickled unrestricted.
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from .safe_dcp import SafeEmptyPlanner, reader

    source = storage.location(directory)
    full: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        local = source
        if isinstance(source, storage.UrlPath):  # read whole files once, from a local copy
            local = Path(tmp) / "dcp"
            for name in storage.files_under(source):
                (local / name).parent.mkdir(parents=True, exist_ok=True)
                (local / name).write_bytes(storage.read_bytes(source / name))
        try:
            # what DCP's own dcp_to_torch_save does (dcp.load keeps only the keys the dict had)
            _load_state_dict(full, storage_reader=reader(local), planner=SafeEmptyPlanner(), no_dist=True)
        except pickle.UnpicklingError as e:  # the metadata, refused before DCP began
            raise CorruptCheckpointError(
                f"sharded checkpoint {str(source)!r} is corrupt: .metadata is refused ({refusal(e)}); "
                "refusing to load it"
            ) from None
        except (Exception, CheckpointException) as e:  # DCP wraps its readers' errors in a BaseException
            refused = caused_by(e, pickle.UnpicklingError)
            if refused is not None:
                raise CorruptCheckpointError(
                    f"sharded checkpoint {str(source)!r} is corrupt: it holds data stoker's decoders refuse "
                    f"({refusal(refused)}); refusing to load it"
                ) from None
            if isinstance(e, CheckpointException):  # not an Exception: say it as stoker's own
                raise CheckpointError(f"sharded checkpoint {str(source)!r} cannot be read: {refusal(e)}") from None
            raise
    return {k: v for k, v in full.get(key, {}).items() if isinstance(v, torch.Tensor)}


def caused_by(error: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """The ``kind`` exception among ``error``, its causes, and a ``CheckpointException``'s per-rank
    failures (DCP wraps its readers' errors so); ``None`` if there is none."""
    seen = 0
    while error is not None and seen < 20:
        if isinstance(error, kind):
            return error
        failures = getattr(error, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) and failure else getattr(failure, "exc", failure)
                found = caused_by(inner if isinstance(inner, BaseException) else None, kind)
                if found is not None:
                    return found
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def refusal(error: BaseException) -> str:
    """One line saying why a load failed: a ``CheckpointException``'s first rank failure (its own
    text is a page of tracebacks), the reason of torch's ``weights_only`` message (a page of
    advice), else the first line."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict):
        error = next((f[0] for f in failures.values() if isinstance(f, tuple) and f), error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("WeightsUnpickler error:")), lines[0] if lines else "")
    return f"{type(error).__name__}: {reason[:200]}"
