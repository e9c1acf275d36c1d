"""``stoker checkpoint``: look after a model_dir's checkpoints from the command line.

``list``, ``verify`` and ``repair`` take a model_dir (``verify`` also one ``ckpt-<step>``
folder), a local path or an fsspec URL. Exit status: 0 when nothing is wrong (``repair``: once
repaired), 1 when damage is found (``repair``: damage it cannot repair, or ``--dry-run`` with
something to repair), 2 for a usage error (a path that is no model_dir). The work is in
``stoker.checkpoint.recovery`` and ``stoker.checkpoint.verify``; this module only prints.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .. import storage
from ..errors import CheckpointError
from ..storage.stores import DEFAULT_RETRY, Location
from .index import INDEX_NAME, CheckpointIndex, CheckpointRecord, repair_hint, written_by_newer
from .manifest import MANIFEST_NAME

USAGE, DAMAGE = 2, 1


def add_parser(subparsers: Any) -> None:
    """Register ``stoker checkpoint consolidate | list | verify | repair``."""
    parser = subparsers.add_parser(
        "checkpoint", help="checkpoint utilities (list, verify, repair the index, consolidate a sharded checkpoint)"
    )
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    where = "MODEL_DIR is a local path or an fsspec URL (s3://, gs://, memory://)."
    for name, help_text, description in (
        (
            "list",
            "list a model_dir's checkpoints and say whether its index describes them",
            "One line per checkpoint folder: step, write time, size, evaluation results, latest/best, and "
            "whether the index names it and it has a manifest. Reads no checkpoint file. Exit 1 when "
            "checkpoint.json is missing, unreadable, stale or foreign (`repair` rebuilds it).",
        ),
        (
            "verify",
            "read every checkpoint file and check its size and sha256",
            "Check every file of every checkpoint against its manifest (and the index record), or, for a "
            "checkpoint from before manifests, against the index. MODEL_DIR may also be one ckpt-<step> folder, "
            "checked on its own. Exit 1 when anything is damaged or the index does not describe the "
            "checkpoints.",
        ),
        (
            "repair",
            "rebuild checkpoint.json from the checkpoints' manifests; add manifests to older checkpoints",
            "Verify every checkpoint, then write what is missing: a manifest for each checkpoint from before "
            "manifests (from its index record, or when no index vouches for it, if its files decode), and, "
            "when the index is missing, unreadable, stale or foreign, a rebuilt one whose latest is the newest "
            "checkpoint that verifies (the old index kept as checkpoint.json.<state>-<time>). Deletes nothing; "
            "a second run finds nothing to do. Exit 1 when damage remains.",
        ),
    ):
        cmd = sub.add_parser(name, help=help_text, description=f"{description} {where}")
        cmd.add_argument("path", metavar="MODEL_DIR", help="model_dir (local path or fsspec URL)")
        if name == "repair":
            cmd.add_argument("--dry-run", action="store_true", help="say what would be written; write nothing")
        cmd.set_defaults(func={"list": _list, "verify": _verify, "repair": _repair}[name])
    cons = sub.add_parser(
        "consolidate",
        help="write one model.safetensors from a sharded checkpoint's dcp/ directory",
        description="Gather a sharded (FSDP2) checkpoint's weight slices into one model.safetensors, "
        "readable without stoker. PATH is a model_dir (its newest checkpoint) or a ckpt-<step> directory, "
        "a local path or an fsspec URL (s3://, gs://, memory://).",
    )
    cons.add_argument("path", help="model_dir or ckpt-<step> directory (local path or fsspec URL)")
    cons.add_argument(
        "--out", help="output file, local path or URL (default: PATH's checkpoint directory/model.safetensors)"
    )
    cons.set_defaults(func=_consolidate)


def _consolidate(args: argparse.Namespace) -> int:
    import safetensors.torch

    from ..distributed.sharded import DCP_DIR, consolidate
    from .files import load_checkpoint
    from .manager import CheckpointManager

    try:
        ckpt = CheckpointManager(args.path, writer=False).resolve(args.path)
    except CheckpointError as e:
        print(f"stoker checkpoint consolidate: {e}")
        return 1
    if ckpt is None or not storage.is_dir(ckpt / DCP_DIR):
        print(
            f"stoker checkpoint consolidate: {ckpt or args.path} is not a sharded checkpoint (no {DCP_DIR}/ directory)"
        )
        return 1
    try:
        load_checkpoint(ckpt)  # every file verified and vetted as resume does, before DCP reads any
        weights = consolidate(ckpt / DCP_DIR)
    except CheckpointError as e:
        print(f"stoker checkpoint consolidate: {e}")
        return 1
    out = storage.location(args.out) if args.out else ckpt / "model.safetensors"
    tensors = {k: v.contiguous() for k, v in weights.items()}
    if isinstance(out, Path):
        tmp = out.with_name(out.name + ".tmp")
        safetensors.torch.save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(out)
    else:  # one whole-object PUT: readers see all of it or none (no rename on an object store)
        storage.write_all([(out, safetensors.torch.save(tensors, metadata={"format": "pt"}))])
    print(f"wrote {out} ({len(weights)} tensors, {sum(v.numel() for v in weights.values()):,} values)")
    return 0


# ---------------------------------------------------------------------------- list / verify / repair
def _model_dir(args: argparse.Namespace) -> Location | None:
    """``args.path`` if it is a model_dir (an index or checkpoint folders); else says so (exit 2)."""
    from .recovery import folders

    path = storage.location(args.path)
    if storage.exists(path / INDEX_NAME) or folders(path):
        return path
    print(
        f"stoker checkpoint {args.checkpoint_command}: {path} is not a model_dir (no {INDEX_NAME}, no ckpt-* folders)"
    )
    return None


def _newer(path: Location) -> str | None:
    """The refusal for an index a newer stoker wrote (never repaired: this stoker cannot read it)."""
    from .recovery import read_index_bytes

    data = read_index_bytes(path, DEFAULT_RETRY)
    if data is not None and written_by_newer(data):
        try:
            CheckpointIndex.parse(data, str(path / INDEX_NAME))
        except CheckpointError as e:
            return str(e)
    return None


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _summary(index: CheckpointIndex) -> str:
    n = len(index.checkpoints)
    best = index.best
    tail = f", best {best.name} ({best.metric} {best.mode} {best.value:g})" if best else ""
    return f"{n} checkpoint{'s' if n != 1 else ''}, latest {index.latest}{tail}"


def _metrics(record: CheckpointRecord) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in sorted(record.metrics.items()) if k != "global_step")


def _is(index: CheckpointIndex, record: CheckpointRecord, what: str) -> bool:
    """Whether ``record`` is the index's ``latest`` or ``best``."""
    if what == "latest":
        return record.name == index.latest
    return index.best is not None and index.best.name == record.name


