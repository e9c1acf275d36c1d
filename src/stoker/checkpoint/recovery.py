"""The index is never a single point of failure: telling whether ``checkpoint.json`` still
describes a model_dir's checkpoints, and rebuilding it from their manifests when it does not.

Every checkpoint carries ``manifest.json`` and, once the index records more about it,
``evaluation.json`` (``stoker.checkpoint.manifest``). The first time a
:class:`~stoker.checkpoint.CheckpointManager` reads the index, :func:`checked_index` compares
it with the checkpoint folders (one listing and, when nothing is wrong, one small read):

* **missing** (no ``checkpoint.json``, checkpoint folders present), **unreadable** (truncated,
  not JSON, not an index), **foreign** (its newest present checkpoint is not the folder's own:
  another write, another run's index) or **stale** (a checkpoint newer than every one it names
  and written after them, other than the one checkpoint a crash in its own commit leaves:
  see :func:`assess`): the index is rebuilt from the manifests, under the index lock, the old
  bytes kept beside it as ``checkpoint.json.<state>-<UTC time>``, and one warning says so. A
  process that does not write the index (a replica other than the chief) uses the same rebuilt
  index in memory.
* Rebuilding is refused, with one line naming ``stoker checkpoint repair``, when a folder holds
  a whole checkpoint without a manifest (written before manifests existed) that no trusted index
  names: it cannot be placed without reading and checking its files, which ``repair`` does.

The rebuilt index holds one record per checkpoint name (on an object store, the newest write of
it): metrics and ``superseded`` from ``evaluation.json``; ``best`` from the newest
``evaluation.json`` that claims it; ``latest`` the newest checkpoint whose files are all there
with their sizes (a damaged one stays named, so nothing deletes it, but is not resumed from).
Records of a stale index for folders without a manifest, and its ``coverage``, are kept; a
foreign or unreadable index contributes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import storage
from ..errors import CheckpointError, StorageError
from ..storage.stores import Location, RetryPolicy
from .commit import CommitProtocol
from .files import CKPT_RE, MODEL_FILE, TRAIN_STATE_FILE
from .index import INDEX_NAME, Best, CheckpointIndex, CheckpointRecord, written_by_newer
from .manifest import EVALUATION_NAME, MANIFEST_NAME, Evaluation, Manifest

log = logging.getLogger("stoker")

OK, MISSING, UNREADABLE, STALE, FOREIGN = "ok", "missing", "unreadable", "stale", "foreign"


@dataclass(frozen=True)
class Found:
    """One checkpoint folder (object-store prefix) of a model_dir, as read from storage.

    Attributes:
        directory: its name, ``ckpt-<step>`` (``ckpt-<step>.<hex>`` on an object store).
        step: the step in its name.
        manifest: its ``manifest.json`` (``None``: none, or unreadable: see ``problem``).
        evaluation: its ``evaluation.json``, if any and of this write.
        problem: why its manifest or evaluation could not be read.
        legacy: no manifest, but the files of a whole checkpoint: one written before manifests
            (or, on an object store, a write cut off between its last file and its manifest).
        incomplete: files its manifest lists that are missing or of another size (only when
            the folder was listed for them).
    """

    directory: str
    step: int
    manifest: Manifest | None = None
    evaluation: Evaluation | None = None
    problem: str | None = None
    legacy: bool = False
    incomplete: tuple[str, ...] = ()

    @property
    def unplaceable(self) -> bool:
        """A checkpoint a rebuild from manifests cannot place: legacy, or its manifest unreadable."""
        return self.legacy or (self.manifest is None and self.problem is not None)


def _read_optional(path: Location, retry: RetryPolicy) -> bytes | None:
    """``path``'s bytes, or ``None`` when it does not exist."""
    try:
        return storage.read_bytes(path, retry)
    except FileNotFoundError:
        return None
    except StorageError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None
        raise


