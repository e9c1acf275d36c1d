"""``stoker checkpoint verify`` and ``repair`` as functions: every file of every checkpoint read
and checked, and the repair that follows from it.

:func:`verify_folder` reads one checkpoint folder whole: every file its manifest (else the index
record naming it) lists must be there, of its size and sha256; files it does not list are named
and left alone. A folder without a manifest that no index names (written before manifests) can
only be decoded, which says its files are whole, not that they are the ones written.

:func:`plan_repair` decides what ``repair`` writes, from those reports and the index's health
(``stoker.checkpoint.recovery``): a manifest for each checkpoint from before manifests whose
files match its index record, or, when the index must be rebuilt, whose files decode; and the
rebuilt index, whose ``latest`` is the newest checkpoint that verifies. :func:`apply_repair`
writes the manifests, then the index, under the index lock and only if the index is still the
one planned from (the old bytes kept as ``checkpoint.json.<state>-<UTC time>``). Nothing is
deleted; a second run finds nothing to do.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import storage
from ..errors import CheckpointError
from ..storage.stores import Location, RetryPolicy
from . import safe_load
from .commit import CommitProtocol
from .files import MODEL_FILE, TRAIN_STATE_FILE
from .index import INDEX_NAME, CheckpointIndex, CheckpointRecord
from .manifest import MANIFEST_NAME, OWN_FILES, Manifest
from .recovery import (
    OK,
    STALE,
    Found,
    Health,
    Rebuilt,
    assess,
    backup_name,
    folders,
    parse_stored,
    read_folder,
    read_index_bytes,
    rebuild,
)


@dataclass
class FolderReport:
    """What reading one checkpoint folder whole found.

    Attributes:
        found: the folder as scanned (its manifest and evaluation).
        record: the index record naming it, if any.
        damage: each way its files differ from what was written (empty: they verify).
        problems: its own files that cannot be read (an unreadable manifest or evaluation).
        notes: what else is worth saying (checked against the index only, extra files).
        sha256, sizes: of every file in it (its own files aside), as read now.
        decodes: for a folder nothing vouches for: whether every file decodes.
    """

    found: Found
    record: CheckpointRecord | None = None
    damage: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sha256: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    decodes: bool | None = None

    @property
    def faults(self) -> list[str]:
        """Everything wrong with it: its own unreadable files, then its files' damage."""
        return self.problems + self.damage

    @property
    def verified_by(self) -> str:
        """What its files were checked against: "its manifest", "the index", or ""."""
        return "its manifest" if self.found.manifest is not None else "the index" if self.record else ""


def verify_folder(
    model_dir: Location, found: Found, record: CheckpointRecord | None, retry: RetryPolicy
) -> FolderReport:
    """Read every file of checkpoint folder ``found`` and check it (module docstring)."""
    report = FolderReport(found, record)
    folder = model_dir / found.directory
    listed = storage.file_sizes(folder, retry)
    for fname in sorted(listed):
        base = fname.rsplit("/", 1)[-1]
        if fname in OWN_FILES or "/" not in fname and base.startswith(".") and base.endswith(".tmp"):
            continue  # its own files, and a temporary file of an interrupted write of them
        try:
            data = storage.read_bytes(folder / fname, retry)
        except OSError as e:
            report.damage.append(f"{fname} cannot be read ({e})")
            continue
        report.sha256[fname], report.sizes[fname] = hashlib.sha256(data).hexdigest(), len(data)
    if found.problem:
        report.problems.append(found.problem.removeprefix(f"{folder}/"))
    manifest = found.manifest
    if manifest is not None:
        _compare(report, manifest.files, manifest.sizes, "its manifest")
        if record is not None and manifest.differs_from(record):
            report.notes.append(f"the index's record differs: {manifest.differs_from(record)}")
    elif record is not None:
        _compare(report, record.files, None, "the index")
        report.notes.append(
            "no manifest (written before checkpoints had manifests): its files are checked against the index only"
        )
    elif found.legacy or found.problem:
        report.decodes = _decodes(report, folder)
        if report.decodes:
            report.notes.append("no manifest and not in the index: its files decode, which is all that can be checked")
    else:
        report.notes.append(
            "not a whole checkpoint, without a manifest or an index record: an unfinished or partly removed write"
        )
    expected = manifest.files if manifest is not None else record.files if record is not None else report.sha256
    extra = sorted(set(report.sha256) - set(expected))
    if extra:
        report.notes.append(f"{', '.join(extra)}: not one of its files (left alone)")
    return report


def _compare(report: FolderReport, sha: Mapping[str, str], sizes: Mapping[str, int] | None, by: str) -> None:
    for fname, want in sorted(sha.items()):
        if fname not in report.sha256:
            if not any(d.startswith(f"{fname} ") for d in report.damage):
                report.damage.append(f"{fname} is missing ({by} lists it)")
            continue
        if sizes is not None and sizes.get(fname) != report.sizes[fname]:
            report.damage.append(f"{fname} is {report.sizes[fname]} bytes but {by} says {sizes.get(fname)}")
        elif report.sha256[fname] != want:
            report.damage.append(f"{fname} has sha256 {report.sha256[fname][:12]}… but {by} says {want[:12]}…")


def _decodes(report: FolderReport, folder: Location) -> bool:
    """Whether every file of a folder nothing vouches for decodes (a whole checkpoint, at least)."""
    names = set(report.sha256)
    if TRAIN_STATE_FILE not in names or not (MODEL_FILE in names or "dcp/.metadata" in names):
        report.damage.append("not a whole checkpoint (no train_state.pt, or neither model.safetensors nor dcp/)")
        return False
    for fname in sorted(names):
        if fname.startswith("dcp/") and not fname.endswith("/.metadata"):
            continue  # the slices are raw tensor bytes; .metadata says how to read them
        try:
            safe_load.decode(storage.read_bytes(folder / fname), fname, str(folder), None)
        except CheckpointError as e:
            report.damage.append(str(e).split(" is corrupt: ", 1)[-1].split("; refusing")[0])
            return False
    return True


