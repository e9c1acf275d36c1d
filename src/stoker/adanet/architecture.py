"""``architecture-<t>.json``: the ensemble chosen at iteration ``t``, in the original's format.

One JSON object, keys sorted (``json.dumps(..., sort_keys=True)``), e.g.::

    {"ensemble_candidate_name": "linear_grow", "ensembler_name": "complexity_regularized",
     "global_step": 100, "iteration_number": 0, "replay_indices": [0],
     "subnetworks": [{"builder_name": "linear", "iteration_number": 0}]}

``subnetworks`` lists the ensemble's members oldest first; ``replay_indices`` the candidate
index chosen at every iteration up to ``t``; ``global_step`` the step iteration ``t`` ended at.
The file is written atomically and is the commit point of the iteration: once it exists,
iteration ``t`` is done. In a local directory it is renamed into place; on an object store
(``model_dir`` an fsspec URL) it is one whole-object PUT, which readers see entirely or not at all.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .. import storage
from ..errors import CheckpointMismatchError, StorageError
from ..storage.stores import Location

__all__ = ["Architecture", "architecture_path", "read_architecture", "write_architecture"]


@dataclass(kw_only=True)
class Architecture:
    """The chosen ensemble of one iteration."""

    ensemble_candidate_name: str
    ensembler_name: str
    iteration_number: int
    global_step: int
    subnetworks: list[tuple[int, str]] = field(default_factory=list)
    replay_indices: list[int] = field(default_factory=list)

    def serialize(self) -> str:
        return json.dumps(
            {
                "ensemble_candidate_name": self.ensemble_candidate_name,
                "ensembler_name": self.ensembler_name,
                "global_step": int(self.global_step),
                "iteration_number": int(self.iteration_number),
                "replay_indices": [int(i) for i in self.replay_indices],
                "subnetworks": [{"builder_name": str(n), "iteration_number": int(t)} for t, n in self.subnetworks],
            },
            sort_keys=True,
        )

    @classmethod
    def deserialize(cls, text: str) -> Architecture:
        d = json.loads(text)
        return cls(
            ensemble_candidate_name=str(d["ensemble_candidate_name"]),
            ensembler_name=str(d["ensembler_name"]),
            iteration_number=int(d["iteration_number"]),
            global_step=int(d["global_step"]),
            subnetworks=[(int(s["iteration_number"]), str(s["builder_name"])) for s in d["subnetworks"]],
            replay_indices=[int(i) for i in d.get("replay_indices", [])],
        )

    def subnetworks_of(self, iteration_number: int) -> list[str]:
        """Builder names of the members trained at ``iteration_number``."""
        return [n for t, n in self.subnetworks if t == iteration_number]


def architecture_path(model_dir: str | os.PathLike[str] | Location, iteration_number: int) -> Location:
    return storage.location(model_dir) / f"architecture-{iteration_number}.json"


def read_architecture(model_dir: str | os.PathLike[str] | Location, iteration_number: int) -> Architecture:
    path = architecture_path(model_dir, iteration_number)
    try:
        return Architecture.deserialize(read_text(path))
    except (OSError, ValueError, KeyError, TypeError, StorageError) as e:
        raise CheckpointMismatchError(
            f"{path} is missing or unreadable ({e}); it records iteration {iteration_number}'s ensemble"
        ) from e


def read_text(path: Location) -> str:
    """``path``'s text, local or on an object store."""
    return path.read_text() if isinstance(path, Path) else storage.read_bytes(path).decode()


def atomic_write_bytes(path: Location, data: bytes) -> None:
    """Write ``data`` so that a crash leaves the old file or the new one, never half of one.

    Locally: a temporary name, fsync, rename into place, fsync the directory. On an object
    store one PUT is already all-or-nothing (no rename exists there), so it is written directly.
    """
    if not isinstance(path, Path):
        storage.write_all([(path, data)])
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    storage.fsync_dir(path.parent)


def atomic_write_text(path: Location, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` (UTF-8)."""
    atomic_write_bytes(path, text.encode())


def write_architecture(model_dir: str | os.PathLike[str] | Location, architecture: Architecture) -> Location:
    path = architecture_path(model_dir, architecture.iteration_number)
    atomic_write_text(path, architecture.serialize())
    return path