def read_folder(model_dir: Location, directory: str, retry: RetryPolicy, *, sizes: bool = False) -> Found:
    """Read one checkpoint folder's own files; with ``sizes``, also list its files' sizes."""
    m = CKPT_RE.match(directory)
    step = int(m.group(1)) if m else -1
    folder = model_dir / directory
    try:
        data = _read_optional(folder / MANIFEST_NAME, retry)
        manifest = None if data is None else Manifest.parse(data, str(folder / MANIFEST_NAME))
    except (OSError, StorageError, CheckpointError) as e:
        return Found(directory, step, problem=str(e))
    if manifest is None:
        names = set(storage.files_under(folder))
        whole = TRAIN_STATE_FILE in names and (MODEL_FILE in names or "dcp/.metadata" in names)
        return Found(directory, step, legacy=whole)
    evaluation, problem = None, None
    try:
        data = _read_optional(folder / EVALUATION_NAME, retry)
        evaluation = None if data is None else Evaluation.parse(data, str(folder / EVALUATION_NAME))
    except (OSError, StorageError, CheckpointError) as e:
        problem = str(e)
    if evaluation is not None and evaluation.key != manifest.key:
        evaluation = None  # another write's (cannot happen: a folder is written whole); ignored
    incomplete: tuple[str, ...] = ()
    if sizes:
        listed = storage.file_sizes(folder, retry)
        incomplete = tuple(sorted(f for f, n in manifest.sizes.items() if listed.get(f) != n))
    return Found(directory, step, manifest, evaluation, problem, incomplete=incomplete)


def folders(model_dir: Location) -> list[str]:
    """The checkpoint folders (``ckpt-<step>``, ``ckpt-<step>.<hex>``) of ``model_dir``, by step."""
    names = [n for n in storage.listdir(model_dir) if CKPT_RE.match(n)]
    return sorted(names, key=lambda n: (int(CKPT_RE.match(n).group(1)), n))  # type: ignore[union-attr]


def scan(model_dir: Location, retry: RetryPolicy, *, sizes: bool = False) -> dict[str, Found]:
    """Every checkpoint folder of ``model_dir``, read (with ``sizes``: its files listed too)."""
    return {d: read_folder(model_dir, d, retry, sizes=sizes) for d in folders(model_dir)}


@dataclass(frozen=True)
class Health:
    """Whether a stored index describes the checkpoint folders, and if not, why (one clause)."""

    state: str
    why: str = ""
    stored: CheckpointIndex | None = None  # the stored index, when it could be read

    @property
    def ok(self) -> bool:
        return self.state == OK


def parse_stored(data: bytes | None, source: str) -> tuple[CheckpointIndex | None, str | None]:
    """The stored index, or why it cannot be read; an index of a newer stoker raises."""
    if data is None:
        return None, None
    try:
        return CheckpointIndex.parse(data, source), None
    except CheckpointError as e:
        if written_by_newer(data):
            raise
        return None, str(e).split("; run `stoker checkpoint repair")[0].removeprefix(f"{source} ")


def _names(found: Iterable[Found]) -> str:
    names = [f.directory for f in found]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def assess(data: bytes | None, source: str, found: Mapping[str, Found], listed: Iterable[str]) -> Health:
    """Whether the index in ``data`` describes the folders ``listed`` (``found``: those read).

    ``found`` must hold, for a readable index, the newest folder it names that exists and every
    unnamed folder of a higher step than its latest; otherwise every folder.

    An unnamed folder with a manifest is *newer* than the index when its step is above the
    latest's and it was written after every write the index names. One such folder whose
    manifest names the index's latest as its parent and that has no evaluation is what a crash
    between a checkpoint's files and its index write leaves: the index is fine (the write was
    never committed; it is replaced when that step is saved again). More than that, and the
    index is stale.
    """
    index, why = parse_stored(data, source)
    listed = list(listed)
    if data is None:
        whole = [f for f in found.values() if f.manifest is not None or f.unplaceable]
        return Health(MISSING, "is missing") if whole else Health(OK, stored=CheckpointIndex())
    if index is None:
        return Health(UNREADABLE, why or "is unreadable")
    present = set(listed)
    named = {r.directory for r in index.checkpoints}
    for r in reversed(_upto_latest(index)):
        if r.directory not in present:
            continue
        f = found.get(r.directory)
        differs = f.manifest.differs_from(r) if f is not None and f.manifest is not None else None
        if differs:
            return Health(FOREIGN, f"does not describe this model_dir's checkpoints ({differs})", index)
        break
    latest = index.record(index.latest) if index.latest else None
    newest_time = max((r.time for r in index.checkpoints), default=float("-inf"))
    newer = [
        f
        for d, f in found.items()
        if d not in named
        and f.manifest is not None
        and f.step > (latest.step if latest else -1)
        and f.manifest.time > newest_time
    ]
    if not newer:
        return Health(OK, stored=index)
    if latest is not None and len(newer) == 1 and newer[0].evaluation is None and newer[0].manifest is not None:
        if newer[0].manifest.parent == latest.key:
            return Health(OK, stored=index)  # an uncommitted write (docstring)
    verb = "is" if len(newer) == 1 else "are"
    names = f"{index.latest} as the latest" if index.latest else "no checkpoint"
    return Health(STALE, f"is stale: it names {names}, but {_names(newer)} {verb} newer", index)


