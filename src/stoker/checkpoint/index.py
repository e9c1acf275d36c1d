"""``checkpoint.json``, the index of a model_dir, as a type: its schema, parse, encode and version.

The index is a user-facing format (docs/checkpoints.md documents every field). This module is
the only place that reads or writes its keys: everything else holds a :class:`CheckpointIndex`
and its :class:`CheckpointRecord`\\ s, :class:`Best` and :class:`Coverage`.

* :meth:`CheckpointIndex.parse` reads JSON bytes (or an already decoded dict) and checks every
  field; a malformed index raises ``CheckpointError`` naming the field (``checkpoints[2].step``),
  an index a newer stoker wrote (``format`` ``stoker-checkpoint-index/<N>``, N above
  :data:`INDEX_VERSION`) is refused with a message naming both versions.
* :meth:`CheckpointIndex.encode` writes what stoker has always written (sorted keys, an indent
  of 1; ``dir``, ``superseded``, ``stop`` and ``coverage`` only where they apply), so for any index
  :meth:`~CheckpointIndex.parse` accepts, ``encode(parse(data)) == data``: a model_dir written
  before the type existed reads and rewrites the same bytes.
* The changes the manager and a watching evaluator make (commit a record, attach an
  evaluation, mark superseded, count coverage, drop what retention does not keep) are methods
  that return a new index: the type is frozen, and an update is read-change-write of a value.

No torch, no storage here: the type is pure data, so reading an index never loads a model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, TypeVar

from ..errors import CheckpointError

INDEX_NAME = "checkpoint.json"
INDEX_VERSION = 1
INDEX_FORMAT_PREFIX = "stoker-checkpoint-index/"
INDEX_FORMAT = f"{INDEX_FORMAT_PREFIX}{INDEX_VERSION}"
COVERAGE_KINDS = ("evaluated", "superseded", "removed", "discarded")
MODES = ("min", "max")

T = TypeVar("T")

KeepBest = tuple[str, str] | tuple[str, str, int]
"""``RunConfig.keep_best``: ``(metric, mode)``, or ``(metric, mode, k)`` to keep the ``k`` best."""


# ---------------------------------------------------------------------------- field checks
class _Fields:
    """Reads one JSON object's fields, naming ``where.field`` in every error."""

    def __init__(self, source: str, where: str, obj: Any, allowed: Iterable[str]) -> None:
        self.source, self.where = source, where
        if not isinstance(obj, dict):
            self.fail(where or "the index", f"must be a JSON object, got {_kind(obj)}")
        unknown = sorted(set(obj) - set(allowed))
        if unknown:
            self.fail(self.name(unknown[0]), f"is not a field of stoker's checkpoint index (fields: {sorted(allowed)})")
        self.obj: dict[str, Any] = obj

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, name: str, what: str) -> NoReturn:
        raise CheckpointError(f"{self.source} is malformed: {name!r} {what}; {repair_hint(self.source)}")

    def get(self, key: str, check: Callable[[Any], bool], want: str, *, required: bool = True) -> Any:
        if key not in self.obj:
            if required:
                self.fail(self.name(key), "is missing")
            return None
        value = self.obj[key]
        if not check(value):
            self.fail(self.name(key), f"must be {want}, got {_kind(value)} {_short(value)}")
        return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_name(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _map_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())


