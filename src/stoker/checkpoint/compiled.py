"""Compiled artifacts beside the checkpoints: one content-addressed bundle shared while it is valid.

A compiled run (``RunConfig(compile="module" | "step")``) hands each save the compiler's output
as a :class:`CompiledBundle` (made by :mod:`stoker.engine.compile_cache`): its bytes and the
*fingerprint* of what makes it valid (torch and Triton versions, device kind and capability,
compile mode, precision, model structure). The bundle is written once, atomically, to
``model_dir/compiled/<fingerprint id>-<sha256>.bin``; each checkpoint that may use it holds a
small reference file, ``compiled-<fingerprint id>-<sha256>.json`` (the bundle's name, sha256,
size and fingerprint), which is one of its files: listed in its manifest and index record with
its own sha256 like the weights. Checkpoints share one bundle while the fingerprint and the
compiled graphs hold; a bundle no retained checkpoint references is deleted after the save
that drops the last one.

Trust: a bundle holds pickles and native code, so it is loaded only when a checkpoint of this
model_dir references it (the reference verified by the index or manifest), and only when its
bytes have the sha256 that reference names: a model_dir is trusted as its checkpoints are, a
bundle from anywhere else is refused (docs/checkpoints.md, "Compiled artifacts").

No torch here: what a bundle holds and how it is installed is the engine's business.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import storage
from ..errors import CheckpointError, StorageError
from ..storage import Location, RetryPolicy
from ..storage.stores import UrlPath
from .files import _read_verified as read_verified
from .files import expected_files
from .index import CheckpointIndex

log = logging.getLogger("stoker")

COMPILED_DIR = "compiled"
REF_FORMAT = "stoker-compiled-ref/1"
#: ``compiled-<fingerprint id>-<sha256>.json``: the reference file's name says which bundle it names
REF_RE = re.compile(r"^compiled-([0-9a-f]{16})-([0-9a-f]{64})\.json$")
BUNDLE_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{64})\.bin$")


def fingerprint_id(fingerprint: Mapping[str, str]) -> str:
    """16 hex digits naming ``fingerprint`` (sha256 of its sorted JSON)."""
    return hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompiledBundle:
    """What the compiler produced for a run, and the fingerprint it is valid for."""

    fingerprint: Mapping[str, str]
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def name(self) -> str:
        """The bundle's file name under ``model_dir/compiled/``."""
        return f"{fingerprint_id(self.fingerprint)}-{self.sha256}.bin"

    def reference(self) -> tuple[str, bytes]:
        """The checkpoint file that references this bundle: ``(name, bytes)``."""
        obj = {
            "bundle": f"{COMPILED_DIR}/{self.name}",
            "bytes": len(self.data),
            "fingerprint": dict(self.fingerprint),
            "format": REF_FORMAT,
            "sha256": self.sha256,
        }
        return f"compiled-{self.name.removesuffix('.bin')}.json", json.dumps(obj, indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class BundleReference:
    """A checkpoint's reference to a bundle, as read (and verified) from its file."""

    name: str  # the bundle's file name under compiled/
    sha256: str
    fingerprint: Mapping[str, str]

    @classmethod
    def parse(cls, fname: str, data: bytes) -> BundleReference:
        """The reference file ``fname``'s content; ``CheckpointError`` when it is malformed or its
        name and content disagree (the bundle's name is never taken from anything else)."""
        m = REF_RE.match(fname)
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{fname} is unreadable ({e})") from e
        if m is None or not isinstance(obj, dict) or obj.get("format") != REF_FORMAT:
            raise CheckpointError(f"{fname} is not a compiled-artifacts reference of format {REF_FORMAT!r}")
        fp = obj.get("fingerprint")
        if not isinstance(fp, dict) or not all(isinstance(v, str) for v in fp.values()):
            raise CheckpointError(f"{fname}: 'fingerprint' must be an object of strings")
        if fingerprint_id(fp) != m.group(1) or obj.get("sha256") != m.group(2):
            raise CheckpointError(f"{fname}: its fingerprint or sha256 is not the one its name says")
        return cls(name=f"{m.group(1)}-{m.group(2)}.bin", sha256=m.group(2), fingerprint=fp)


def references(files: Iterable[str]) -> list[str]:
    """The reference files among a checkpoint's ``files``."""
    return sorted(f for f in files if REF_RE.match(f))


def checkpoint_reference(checkpoint: Location) -> BundleReference | None:
    """The bundle reference of ``checkpoint`` (``None``: it has none), its file verified against
    the sha256 its index record or manifest lists (``CheckpointError`` when it does not match or
    nothing lists the checkpoint's files: a reference is only trusted as one of its files)."""
    expected, by = expected_files(checkpoint)
    if expected is None:
        raise CheckpointError(f"no index or manifest lists the files of {checkpoint}")
    refs = references(expected)
    if not refs:
        return None
    return BundleReference.parse(refs[-1], read_verified(checkpoint, refs[-1], expected, by))


def write_bundle(model_dir: Location, bundle: CompiledBundle, retry: RetryPolicy) -> bool:
    """Write ``bundle`` under ``model_dir/compiled/`` unless it is there already (its name is its
    content); atomically: locally a temporary file renamed into place, on an object store one
    put. Returns whether it wrote."""
    folder = model_dir / COMPILED_DIR
    target = folder / bundle.name
    if storage.exists(target):
        return False
    if isinstance(model_dir, UrlPath):
        storage.write_all([(target, bundle.data)], retry)
        return True
    assert isinstance(folder, Path) and isinstance(target, Path)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{bundle.name}.tmp-{os.getpid()}"
    try:
        storage.write_all([(tmp, bundle.data)], retry)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    storage.fsync_dir(folder)
    return True


def read_bundle(model_dir: Location, ref: BundleReference) -> bytes:
    """The bytes of the bundle ``ref`` names, checked against its sha256 (``CheckpointError``
    when missing, unreadable or not the bytes the checkpoint referenced)."""
    path = model_dir / COMPILED_DIR / ref.name
    try:
        data = storage.read_bytes(path)
    except (OSError, StorageError) as e:
        raise CheckpointError(f"{path} cannot be read ({e})") from e
    got = hashlib.sha256(data).hexdigest()
    if got != ref.sha256:
        raise CheckpointError(f"{path} has sha256 {got[:12]}… but its checkpoint says {ref.sha256[:12]}…")
    return data


def _remove_file(path: Location) -> None:
    if isinstance(path, UrlPath):
        fs = storage.filesystem(path)
        fs.rm(str(fs._strip_protocol(str(path))))
    else:
        path.unlink(missing_ok=True)


def remove_unreferenced(model_dir: Location, index: CheckpointIndex) -> list[str]:
    """Delete the bundles under ``model_dir/compiled/`` that no checkpoint ``index`` retains
    references (and leftover temporary files); returns their names."""
    kept = set()
    for rec in index.checkpoints:
        for f in references(rec.files):
            m = REF_RE.match(f)
            assert m is not None
            kept.add(f"{m.group(1)}-{m.group(2)}.bin")
    folder = model_dir / COMPILED_DIR
    removed = []
    for name in storage.listdir(folder):
        if name in kept or not (BUNDLE_RE.match(name) or name.startswith(".")):
            continue
        try:
            _remove_file(folder / name)
            removed.append(name)
        except (OSError, StorageError) as e:  # a leftover, not a fault of the save: the next one retries
            log.warning("could not remove the unreferenced compiled bundle %s (%s)", folder / name, e)
    return removed


__all__ = [
    "BUNDLE_RE",
    "COMPILED_DIR",
    "REF_RE",
    "BundleReference",
    "checkpoint_reference",
    "CompiledBundle",
    "fingerprint_id",
    "read_bundle",
    "references",
    "remove_unreferenced",
    "write_bundle",
]
