"""The files of one checkpoint: their names, how they are serialised, read back and verified.

``stoker.checkpoint`` commits them (index, retention); this module only turns state into
bytes and bytes (checked against the index, decoded safely by ``stoker.checkpoint.safe_load``) back into
state, on a local directory or an fsspec URL alike (``stoker.storage``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import safetensors.torch
import torch
from torch import nn

from .. import storage
from ..errors import CheckpointError, DamagedCheckpointError, StorageError
from ..storage.stores import Location
from . import safe_load
from .index import INDEX_FORMAT, INDEX_NAME, CheckpointIndex, CheckpointRecord
from .manifest import MANIFEST_NAME, OWN_FILES, Manifest

log = logging.getLogger("stoker")

INDEX_LOCK_NAME = "checkpoint.lock"
MODEL_FILE = "model.safetensors"
EMA_FILE = "ema.safetensors"  # RunConfig.ema's average of the weights, by their names
TRAIN_STATE_FILE = "train_state.pt"
# ckpt-<step>, or on an object store ckpt-<step>.<unique suffix> (a fresh prefix per write)
CKPT_RE = re.compile(r"^ckpt-(\d+)(?:\.([0-9a-f]{8,}))?$")


@dataclass
class LoadedCheckpoint:
    """What a checkpoint holds, read and verified."""

    path: Location
    step: int
    model_state: dict[str, torch.Tensor] | None  # None: the weights are in ``dcp_dir``
    train_state: dict[str, Any]
    input_states: dict[int, Any] = field(default_factory=dict)
    dcp_dir: Location | None = None
    ema_state: dict[str, torch.Tensor] | None = None  # ``ema.safetensors`` (sharded runs: in ``dcp_dir``)


def step_of(path: Location) -> int:
    m = CKPT_RE.match(path.name)
    return int(m.group(1)) if m else -1


def model_state_to_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """Serialise weights as safetensors (tied tensors are stored once per name, as copies)."""
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
    # One metadata key only: safetensors writes metadata from a hash map, so the order of
    # several keys (and so the file bytes) would change from run to run.
    return safetensors.torch.save(tensors, metadata={"format": "pt"})


def serialize_input_state(state: Any) -> tuple[str, bytes]:
    """Input state as JSON when it is plain data (readable, tiny), else as a torch file."""
    try:
        return "json", json.dumps(state, sort_keys=True).encode()
    except (TypeError, ValueError):
        buf = io.BytesIO()
        torch.save(state, buf)
        return "pt", buf.getvalue()


def checkpoint_blobs(
    model_state: Mapping[str, torch.Tensor] | None,
    train_state: Mapping[str, Any],
    input_states: Mapping[int, Any] | None,
    ema_state: Mapping[str, torch.Tensor] | None = None,
) -> list[tuple[str, bytes]]:
    """Every file the chief writes for a checkpoint, as ``(name, bytes)``."""
    blobs: list[tuple[str, bytes]] = []
    if model_state is not None:
        blobs.append((MODEL_FILE, model_state_to_bytes(model_state)))
    if ema_state is not None:
        blobs.append((EMA_FILE, model_state_to_bytes(ema_state)))
    buf = io.BytesIO()
    torch.save(dict(train_state), buf)
    blobs.append((TRAIN_STATE_FILE, buf.getvalue()))
    for rank, state in sorted((input_states or {}).items()):
        ext, data = serialize_input_state(state)
        blobs.append((f"input-{rank}.{ext}", data))
    return blobs


def _index(model_dir: Location) -> CheckpointIndex | None:
    """``model_dir``'s index, or ``None`` when there is none or it cannot be read."""
    try:
        return CheckpointIndex.parse(storage.read_bytes(model_dir / INDEX_NAME), str(model_dir / INDEX_NAME))
    except (OSError, CheckpointError):
        return None


def index_record(path: Location) -> CheckpointRecord | None:
    """The index record that names checkpoint directory ``path`` (``None``: not indexed)."""
    index = _index(path.parent)
    return None if index is None else index.record_in(path.name)


def previous_retained(path: Location) -> str | None:
    """The retained checkpoint before ``path``, to offer when ``path`` is refused."""
    index = _index(path.parent)
    if index is None:
        return None
    earlier = [r for r in index.checkpoints if r.directory != path.name and r.step < step_of(path)]
    return str(path.parent / earlier[-1].directory) if earlier else None


def expected_files(path: Location) -> tuple[Mapping[str, str] | None, str]:
    """The sha256 every file of checkpoint ``path`` must have, and what says so: the index
    record that names it, else the checkpoint's own manifest; ``(None, "")`` when neither does."""
    record = index_record(path)
    if record is not None:
        return record.files, "the index"
    try:
        data = storage.read_bytes(path / MANIFEST_NAME)
    except (OSError, StorageError):
        return None, ""
    try:
        return Manifest.parse(data, str(path / MANIFEST_NAME)).files, "its manifest"
    except CheckpointError as e:
        log.warning("%s; its files are checked against nothing", e)
        return None, ""