def _list_of_ints(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


# ---------------------------------------------------------------------------- the schema
@dataclass(frozen=True)
class CheckpointRecord:
    """One retained checkpoint (an entry of ``checkpoints``).

    Attributes:
        name: ``ckpt-<step>``.
        step: the global step it was written at.
        time: Unix time of the write.
        bytes: total size of its files.
        files: ``{file name: sha256 hex digest}`` of every file.
        metrics: the latest evaluation's results (``{}`` until evaluated).
        dir: on an object store, its unique prefix ``ckpt-<step>.<hex>``; ``None`` locally.
        superseded: a watching evaluator passed it over for a newer one.
    """

    name: str
    step: int
    time: float
    bytes: int
    files: Mapping[str, str]
    metrics: Mapping[str, float] = field(default_factory=dict)
    dir: str | None = None
    superseded: bool = False
    stop: bool = False

    @property
    def directory(self) -> str:
        """The directory (object-store prefix) holding its files: ``dir``, else ``name``."""
        return self.dir if self.dir is not None else self.name

    @property
    def key(self) -> tuple[str, float]:
        """Which write this is: a step saved again (after a resume) has a new ``time``."""
        return self.name, self.time

    @property
    def evaluated(self) -> bool:
        return bool(self.metrics)

    @classmethod
    def parse(cls, obj: Any, source: str = INDEX_NAME, where: str = "record") -> CheckpointRecord:
        f = _Fields(
            source, where, obj, ("name", "step", "time", "bytes", "files", "metrics", "dir", "superseded", "stop")
        )
        return cls(
            name=f.get("name", _is_str, "a string"),
            step=f.get("step", _is_int, "an integer"),
            time=f.get("time", _is_number, "a number"),
            bytes=f.get("bytes", _is_int, "an integer"),
            files=f.get("files", _map_of(_is_str), "an object of sha256 strings"),
            metrics=f.get("metrics", _map_of(_is_number), "an object of numbers"),
            dir=f.get("dir", _is_str, "a string", required=False),
            superseded=bool(f.get("superseded", lambda v: isinstance(v, bool), "a boolean", required=False)),
            stop=bool(f.get("stop", lambda v: isinstance(v, bool), "a boolean", required=False)),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "step": self.step,
            "time": self.time,
            "bytes": self.bytes,
            "files": dict(self.files),
            "metrics": dict(self.metrics),
        }
        if self.dir is not None:
            out["dir"] = self.dir
        if self.superseded:
            out["superseded"] = True
        if self.stop:
            out["stop"] = True
        return out


@dataclass(frozen=True)
class Best:
    """The retained checkpoint with the best value of ``RunConfig.keep_best = (metric, mode)``."""

    name: str
    step: int
    metric: str
    mode: str
    value: float

    @classmethod
    def parse(cls, obj: Any, source: str = INDEX_NAME) -> Best:
        f = _Fields(source, "best", obj, ("name", "step", "metric", "mode", "value"))
        return cls(
            name=f.get("name", _is_str, "a string"),
            step=f.get("step", _is_int, "an integer"),
            metric=f.get("metric", _is_str, "a string"),
            mode=f.get("mode", lambda v: v in MODES, f"one of {list(MODES)}"),
            value=f.get("value", _is_number, "a number"),
        )

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "step": self.step, "metric": self.metric, "mode": self.mode, "value": self.value}

    def beaten_by(self, value: float, mode: str) -> bool:
        """Whether ``value`` is better than this best under ``mode`` (the run's ``keep_best``)."""
        return value < self.value if mode == "min" else value > self.value


@dataclass(frozen=True)
class Coverage:
    """What watching evaluators did with each checkpoint, as lists of steps in the order counted."""

    evaluated: tuple[int, ...] = ()
    superseded: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()  # dropped by retention before an evaluation of it was recorded
    discarded: tuple[int, ...] = ()  # evaluated, but gone before the result was recorded

    @classmethod
    def parse(cls, obj: Any, source: str = INDEX_NAME) -> Coverage:
        f = _Fields(source, "coverage", obj, COVERAGE_KINDS)
        return cls(**{k: tuple(f.get(k, _list_of_ints, "a list of integers")) for k in COVERAGE_KINDS})

    def to_json(self) -> dict[str, list[int]]:
        return {k: list(getattr(self, k)) for k in COVERAGE_KINDS}

    def counting(self, kind: str, step: int) -> Coverage:
        """``step`` counted under ``kind`` (once)."""
        steps: tuple[int, ...] = getattr(self, kind)
        return self if step in steps else replace(self, **{kind: (*steps, step)})

    def line(self) -> str:
        """``N evaluated, N superseded, N removed before reading, N discarded``."""
        return (
            f"{len(self.evaluated)} evaluated, {len(self.superseded)} superseded, "
            f"{len(self.removed)} removed before reading, {len(self.discarded)} discarded"
        )