def _list(args: argparse.Namespace) -> int:
    from .recovery import assess, folders, parse_stored, read_folder, read_index_bytes, rebuild

    path = _model_dir(args)
    if path is None:
        return USAGE
    if (newer := _newer(path)) is not None:
        print(newer)
        return USAGE
    source = str(path / INDEX_NAME)
    data = read_index_bytes(path, DEFAULT_RETRY)
    listed = folders(path)
    found = {d: read_folder(path, d, DEFAULT_RETRY, sizes=True) for d in listed}
    health = assess(data, source, found, listed)
    stored, _ = parse_stored(data, source)
    index = stored if health.ok and stored is not None else rebuild(found, health).index
    if health.ok:
        print(f"{source}: ok, {_summary(index)}")
    else:
        print(f"{source} {health.why}; {repair_hint(source)}")
        print(f"from the manifests: {_summary(index)}")
    rows = [("checkpoint", "step", "written", "bytes", "files", "notes", "evaluation")]
    for d, f in found.items():
        rec = index.record_in(d)
        notes = [n for n in ("latest", "best") if rec is not None and _is(index, rec, n)]
        if rec is not None and rec.superseded:
            notes.append("superseded")
        if stored is None or stored.record_in(d) is None:
            notes.append("not in the index")
        if f.manifest is None:
            notes.append("no manifest" if f.problem is None else "manifest unreadable")
        if f.incomplete:
            notes.append(f"incomplete: {', '.join(f.incomplete)}")
        if rec is None:
            rows.append((d, str(f.step), "", "", "", ", ".join(notes), ""))
            continue
        written = _when(rec.time)
        rows.append((d, str(f.step), written, f"{rec.bytes:,}", str(len(rec.files)), ", ".join(notes), _metrics(rec)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.rjust(w) if i in (1, 3, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        print("  " + "  ".join(cells).rstrip())
    return 0 if health.ok else DAMAGE


def _folder_line(report: Any) -> str:
    name = report.found.directory
    if report.faults:
        return f"{name}: DAMAGED: {'; '.join(report.faults)}"
    files = f"{len(report.sha256)} files, {sum(report.sizes.values()):,} bytes"
    by = report.verified_by
    if by == "its manifest" and report.record is not None:
        by = "its manifest and the index"
    checked = "sha256" if by == "the index" else "sizes and sha256"
    what = f"ok ({files}; {checked} match {by})" if by else f"unverified ({files})"
    notes = "; ".join(report.notes)
    return f"{name}: {what}" + (f"; {notes}" if notes else "")


def _verify(args: argparse.Namespace) -> int:
    from .files import CKPT_RE, index_record
    from .recovery import read_folder
    from .verify import examine_fully, verify_folder

    path = storage.location(args.path)
    if CKPT_RE.match(path.name) and storage.exists(path / MANIFEST_NAME) or storage.is_dir(path / "dcp"):
        report = verify_folder(
            path.parent, read_folder(path.parent, path.name, DEFAULT_RETRY), index_record(path), DEFAULT_RETRY
        )
        print(_folder_line(report))
        return DAMAGE if report.faults else 0
    model_dir = _model_dir(args)
    if model_dir is None:
        return USAGE
    if (newer := _newer(model_dir)) is not None:
        print(newer)
        return USAGE
    source = str(model_dir / INDEX_NAME)
    _, health, reports = examine_fully(model_dir, DEFAULT_RETRY)
    if health.ok:
        print(f"{source}: ok, {_summary(health.stored or CheckpointIndex())}")
    else:
        print(f"{source} {health.why}; {repair_hint(source)}")
    for report in reports.values():
        print(_folder_line(report))
    faulty = [d for d, r in reports.items() if r.faults]
    verified = len(reports) - len(faulty)
    if faulty:
        print(f"damage found: {', '.join(faulty)}; {verified} of {len(reports)} checkpoints verify")
    elif health.ok:
        print(f"every checkpoint verifies ({len(reports)})")
    else:
        print(f"every checkpoint verifies ({len(reports)}); the index does not describe them")
    return DAMAGE if faulty or not health.ok else 0


def _repair(args: argparse.Namespace) -> int:
    from .commit import commit_protocol
    from .verify import apply_repair, plan_repair

    model_dir = _model_dir(args)
    if model_dir is None:
        return USAGE
    if (newer := _newer(model_dir)) is not None:
        print(newer)
        return USAGE
    source = str(model_dir / INDEX_NAME)
    plan = plan_repair(model_dir, DEFAULT_RETRY)
    print(f"{source}: ok" if plan.health.ok else f"{source} {plan.health.why}")
    for d, report in plan.reports.items():
        line = _folder_line(report)
        if d in plan.manifests:
            line += "; a manifest is written for it"
        if d in plan.left_out:
            line += "; left out of the index, left on disk"
        elif plan.rebuilt is not None and d in plan.damaged and plan.rebuilt.index.record_in(d) is not None:
            line += "; kept in the index, not the latest"
        print(line)
    unfixed = [d for d, r in plan.reports.items() if r.damage or (r.problems and d not in plan.manifests)]
    verb = "would write" if args.dry_run else "wrote"
    if not plan.changes:
        print("nothing to repair" + (f"; damage found: {', '.join(unfixed)}" if unfixed else ""))
        return DAMAGE if unfixed else 0
    kept = None
    if not args.dry_run:
        try:
            kept = apply_repair(commit_protocol(model_dir, DEFAULT_RETRY), plan)
        except CheckpointError as e:
            print(f"stoker checkpoint repair: {e}")
            return DAMAGE
    if plan.manifests:
        print(f"{verb} {len(plan.manifests)} manifest(s): {', '.join(plan.manifests)}")
    if plan.rebuilt is not None:
        keep = f"; the old one is kept as {kept}" if kept else ""
        print(f"{verb} {source}: {_summary(plan.rebuilt.index)}{keep}")
    if args.dry_run:
        print("--dry-run: nothing was written")
        return DAMAGE
    if unfixed:
        print(
            f"damage found: {', '.join(unfixed)} (kept as it is; training resumes from the newest checkpoint "
            "that verifies)"
        )
    return DAMAGE if unfixed else 0