def _upto_latest(index: CheckpointIndex) -> list[CheckpointRecord]:
    """The records up to the latest (after a resume that skipped a damaged checkpoint, a newer
    record may follow it)."""
    latest = index.record(index.latest) if index.latest else None
    return [r for r in index.checkpoints if latest is None or r.step <= latest.step]


def to_read(index: CheckpointIndex | None, listed: list[str]) -> list[str]:
    """The folders :func:`assess` needs read for ``index`` (``None``: every folder)."""
    if index is None:
        return listed
    present = set(listed)
    latest = index.record(index.latest) if index.latest else None
    named = {r.directory for r in index.checkpoints}
    newest_named = next((r.directory for r in reversed(_upto_latest(index)) if r.directory in present), None)
    newer = [d for d in listed if d not in named and _step(d) > (latest.step if latest else -1)]
    return ([newest_named] if newest_named else []) + newer


def _step(directory: str) -> int:
    m = CKPT_RE.match(directory)
    return int(m.group(1)) if m else -1


@dataclass
class Rebuilt:
    """An index rebuilt from manifests, and what to say about it."""

    index: CheckpointIndex
    incomplete: list[str] = field(default_factory=list)  # folders with files missing or cut short


def blocking_legacy(found: Mapping[str, Found], health: Health) -> list[Found]:
    """Whole checkpoints without a (readable) manifest that a rebuild cannot place: with no index
    to trust, every one; with a stale index, those it does not name above its latest (below it,
    an unnamed folder is what retention or a crash left, as with a sound index)."""
    if health.state not in (OK, STALE) or health.stored is None:
        return [f for f in found.values() if f.unplaceable]
    stored = health.stored
    latest = stored.record(stored.latest) if stored.latest else None
    floor = latest.step if latest is not None else -1
    return [f for f in found.values() if f.unplaceable and f.step > floor and stored.record_in(f.directory) is None]


def rebuild(found: Mapping[str, Found], health: Health, damaged: Iterable[str] = ()) -> Rebuilt:
    """The index the manifests in ``found`` make (module docstring); ``damaged``: folders known
    not to verify, never made the latest."""
    trusted = health.stored if health.state == STALE else None
    newest: dict[str, Found] = {}
    for f in found.values():
        if f.manifest is None:
            continue
        held = newest.get(f.manifest.name)
        if held is None or held.manifest is None or f.manifest.time > held.manifest.time:
            newest[f.manifest.name] = f
    records = [f.manifest.record(f.directory, f.evaluation) for f in newest.values() if f.manifest is not None]
    if trusted is not None:  # a stale index still vouches for its folders without a manifest
        records += [
            r
            for r in trusted.checkpoints
            if r.name not in newest and r.directory in found and found[r.directory].manifest is None
        ]
    records.sort(key=lambda r: (r.step, r.time))
    bad = set(damaged) | {f.directory for f in newest.values() if f.incomplete}
    usable = [r for r in records if r.directory not in bad]
    latest = usable[-1].name if usable else (records[-1].name if records else None)
    claims = [f.evaluation for f in newest.values() if f.evaluation is not None and f.evaluation.best is not None]
    best: Best | None = None
    if claims:
        best = max(claims, key=lambda e: e.updated).best_record()
    elif trusted is not None and trusted.best is not None and any(r.name == trusted.best.name for r in records):
        best = trusted.best
    index = CheckpointIndex(
        latest=latest,
        best=best,
        checkpoints=tuple(records),
        coverage=trusted.coverage if trusted is not None else None,
    )
    return Rebuilt(index, sorted(bad & {r.directory for r in records}))


def backup_name(state: str) -> str:
    """Where a replaced index's bytes are kept: ``checkpoint.json.<state>-<UTC time>``."""
    return f"{INDEX_NAME}.{state}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