@dataclass(frozen=True)
class CheckpointIndex:
    """A model_dir's ``checkpoint.json``: which checkpoints exist, the latest, the best.

    A checkpoint exists once the index names it (docs/checkpoints.md: the commit protocol).
    ``checkpoints`` is sorted by step. ``coverage`` is ``None`` until a watching evaluator
    starts counting. Build one with :meth:`parse`; write it with :meth:`encode`.
    """

    latest: str | None = None
    best: Best | None = None
    checkpoints: tuple[CheckpointRecord, ...] = ()
    coverage: Coverage | None = None
    version: int = INDEX_VERSION

    # ------------------------------------------------------------ parse / encode
    @classmethod
    def parse(cls, data: bytes | str | Mapping[str, Any] | None, source: str = INDEX_NAME) -> CheckpointIndex:
        """The index in ``data`` (JSON bytes or a decoded dict; ``None``: no index yet, empty).

        ``source`` (the index's path) is named in every error. Raises ``CheckpointError``
        naming the field for a malformed index, and naming both versions for a newer one.
        """
        if data is None:
            return cls()
        if isinstance(data, (bytes, str)):
            try:
                obj = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{source} is unreadable ({e}); {repair_hint(source)}") from e
        else:
            obj = dict(data)
        if not isinstance(obj, dict):
            raise CheckpointError(f"{source} is malformed: it must be a JSON object, got {_kind(obj)}")
        _check_version(obj, source)
        f = _Fields(source, "", obj, ("format", "latest", "best", "checkpoints", "coverage"))
        latest = f.get("latest", _is_name, "a checkpoint name or null")
        best = f.get("best", lambda v: v is None or isinstance(v, dict), "an object or null")
        records = f.get("checkpoints", lambda v: isinstance(v, list), "a list")
        coverage = f.get("coverage", lambda v: isinstance(v, dict), "an object", required=False)
        return cls(
            latest=latest,
            best=None if best is None else Best.parse(best, source),
            checkpoints=tuple(CheckpointRecord.parse(r, source, f"checkpoints[{i}]") for i, r in enumerate(records)),
            coverage=None if coverage is None else Coverage.parse(coverage, source),
        )

    def to_json(self) -> dict[str, Any]:
        """The index as the JSON object ``checkpoint.json`` holds."""
        out: dict[str, Any] = {
            "format": f"{INDEX_FORMAT_PREFIX}{self.version}",
            "latest": self.latest,
            "best": None if self.best is None else self.best.to_json(),
            "checkpoints": [r.to_json() for r in self.checkpoints],
        }
        if self.coverage is not None:
            out["coverage"] = self.coverage.to_json()
        return out

    def encode(self) -> bytes:
        """The bytes of ``checkpoint.json`` (sorted keys, an indent of 1, as stoker always wrote)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()

    # ------------------------------------------------------------ reading
    def record(self, name: str) -> CheckpointRecord | None:
        """The record named ``name`` (``ckpt-<step>``), if retained."""
        return next((r for r in self.checkpoints if r.name == name), None)

    def record_in(self, directory: str) -> CheckpointRecord | None:
        """The record whose files are in ``directory`` (a name locally, a prefix on a store)."""
        return next((r for r in self.checkpoints if r.directory == directory), None)

    def names(self, key: tuple[str, float]) -> bool:
        """Whether the index still names this very write (:attr:`CheckpointRecord.key`)."""
        return any(r.key == key for r in self.checkpoints)

    def coverage_line(self) -> str:
        return coverage_line(self.coverage)

    def top(self, metric: str, mode: str, k: int) -> list[CheckpointRecord]:
        """The ``k`` retained checkpoints with the best evaluated value of ``metric`` under
        ``mode`` (``RunConfig.keep_best``), best first: ``best`` first of its value, then by
        value, a tie to the earlier step. Records without a (non-NaN) value of it take no part."""
        scored = [r for r in self.checkpoints if metric in r.metrics and not math.isnan(r.metrics[metric])]
        best = self.best.name if self.best is not None else None
        sign = 1.0 if mode == "min" else -1.0
        scored.sort(key=lambda r: (sign * r.metrics[metric], r.name != best, r.step))
        return scored[:k]

    # ------------------------------------------------------------ changes (each returns a new index)
    def adding(self, record: CheckpointRecord) -> tuple[CheckpointIndex, list[str]]:
        """The index that commits ``record`` as the latest, and the directories it replaced."""
        replaced = [r.directory for r in self.checkpoints if r.name == record.name]
        records = sorted([r for r in self.checkpoints if r.name != record.name] + [record], key=lambda r: r.step)
        best = self.best
        if best is not None and best.name == record.name:
            best = None  # the weights under this name changed; its old metric no longer applies
        index = replace(self, latest=record.name, best=best, checkpoints=tuple(records))
        return index, [d for d in replaced if d != record.directory]

    def with_evaluation(
        self, step: int, metrics: Mapping[str, float], keep_best: KeepBest | None
    ) -> tuple[CheckpointIndex, bool]:
        """``metrics`` put on ``ckpt-<step>``'s record; and whether it became the best.

        Unchanged (and not the best) when the index no longer names the checkpoint.
        """
        name = f"ckpt-{step}"
        rec = self.record(name)
        if rec is None:
            return self, False
        index = self._replacing(rec, replace(rec, metrics=dict(metrics)))
        if keep_best is None:
            return index, False
        metric, mode = keep_best[0], keep_best[1]
        if metric not in metrics:
            raise CheckpointError(
                f"RunConfig.keep_best names metric {metric!r}, but evaluation returned only {sorted(metrics)}"
            )
        value = metrics[metric]
        if math.isnan(value):  # NaN never becomes the best
            return index, False
        if self.best is None or self.best.beaten_by(value, mode):
            return replace(index, best=Best(name=name, step=step, metric=metric, mode=mode, value=value)), True
        return index, False

    def superseding(self, keys: Iterable[tuple[str, float]]) -> tuple[CheckpointIndex, list[int]]:
        """Mark the records of ``keys`` not yet evaluated or superseded as superseded, counted in
        ``coverage`` (started if need be); also the steps marked."""
        keys = set(keys)
        index, marked = self.counting_coverage(), []
        for r in self.checkpoints:
            if r.key in keys and not r.evaluated and not r.superseded:
                index = index._replacing(r, replace(r, superseded=True)).counting("superseded", r.step)
                marked.append(r.step)
        return index, marked

    def counting_coverage(self) -> CheckpointIndex:
        """The index with ``coverage`` started (a watching evaluator counts from now on)."""
        return self if self.coverage is not None else replace(self, coverage=Coverage())

    def counting(self, kind: str, step: int) -> CheckpointIndex:
        """``step`` counted under ``kind`` in ``coverage`` (nothing while coverage is not started)."""
        if kind not in COVERAGE_KINDS:
            raise CheckpointError(f"coverage kind must be one of {list(COVERAGE_KINDS)}; got {kind!r}")
        if self.coverage is None:
            return self
        return replace(self, coverage=self.coverage.counting(kind, step))

    def keeping(self, keep: set[str]) -> tuple[CheckpointIndex, list[CheckpointRecord]]:
        """The index without the records whose name is not in ``keep``, and those records.

        A dropped checkpoint that was neither evaluated nor superseded is counted as removed
        before reading (when ``coverage`` is started).
        """
        dropped = [r for r in self.checkpoints if r.name not in keep]
        index = replace(self, checkpoints=tuple(r for r in self.checkpoints if r.name in keep))
        for r in dropped:
            if not r.evaluated and not r.superseded:
                index = index.counting("removed", r.step)
        return index, dropped

    def without(self, name: str) -> CheckpointIndex:
        """The index with the record ``name`` dropped (nothing else changes)."""
        return replace(self, checkpoints=tuple(r for r in self.checkpoints if r.name != name))

    def _replacing(self, old: CheckpointRecord, new: CheckpointRecord) -> CheckpointIndex:
        return replace(self, checkpoints=tuple(new if r is old else r for r in self.checkpoints))


def _check_version(obj: dict[str, Any], source: str) -> None:
    """Refuse an index of another format, naming both versions for a newer stoker's."""
    fmt = obj.get("format")
    version = fmt[len(INDEX_FORMAT_PREFIX) :] if isinstance(fmt, str) and fmt.startswith(INDEX_FORMAT_PREFIX) else ""
    if version.isdigit() and int(version) > INDEX_VERSION:
        raise CheckpointError(
            f"{source} is index version {int(version)} ({fmt!r}), written by a newer stoker; this stoker "
            f"reads version {INDEX_VERSION} ({INDEX_FORMAT!r}): upgrade stoker to read this model_dir"
        )
    if fmt != INDEX_FORMAT:
        got = "no 'format' field" if fmt is None else f"format {fmt!r}"
        raise CheckpointError(f"{source} has {got}; this stoker reads {INDEX_FORMAT!r}; {repair_hint(source)}")


