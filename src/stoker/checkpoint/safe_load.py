"""Decoding checkpoint files without ever running code from them.

Every file stoker reads back from a checkpoint is decoded here: weights through safetensors,
``train_state.pt`` and ``input-<rank>.pt`` through torch's ``weights_only`` unpickler, JSON as
JSON, and the metadata of a sharded checkpoint (``dcp/.metadata``, which
``torch.distributed.checkpoint`` itself reads with the plain, unsafe ``pickle.load``) through a
restricted unpickler that knows only the classes that file holds. A file any of them refuses
raises :class:`~stoker.errors.CorruptCheckpointError` naming the file, why, and the checkpoint
to fall back to; it is never loaded.

A sha256 match with the index says the file is the one that was written, not that it is
safe: someone who can write the file can also write the index.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import safetensors.torch
import torch

from ..distributed.dcp_metadata import load_dcp_metadata
from ..errors import CorruptCheckpointError


def load_torch(data: bytes) -> Any:
    """A ``torch.save`` file, through torch's ``weights_only`` unpickler, onto the CPU."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_weights(data: bytes) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors."""
    return safetensors.torch.load(data)


def decode(data: bytes, fname: str, where: str, fallback: str | None) -> Any:
    """Decode checkpoint file ``fname`` (of checkpoint ``where``) by its kind.

    Raises ``CorruptCheckpointError`` naming the file, the cause and ``fallback`` (the previous
    retained checkpoint) when the decoder refuses it.
    """
    base = fname.rsplit("/", 1)[-1]
    decoder: Callable[[bytes], Any]
    if base.endswith(".safetensors"):
        decoder = load_weights
    elif base.endswith(".json"):
        decoder = json.loads
    elif base == ".metadata":
        decoder = load_dcp_metadata
    else:
        decoder = load_torch
    try:
        return decoder(data)
    except Exception as e:  # noqa: BLE001 - pickle, safetensors and json refuse with many types
        raise refused(where, fname, f"{type(e).__name__}: {_first_line(e)}", fallback) from e


def refused(where: str, fname: str, cause: str, fallback: str | None) -> CorruptCheckpointError:
    """The error for a checkpoint file that is refused, offering ``fallback``."""
    return CorruptCheckpointError(
        f"checkpoint {where!r} is corrupt: {fname} {cause}; refusing to load it{offer(where, fallback)}"
    )


def offer(where: str, fallback: str | None) -> str:
    """The sentence that names the checkpoint to use instead of a refused one (it deletes nothing)."""
    if not fallback:
        return "; no earlier checkpoint is retained"
    return f"; the previous retained checkpoint is {fallback!r}: pass checkpoint_path={fallback!r} to evaluate/predict"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else "refused"


__all__ = ["decode", "load_dcp_metadata", "load_torch", "load_weights", "offer", "refused"]
