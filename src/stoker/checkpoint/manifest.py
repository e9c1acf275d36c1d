"""What a checkpoint says about itself: ``manifest.json`` and ``evaluation.json`` in its folder.

The index (``checkpoint.json``) names a model_dir's checkpoints; these two files let each
checkpoint be verified, and the index be rebuilt, without it (``stoker.checkpoint.recovery``):

* ``manifest.json`` is written once, in the checkpoint's commit, with its files: its name, step
  and write time (the index record's key), every file's sha256 and size, and the checkpoint the
  index named as the latest when it was committed (``parent``: how a crash's uncommitted
  checkpoint is told from one a stale index forgot), and ``stop`` when a stop wrote it.
* ``evaluation.json`` holds what the index records about the checkpoint after its commit: the
  evaluation's results, whether a watching evaluator passed it over (``superseded``), and, when
  the index's ``best`` names it, the ``keep_best`` metric, mode and value. It is rewritten
  (atomically) in the same index update that changes any of them, just before the index itself.

Pure data, like the index type: no torch, no storage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError
from .index import MODES, Best, CheckpointIndex, CheckpointRecord

MANIFEST_NAME = "manifest.json"
EVALUATION_NAME = "evaluation.json"
MANIFEST_FORMAT = "stoker-checkpoint-manifest/1"
EVALUATION_FORMAT = "stoker-checkpoint-evaluation/1"
OWN_FILES = (MANIFEST_NAME, EVALUATION_NAME)
"""A checkpoint folder's files about itself: never among its ``files``."""

Key = tuple[str, float]
"""Which write of a checkpoint: ``(name, time)``, as :attr:`CheckpointRecord.key`."""


def _fail(source: str, what: str) -> CheckpointError:
    return CheckpointError(f"{source} is malformed: {what}")


def _object(data: bytes | str, source: str, fmt: str) -> dict[str, Any]:
    """``data`` decoded as a JSON object of format ``fmt``."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{source} is unreadable ({e})") from e
    if not isinstance(obj, dict):
        raise _fail(source, "it must be a JSON object")
    if obj.get("format") != fmt:
        raise _fail(source, f"format {obj.get('format')!r}; this stoker reads {fmt!r}")
    return obj


def _key_json(key: Key | None) -> dict[str, Any] | None:
    return None if key is None else {"name": key[0], "time": key[1]}


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's ``manifest.json``: what it is and how to verify each of its files.

    Attributes:
        name: ``ckpt-<step>``.
        step: the global step it was written at.
        time: Unix time of the write (the index record's ``time``).
        files: ``{file name: sha256 hex digest}`` of every file (as the index record).
        sizes: ``{file name: size in bytes}`` of every file.
        parent: the key of the index's latest checkpoint when this one was committed
            (``None``: the index named none).
        stop: written because the run was stopped (the index record's ``stop``).
    """

    name: str
    step: int
    time: float
    files: Mapping[str, str]
    sizes: Mapping[str, int]
    parent: Key | None = None
    stop: bool = False

    @property
    def key(self) -> Key:
        return self.name, self.time

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    @classmethod
    def of(cls, record: CheckpointRecord, sizes: Mapping[str, int], index: CheckpointIndex) -> Manifest:
        """The manifest of ``record``'s checkpoint, committed on top of ``index``."""
        latest = index.record(index.latest) if index.latest else None
        return cls(
            name=record.name,
            step=record.step,
            time=record.time,
            files=dict(record.files),
            sizes={f: int(sizes[f]) for f in record.files},
            parent=None if latest is None else latest.key,
            stop=record.stop,
        )

    def record(self, directory: str | None, evaluation: Evaluation | None = None) -> CheckpointRecord:
        """The index record this manifest (and its evaluation, if it is of this write) stand for."""
        ev = evaluation if evaluation is not None and evaluation.key == self.key else None
        return CheckpointRecord(
            name=self.name,
            step=self.step,
            time=self.time,
            bytes=self.total_bytes,
            files=dict(self.files),
            metrics=dict(ev.metrics) if ev else {},
            dir=directory if directory != self.name else None,
            superseded=bool(ev and ev.superseded),
            stop=self.stop,
        )

    def differs_from(self, record: CheckpointRecord) -> str | None:
        """Why ``record`` (an index entry naming this folder) is not this checkpoint, or ``None``."""
        if record.key != self.key or record.step != self.step:
            return f"the index's {record.name} was written at {record.time!r}, this folder's at {self.time!r}"
        if dict(record.files) != dict(self.files):
            return f"the index's {record.name} lists other files or sha256s than the folder's manifest"
        return None

    def encode(self) -> bytes:
        files = {f: {"bytes": self.sizes[f], "sha256": self.files[f]} for f in sorted(self.files)}
        obj = {
            "files": files,
            "format": MANIFEST_FORMAT,
            "name": self.name,
            "parent": _key_json(self.parent),
            "step": self.step,
            "time": self.time,
        }
        if self.stop:  # only then: a manifest of any other checkpoint reads and writes as before
            obj["stop"] = True
        return json.dumps(obj, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes | str, source: str = MANIFEST_NAME) -> Manifest:
        """A manifest from its bytes; ``CheckpointError`` naming ``source`` when it cannot be read."""
        obj = _object(data, source, MANIFEST_FORMAT)
        files = obj.get("files")
        if not isinstance(files, dict):
            raise _fail(source, "'files' must be an object")
        sha, sizes = {}, {}
        for f, entry in files.items():
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("sha256"), str)
                or not _is_int(entry.get("bytes"))
            ):
                raise _fail(source, f"files[{f!r}] must be {{'bytes': int, 'sha256': str}}")
            sha[f], sizes[f] = entry["sha256"], int(entry["bytes"])
        parent = obj.get("parent")
        if parent is not None and not (
            isinstance(parent, dict) and isinstance(parent.get("name"), str) and _is_number(parent.get("time"))
        ):
            raise _fail(source, "'parent' must be null or {'name': str, 'time': number}")
        if not _is_int(obj.get("step")) or not _is_number(obj.get("time")) or not isinstance(obj.get("name"), str):
            raise _fail(source, "'name', 'step' and 'time' must be a string, an integer and a number")
        return cls(
            name=obj["name"],
            step=obj["step"],
            time=float(obj["time"]),
            files=sha,
            sizes=sizes,
            parent=None if parent is None else (parent["name"], float(parent["time"])),
            stop=obj.get("stop") is True,
        )