def written_by_newer(data: bytes | str) -> bool:
    """Whether ``data`` is an index of a newer version than this stoker reads: refused with
    "upgrade stoker", never taken for damage and rebuilt."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    fmt = obj.get("format") if isinstance(obj, dict) else None
    version = fmt[len(INDEX_FORMAT_PREFIX) :] if isinstance(fmt, str) and fmt.startswith(INDEX_FORMAT_PREFIX) else ""
    return version.isdigit() and int(version) > INDEX_VERSION


def repair_hint(source: str) -> str:
    """What to do about an index (``source``: its path) that cannot be used: the command that
    rebuilds it from the checkpoints' own manifests and deletes nothing."""
    folder = source.rsplit("/", 1)[0] if "/" in source else "."
    return f"run `stoker checkpoint repair {folder}` to rebuild it from the checkpoints' manifests"


def coverage_line(coverage: Coverage | None) -> str:
    """``N evaluated, N superseded, N removed before reading, N discarded`` (zeros for ``None``)."""
    return (coverage or Coverage()).line()


IndexChange = Callable[[CheckpointIndex], tuple[CheckpointIndex, T]]
"""An index update: the new index, and what the update returns to its caller."""


__all__ = [
    "COVERAGE_KINDS",
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INDEX_VERSION",
    "Best",
    "CheckpointIndex",
    "CheckpointRecord",
    "Coverage",
    "IndexChange",
    "KeepBest",
    "coverage_line",
    "repair_hint",
    "written_by_newer",
]