def damaged(path: Location, what: str) -> DamagedCheckpointError:
    """The error for checkpoint ``path`` whose bytes are not the ones written (``what``: how)."""
    return DamagedCheckpointError(
        f"checkpoint {str(path)!r} is corrupt: {what}; refusing to load it"
        f"{safe_load.offer(str(path), previous_retained(path))}; training resumes from the newest "
        "checkpoint that verifies (`stoker checkpoint verify` lists what is damaged)"
    )


def _read_verified(path: Location, fname: str, expected: Mapping[str, str] | None, by: str = "the index") -> bytes:
    file = path / fname
    try:
        data = storage.read_bytes(file)
    except OSError as e:
        if expected is not None:
            raise damaged(path, f"{fname} cannot be read ({e})") from e
        raise CheckpointError(f"cannot read {file}: {e}") from e
    if expected is not None:
        want = expected.get(fname)
        got = hashlib.sha256(data).hexdigest()
        if want is None:
            raise damaged(path, f"{fname} is not one of its files by {by}")
        if got != want:
            raise damaged(path, f"{fname} has sha256 {got[:12]}… but {by} says {want[:12]}…")
    return data


def _read_decoded(path: Location, fname: str, expected: Mapping[str, str] | None, by: str = "the index") -> Any:
    """Read, verify and safely decode one file of a checkpoint."""
    return safe_load.decode(_read_verified(path, fname, expected, by), fname, str(path), previous_retained(path))


def load_checkpoint(path: str | os.PathLike[str] | Location) -> LoadedCheckpoint:
    """Read a checkpoint directory, verifying each file against its index entry (or, when no
    index beside it names it, its own manifest)."""
    path = storage.location(path)
    expected, by = expected_files(path)
    names = [f for f in storage.files_under(path) if f not in OWN_FILES]
    if expected is None:
        log.warning("checkpoint %s is not listed in an index and has no manifest: its files cannot be verified", path)
    else:
        missing = sorted(f for f in expected if f not in names)
        if missing:
            raise damaged(path, f"{', '.join(missing)} missing (listed by {by})")
    dcp_files = [f for f in names if f.startswith("dcp/")]
    model_state = None
    if dcp_files:
        for fname in dcp_files:
            if fname.endswith("/.metadata"):  # DCP itself unpickles it unrestricted: vet it first
                _read_decoded(path, fname, expected, by)
            else:
                _read_verified(path, fname, expected, by)
    else:
        model_state = _read_decoded(path, MODEL_FILE, expected, by)
    train_state: dict[str, Any] = {}
    if TRAIN_STATE_FILE in names:
        train_state = _read_decoded(path, TRAIN_STATE_FILE, expected, by)
        if not isinstance(train_state, dict):
            what = f"holds a {type(train_state).__name__}, not a dict"
            raise safe_load.refused(str(path), TRAIN_STATE_FILE, what, previous_retained(path))
    input_states: dict[int, Any] = {}
    for fname in names:
        if fname.startswith("input-") and "/" not in fname:
            input_states[int(fname.split(".", 1)[0].split("-", 1)[1])] = _read_decoded(path, fname, expected, by)
    ema_state = _read_decoded(path, EMA_FILE, expected, by) if EMA_FILE in names else None
    step = int(train_state.get("global_step", step_of(path)))
    dcp_dir = path / "dcp" if model_state is None else None
    return LoadedCheckpoint(path, step, model_state, train_state, input_states, dcp_dir, ema_state)


def check_state_fits(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise one clear error if ``state`` does not have exactly the model's names and shapes."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [
        f"{k} is {list(state[k].shape)} in the checkpoint but {list(own[k].shape)} in the model"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    problems = (
        mismatched
        + [f"missing in the checkpoint: {k}" for k in missing]
        + [f"not in the model: {k}" for k in unexpected]
    )
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointError(
            f"{source} does not fit the model: {'; '.join(problems[:3])}{more}. The model built from "
            "params differs from the one that wrote it: use a new model_dir, or warm_start_from "
            "with vars_to_warm_start to take only the matching weights"
        )


__all__ = [
    "CKPT_RE",
    "EMA_FILE",
    "INDEX_FORMAT",
    "INDEX_LOCK_NAME",
    "INDEX_NAME",
    "MODEL_FILE",
    "TRAIN_STATE_FILE",
    "LoadedCheckpoint",
    "check_state_fits",
    "checkpoint_blobs",
    "damaged",
    "expected_files",
    "index_record",
    "load_checkpoint",
    "model_state_to_bytes",
    "previous_retained",
    "serialize_input_state",
    "step_of",
]