@dataclass
class RepairPlan:
    """What ``repair`` found and would write.

    Attributes:
        health: the stored index's health (checking every record it names).
        reports: every checkpoint folder, read whole.
        manifests: ``{folder: manifest}`` to write into checkpoints from before manifests.
        rebuilt: the index to write instead of the stored one (``None``: it stays).
        left_out: folders nothing can place in a rebuilt index (their files do not decode).
        data: the stored index's bytes when planned (written over only if still the same).
    """

    health: Health
    reports: dict[str, FolderReport]
    manifests: dict[str, Manifest] = field(default_factory=dict)
    rebuilt: Rebuilt | None = None
    left_out: list[str] = field(default_factory=list)
    data: bytes | None = None

    @property
    def damaged(self) -> list[str]:
        """Folders whose files do not verify (or decode)."""
        return [d for d, r in self.reports.items() if r.damage]

    @property
    def faulty(self) -> list[str]:
        """Folders with anything wrong, their own files included."""
        return [d for d, r in self.reports.items() if r.faults]

    @property
    def changes(self) -> bool:
        return bool(self.manifests) or self.rebuilt is not None


def examine_fully(model_dir: Location, retry: RetryPolicy) -> tuple[bytes | None, Health, dict[str, FolderReport]]:
    """The stored index, its health (every record it names checked against its folder's
    manifest), and every checkpoint folder read whole."""
    source = str(model_dir / INDEX_NAME)
    data = read_index_bytes(model_dir, retry)
    listed = folders(model_dir)
    found = {d: read_folder(model_dir, d, retry, sizes=True) for d in listed}
    health = assess(data, source, found, listed)
    stored, _ = parse_stored(data, source)
    if health.ok and stored is not None:  # assess checks the newest; here every record is
        for r in stored.checkpoints:
            f = found.get(r.directory)
            differs = f.manifest.differs_from(r) if f is not None and f.manifest is not None else None
            if differs:
                health = Health("foreign", f"does not describe this model_dir's checkpoints ({differs})", stored)
                break
    trusted = stored if health.state in (OK, STALE) else None
    reports = {
        d: verify_folder(model_dir, f, trusted.record_in(d) if trusted is not None else None, retry)
        for d, f in found.items()
    }
    return data, health, reports


def plan_repair(model_dir: Location, retry: RetryPolicy) -> RepairPlan:
    """What ``repair`` writes (module docstring); nothing is written here."""
    data, health, reports = examine_fully(model_dir, retry)
    plan = RepairPlan(health, reports, data=data)
    found: dict[str, Found] = {}
    for d, r in reports.items():
        f = r.found
        if f.manifest is None and r.record is not None and not r.damage:
            plan.manifests[d] = _manifest(r.record.name, r.record.step, r.record.time, r)  # vouched for by the index
        elif f.manifest is None and not health.ok and r.record is None and r.decodes:
            plan.manifests[d] = _manifest(f"ckpt-{f.step}", f.step, _written_at(model_dir / d, r), r)
        elif f.unplaceable and not health.ok and r.record is None:
            plan.left_out.append(d)
        found[d] = replace(f, manifest=plan.manifests[d], legacy=False) if d in plan.manifests else f
    if not health.ok:
        plan.rebuilt = rebuild(found, health, damaged=plan.damaged)
    return plan


def _manifest(name: str, step: int, written: float, report: FolderReport) -> Manifest:
    return Manifest(name=name, step=step, time=written, files=dict(report.sha256), sizes=dict(report.sizes))


def _written_at(folder: Location, report: FolderReport) -> float:
    """When a checkpoint nothing records was written: its newest file's time on a local disk,
    else now (an object store's listing times are not the write's)."""
    if isinstance(folder, Path):
        return max((folder / f).stat().st_mtime for f in report.sha256)
    return time.time()


def apply_repair(protocol: CommitProtocol, plan: RepairPlan) -> str | None:
    """Write what ``plan`` says; the name the old index is kept under, if it was replaced.

    Raises ``CheckpointError`` when the index changed since the plan was made (a run writing to
    this model_dir): then only manifests were written, which a rerun of ``repair`` finds done.
    """
    for d, manifest in plan.manifests.items():
        if plan.reports[d].problems:  # an unreadable manifest: its bytes are kept beside the new one
            old = storage.read_bytes(protocol.model_dir / d / MANIFEST_NAME, protocol.retry)
            protocol.write_own_file(d, f"{MANIFEST_NAME}.unreadable", old)
        protocol.write_own_file(d, MANIFEST_NAME, manifest.encode())
    if plan.rebuilt is None:
        return None
    keep = backup_name(plan.health.state) if plan.data is not None else None
    index: CheckpointIndex = plan.rebuilt.index

    def write(now: bytes | None) -> tuple[CheckpointIndex, str | None]:
        if now != plan.data:
            raise CheckpointError(
                f"{protocol.model_dir / INDEX_NAME} changed while repair read the checkpoints (is a run writing "
                "to this model_dir?): the index was left as it is; run repair again once nothing writes to it"
            )
        return index, keep

    protocol.rewrite(write)
    return keep


__all__ = ["FolderReport", "RepairPlan", "apply_repair", "examine_fully", "plan_repair", "verify_folder"]