@dataclass(frozen=True)
class Evaluation:
    """A checkpoint's ``evaluation.json``: what the index records about it after its commit.

    Attributes:
        name, time: the checkpoint write it belongs to (its manifest's key).
        step: its step.
        metrics: the latest recorded evaluation's results.
        superseded: a watching evaluator passed it over.
        best: ``(metric, mode, value)`` while the index's ``best`` names it, else ``None``.
        updated: Unix time of this file's write (the newest claim to be the best wins).
    """

    name: str
    time: float
    step: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    superseded: bool = False
    best: tuple[str, str, float] | None = None
    updated: float = 0.0

    @property
    def key(self) -> Key:
        return self.name, self.time

    @classmethod
    def of(cls, record: CheckpointRecord, index: CheckpointIndex, now: float) -> Evaluation | None:
        """What ``index`` records about ``record`` beyond its commit (``None``: nothing yet)."""
        best = index.best
        claim = (best.metric, best.mode, best.value) if best is not None and best.name == record.name else None
        if not record.metrics and not record.superseded and claim is None:
            return None
        return cls(record.name, record.time, record.step, dict(record.metrics), record.superseded, claim, now)

    def same_content(self, other: Evaluation | None) -> bool:
        """Whether ``other`` records the same (its ``updated`` time aside)."""
        return other is not None and (self.key, dict(self.metrics), self.superseded, self.best) == (
            other.key,
            dict(other.metrics),
            other.superseded,
            other.best,
        )

    def best_record(self) -> Best | None:
        if self.best is None:
            return None
        metric, mode, value = self.best
        return Best(name=self.name, step=self.step, metric=metric, mode=mode, value=value)

    def encode(self) -> bytes:
        best = None if self.best is None else dict(zip(("metric", "mode", "value"), self.best, strict=True))
        obj = {
            "best": best,
            "format": EVALUATION_FORMAT,
            "metrics": dict(self.metrics),
            "name": self.name,
            "step": self.step,
            "superseded": self.superseded,
            "time": self.time,
            "updated": self.updated,
        }
        return json.dumps(obj, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes | str, source: str = EVALUATION_NAME) -> Evaluation:
        obj = _object(data, source, EVALUATION_FORMAT)
        metrics = obj.get("metrics")
        if not isinstance(metrics, dict) or not all(_is_number(v) for v in metrics.values()):
            raise _fail(source, "'metrics' must be an object of numbers")
        best = obj.get("best")
        if best is not None and not (
            isinstance(best, dict)
            and isinstance(best.get("metric"), str)
            and best.get("mode") in MODES
            and _is_number(best.get("value"))
        ):
            raise _fail(source, "'best' must be null or {'metric': str, 'mode': 'min'|'max', 'value': number}")
        if not (isinstance(obj.get("name"), str) and _is_int(obj.get("step")) and _is_number(obj.get("time"))):
            raise _fail(source, "'name', 'step' and 'time' must be a string, an integer and a number")
        return cls(
            name=obj["name"],
            time=float(obj["time"]),
            step=int(obj["step"]),
            metrics={k: float(v) for k, v in metrics.items()},
            superseded=obj.get("superseded") is True,
            best=None if best is None else (best["metric"], best["mode"], float(best["value"])),
            updated=float(obj.get("updated") or 0.0),
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


__all__ = [
    "EVALUATION_FORMAT",
    "EVALUATION_NAME",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "OWN_FILES",
    "Evaluation",
    "Key",
    "Manifest",
]