def describe(source: str, health: Health, rebuilt: Rebuilt, kept: str | None) -> str:
    """The one line a rebuild logs."""
    index = rebuilt.index
    n = len(index.checkpoints)
    span = f" ({index.checkpoints[0].name} to {index.checkpoints[-1].name})" if n > 1 else ""
    best = f", best {index.best.name} ({index.best.metric} {index.best.value:g})" if index.best else ""
    bad = f"; {', '.join(rebuilt.incomplete)} incomplete: kept, not the latest" if rebuilt.incomplete else ""
    keep = f"; the old index is kept as {kept}" if kept else ""
    return (
        f"{source} {health.why}: rebuilt it from the manifests of {n} checkpoint(s){span}; "
        f"latest {index.latest}{best}{bad}{keep}"
    )


def refusal(source: str, model_dir: Location, health: Health, legacy: list[Found]) -> CheckpointError:
    """The one-line error when a rebuild cannot place checkpoints without manifests."""
    they = "it" if len(legacy) == 1 else "them"
    has = "has" if len(legacy) == 1 else "have"
    return CheckpointError(
        f"{source} {health.why}, and {_names(legacy)} {has} no manifest to verify {they} by (written before "
        f"checkpoints had manifests): nothing was changed; run `stoker checkpoint repair {model_dir}` to check "
        f"{they} and rebuild the index"
    )


def read_index_bytes(model_dir: Location, retry: RetryPolicy) -> bytes | None:
    """The stored ``checkpoint.json``'s bytes (``None``: there is none)."""
    path = model_dir / INDEX_NAME
    if isinstance(path, Path):
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"{path} cannot be read ({e})") from e
    return storage.read_versioned(path, retry)[0]


def examine(model_dir: Location, data: bytes | None, retry: RetryPolicy) -> tuple[Health, dict[str, Found]]:
    """The health of the index ``data`` and the folders read to tell it (few when it is fine)."""
    source = str(model_dir / INDEX_NAME)
    listed = folders(model_dir)
    stored, _ = parse_stored(data, source)
    found = {d: read_folder(model_dir, d, retry) for d in to_read(stored, listed)}
    return assess(data, source, found, listed), found


def checked_index(protocol: CommitProtocol, *, writer: bool) -> CheckpointIndex:
    """The model_dir's index, rebuilt first if it does not describe the checkpoints (module
    docstring); written back (under the index lock) only by a ``writer``."""
    model_dir, retry = protocol.model_dir, protocol.retry
    source = str(model_dir / INDEX_NAME)
    for _ in range(3):  # a reader racing a save may see the index before and the folders after it
        data = read_index_bytes(model_dir, retry)
        health, _ = examine(model_dir, data, retry)
        if health.ok:
            return health.stored or CheckpointIndex()
        if read_index_bytes(model_dir, retry) == data:
            break
    lines: list[str] = []

    def plan(now: bytes | None) -> tuple[CheckpointIndex, str | None] | None:
        health, _ = examine(model_dir, now, retry)
        if health.ok:
            return None  # another writer rebuilt it first
        found = scan(model_dir, retry, sizes=True)
        legacy = blocking_legacy(found, health)
        if legacy:
            raise refusal(source, model_dir, health, legacy)
        rebuilt = rebuild(found, health)
        kept = backup_name(health.state) if now is not None and writer else None
        lines.append(describe(source, health, rebuilt, kept))
        return rebuilt.index, kept

    if not writer:
        result = plan(data)
        if result is None:
            return CheckpointIndex.parse(read_index_bytes(model_dir, retry), source)
        log.info("%s (in memory: this process does not write the index)", lines[-1])
        return result[0]
    written = protocol.rewrite(plan)
    if written is None:
        return protocol.read_index()
    log.warning("%s", lines[-1])
    return written


__all__ = [
    "FOREIGN",
    "MISSING",
    "OK",
    "STALE",
    "UNREADABLE",
    "Found",
    "Health",
    "Rebuilt",
    "assess",
    "backup_name",
    "blocking_legacy",
    "checked_index",
    "describe",
    "examine",
    "parse_stored",
    "folders",
    "read_folder",
    "read_index_bytes",
    "rebuild",
    "refusal",
    "scan",
]
