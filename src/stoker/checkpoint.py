"""Checkpoints: atomic writes, an index with sha256 per file, retention, best-by-metric, warm start.

Layout (a user-facing format, documented in docs/checkpoints.md)::

    model_dir/
      checkpoint.json              index: latest, retained checkpoints, best, sha256 of each file
      checkpoint.lock              taken (flock) by every writer of the index: trainer, evaluator
      ckpt-<step>/model.safetensors   weights, readable without stoker
      ckpt-<step>/train_state.pt      optimizer, schedule, scaler, RNGs, step, cache, hook state
      ckpt-<step>/input-<rank>.json   input pipeline position of each replica (.pt if not JSON)
      ckpt-<step>/dcp/                sharded runs: model and optimizer slices of every replica
                                      (torch.distributed.checkpoint) instead of model.safetensors

A checkpoint is written into a hidden temporary directory, every file fsynced, then renamed
into place; only after that is the index replaced (again temp + rename). A crash at any
moment therefore leaves the index pointing at a complete, earlier checkpoint. Loading
verifies every file against the index and refuses a mismatch.

The fsyncs that do not depend on each other (every file of the checkpoint and the new
index's temporary file) run concurrently, so the filesystem commits them together; only the
ones that order the renames wait for each other. On this project's ext4 disk that took the
final checkpoint of a small model from 7 fsyncs in a row (5-30 ms, depending on the other
I/O of the machine) to a few ms.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # POSIX; elsewhere the index has one writer at a time by convention
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

import safetensors.torch
import torch
from torch import nn

from . import safe_load
from .errors import CheckpointError

log = logging.getLogger("stoker")

INDEX_NAME = "checkpoint.json"
INDEX_LOCK_NAME = "checkpoint.lock"
INDEX_FORMAT = "stoker-checkpoint-index/1"
MODEL_FILE = "model.safetensors"
TRAIN_STATE_FILE = "train_state.pt"
_CKPT_RE = re.compile(r"^ckpt-(\d+)$")


@dataclass
class LoadedCheckpoint:
    """What a checkpoint holds, read and verified."""

    path: Path
    step: int
    model_state: dict[str, torch.Tensor] | None  # None: the weights are in ``dcp_dir``
    train_state: dict[str, Any]
    input_states: dict[int, Any] = field(default_factory=dict)
    dcp_dir: Path | None = None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` and fsync it; return its sha256."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = _temp_name(path)
    _write_durably(tmp, text.encode())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_pool)


def _write_all_durably(jobs: list[tuple[Path, bytes]]) -> list[str]:
    """``_write_durably`` each ``(path, data)`` concurrently (fsync releases the GIL, and the
    filesystem commits concurrent fsyncs together); their sha256s, in order. Raises the first
    error after every write has finished."""
    global _pool
    if len(jobs) == 1:
        return [_write_durably(*jobs[0])]
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="stoker-fsync")
        pool = _pool
    futures = [pool.submit(_write_durably, path, data) for path, data in jobs[1:]]
    try:
        first = _write_durably(*jobs[0])
    finally:
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return [first] + [f.result() for f in futures]


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


class CheckpointManager:
    """Owns ``model_dir``'s checkpoints and their index. Only the chief process writes."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        keep_checkpoint_max: int = 5,
        keep_best: tuple[str, str] | None = None,
        writer: bool = True,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.keep_checkpoint_max = keep_checkpoint_max
        self.keep_best = keep_best
        self.writer = writer
        if writer:
            self.model_dir.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()

    # ---------------------------------------------------------------- index
    def index(self) -> dict[str, Any]:
        path = self.model_dir / INDEX_NAME
        if not path.exists():
            return {"format": INDEX_FORMAT, "latest": None, "best": None, "checkpoints": []}
        try:
            index = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path} is unreadable ({e}); restore it or remove model_dir") from e
        if index.get("format") != INDEX_FORMAT:
            raise CheckpointError(f"{path} has format {index.get('format')!r}; this stoker reads {INDEX_FORMAT!r}")
        return index

    def records(self) -> list[dict[str, Any]]:
        return list(self.index()["checkpoints"])

    def latest_path(self) -> Path | None:
        """The newest indexed checkpoint whose directory exists.

        Deleting a checkpoint's directory by hand (e.g. one refused as corrupt) makes the
        previous retained one the latest.
        """
        index = self.index()
        for rec in reversed(index["checkpoints"]):
            path = self.model_dir / rec["name"]
            if path.is_dir():
                if rec["name"] != index["latest"]:
                    log.warning("%s is missing: resuming from the previous retained checkpoint %s", index["latest"], path)
                return path
        return None

    def latest_step(self) -> int | None:
        latest = self.latest_path()
        return None if latest is None else _step_of(latest)

    def best(self) -> dict[str, Any] | None:
        return self.index()["best"]

    @contextmanager
    def index_lock(self) -> Iterator[None]:
        """Hold ``model_dir``'s index lock: one read-modify-write of the index at a time.

        Two processes write the index (the trainer saving, an evaluator recording results), so
        every update reads, changes and replaces it under this lock; neither can lose the
        other's change. An advisory ``flock`` on a lock file beside the index: released by the
        kernel when the holder dies, so a kill -9 never leaves it stuck.
        """
        self.model_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.model_dir / INDEX_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def update_index(self, mutate: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply ``mutate`` to the index under the lock, apply retention, write it atomically.

        Returns what ``mutate`` returned. Checkpoints retention drops are deleted after the new
        index no longer names them.
        """
        if not self.writer:
            raise CheckpointError("this CheckpointManager was opened read-only (writer=False)")
        with self.index_lock():
            index = self.index()
            result = mutate(index)
            removed = self._retain(index)
            _atomic_write_text(self.model_dir / INDEX_NAME, json.dumps(index, indent=1, sort_keys=True))
        self._remove(removed)
        return result

    # ---------------------------------------------------------------- save
    def begin(self, step: int) -> Path:
        """A fresh temporary directory for ``ckpt-<step>`` that other replicas may write into."""
        tmp = self.model_dir / f".tmp-ckpt-{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def save(
        self,
        step: int,
        model_state: Mapping[str, torch.Tensor] | None,
        train_state: Mapping[str, Any],
        input_states: Mapping[int, Any] | None = None,
        tmp_dir: Path | None = None,
    ) -> Path:
        """Write ``ckpt-<step>`` atomically, update the index, apply retention. Returns its path.

        ``tmp_dir`` (from :meth:`begin`) may already hold files other replicas wrote (a sharded
        ``dcp/`` directory); they are hashed into the index like the chief's own files.
        """
        if not self.writer:
            raise CheckpointError("only the chief process writes checkpoints")
        name = f"ckpt-{step}"
        tmp = tmp_dir if tmp_dir is not None else self.begin(step)
        files: dict[str, str] = {}
        size = 0
        index_tmp: Path | None = None
        locked = False
        try:
            for extra in sorted(p for p in tmp.rglob("*") if p.is_file()):
                data = extra.read_bytes()
                files[extra.relative_to(tmp).as_posix()] = hashlib.sha256(data).hexdigest()
                size += len(data)
            blobs: list[tuple[str, bytes]] = []
            if model_state is not None:
                blobs.append((MODEL_FILE, model_state_to_bytes(model_state)))
            buf = io.BytesIO()
            torch.save(dict(train_state), buf)
            blobs.append((TRAIN_STATE_FILE, buf.getvalue()))
            for rank, state in sorted((input_states or {}).items()):
                ext, data = serialize_input_state(state)
                blobs.append((f"input-{rank}.{ext}", data))
            for fname, data in blobs:
                files[fname] = hashlib.sha256(data).hexdigest()
                size += len(data)
            # The index that will name this checkpoint is known now: its temporary file is
            # written and fsynced together with the checkpoint's files, and renamed into
            # place only once the checkpoint directory is. The index lock is held from this
            # read to that rename, so another writer's update (an evaluator's result) is
            # neither lost nor overwritten.
            lock = self.index_lock()
            lock.__enter__()
            locked = True
            index = self.index()
            records = [r for r in index["checkpoints"] if r["name"] != name]
            records.append({"name": name, "step": step, "time": time.time(), "bytes": size, "files": files, "metrics": {}})
            records.sort(key=lambda r: r["step"])
            index["checkpoints"] = records
            index["latest"] = name
            if index["best"] is not None and index["best"]["name"] == name:
                index["best"] = None  # the weights under this name changed; its old metric no longer applies
            removed = self._retain(index)
            index_path = self.model_dir / INDEX_NAME
            index_tmp = _temp_name(index_path)
            written = _write_all_durably(
                [(tmp / fname, data) for fname, data in blobs]
                + [(index_tmp, json.dumps(index, indent=1, sort_keys=True).encode())]
            )
            if written[: len(blobs)] != [files[fname] for fname, _ in blobs]:
                raise CheckpointError(f"ckpt-{step}: a file's sha256 changed while it was written")
            _fsync_dir(tmp)
            final = self.model_dir / name
            if final.exists():  # re-saving a step (e.g. after a resume): swap the old one out
                trash = self.model_dir / f".trash-{name}-{uuid.uuid4().hex[:8]}"
                os.replace(final, trash)
                os.replace(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _fsync_dir(self.model_dir)  # the checkpoint is in place before the index names it
            os.replace(index_tmp, index_path)
            _fsync_dir(self.model_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if index_tmp is not None:
                index_tmp.unlink(missing_ok=True)
            raise
        finally:
            if locked:
                lock.__exit__(None, None, None)
        self._remove(removed)
        return final

    def record_eval(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Attach evaluation results to ``ckpt-<step>``; returns whether it became the best.

        Returns False (and records nothing) when the index no longer names the checkpoint,
        e.g. retention removed it before an evaluator got to it.
        """
        if not self.writer:
            return False
        name = f"ckpt-{step}"
        kept = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and k != "global_step"}

        def attach(index: dict[str, Any]) -> bool:
            rec = next((r for r in index["checkpoints"] if r["name"] == name), None)
            if rec is None:
                return False
            rec["metrics"] = kept
            if self.keep_best is None:
                return False
            metric, mode = self.keep_best
            if metric not in kept:
                raise CheckpointError(
                    f"RunConfig.keep_best names metric {metric!r}, but evaluation returned only {sorted(kept)}"
                )
            value = kept[metric]
            best = index["best"]
            if value != value:  # NaN never becomes the best
                return False
            if best is None or (value < best["value"] if mode == "min" else value > best["value"]):
                index["best"] = {"name": name, "step": step, "metric": metric, "mode": mode, "value": value}
                return True
            return False

        return bool(self.update_index(attach))

    def _retain(self, index: dict[str, Any]) -> list[str]:
        """Drop from ``index`` the records retention no longer keeps; return their names."""
        records = index["checkpoints"]
        keep = {r["name"] for r in records}
        if self.keep_checkpoint_max > 0:
            keep = {r["name"] for r in records[-self.keep_checkpoint_max :]}
        if index["best"] is not None:
            keep.add(index["best"]["name"])
        keep.add(index["latest"])
        removed = [r["name"] for r in records if r["name"] not in keep]
        index["checkpoints"] = [r for r in records if r["name"] in keep]
        return removed

    def _remove(self, names: list[str]) -> None:
        # Delete only after the index no longer names them: a crash here leaves a harmless orphan.
        for name in names:
            shutil.rmtree(self.model_dir / name, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        """Remove temporary directories a crashed save left behind."""
        for p in self.model_dir.iterdir():
            if p.name.startswith((".tmp-ckpt-", ".trash-ckpt-")) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.startswith(f".{INDEX_NAME}.") and p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)

    # ---------------------------------------------------------------- load
    def resolve(self, checkpoint_path: str | os.PathLike[str] | None) -> Path | None:
        """A checkpoint directory from ``None`` (latest here), a model_dir, or a ``ckpt-<step>`` dir."""
        if checkpoint_path is None:
            return self.latest_path()
        p = Path(checkpoint_path)
        if (p / INDEX_NAME).exists():
            latest = CheckpointManager(p, writer=False).latest_path()
            if latest is None:
                raise CheckpointError(f"{p} holds no checkpoint yet")
            return latest
        if (p / MODEL_FILE).exists() or (p / "dcp").is_dir():
            return p
        raise CheckpointError(
            f"checkpoint_path {str(p)!r} is neither a model_dir (with {INDEX_NAME}) nor a "
            f"checkpoint directory (with {MODEL_FILE})"
        )

    def load(self, path: Path) -> LoadedCheckpoint:
        """Read and verify a checkpoint directory (``weights_only`` loading only)."""
        return load_checkpoint(path)


def _index_record(path: Path) -> dict[str, Any] | None:
    index_path = path.parent / INDEX_NAME
    if not index_path.exists():
        return None
    try:
        index = json.loads(index_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return next((r for r in index.get("checkpoints", []) if r["name"] == path.name), None)


def previous_retained(path: Path) -> str | None:
    index_path = path.parent / INDEX_NAME
    try:
        records = json.loads(index_path.read_text())["checkpoints"]
    except (OSError, json.JSONDecodeError, KeyError):
        return None
    earlier = [r for r in records if r["name"] != path.name and r["step"] < _step_of(path)]
    return str(path.parent / earlier[-1]["name"]) if earlier else None


def _step_of(path: Path) -> int:
    m = _CKPT_RE.match(path.name)
    return int(m.group(1)) if m else -1


def _read_verified(path: Path, fname: str, expected: Mapping[str, str] | None) -> bytes:
    file = path / fname
    try:
        data = file.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {file}: {e}") from e
    if expected is not None:
        want = expected.get(fname)
        got = hashlib.sha256(data).hexdigest()
        if want is None or got != want:
            raise safe_load.refused(
                str(path), fname, f"has sha256 {got[:12]}… but the index says {str(want)[:12]}…", previous_retained(path)
            )
    return data


def _read_decoded(path: Path, fname: str, expected: Mapping[str, str] | None) -> Any:
    """Read, verify and safely decode one file of a checkpoint."""
    return safe_load.decode(_read_verified(path, fname, expected), fname, str(path), previous_retained(path))


def load_checkpoint(path: str | os.PathLike[str]) -> LoadedCheckpoint:
    """Read a ``ckpt-<step>`` directory, verifying each file against its index entry."""
    path = Path(path)
    record = _index_record(path)
    expected = record["files"] if record else None
    if record is None:
        log.warning("checkpoint %s is not listed in an index: its files cannot be verified", path)
    else:
        missing = sorted(f for f in record["files"] if not (path / f).is_file())
        if missing:
            prev = previous_retained(path)
            hint = f"; delete the directory to resume from the previous retained checkpoint {prev!r}" if prev else ""
            raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {', '.join(missing)} missing{hint}")
    dcp_dir = path / "dcp"
    model_state = None
    if dcp_dir.is_dir():
        for f in sorted(p for p in dcp_dir.rglob("*") if p.is_file()):
            fname = f.relative_to(path).as_posix()
            if f.name == ".metadata":  # DCP itself unpickles it unrestricted: vet it first
                _read_decoded(path, fname, expected)
            else:
                _read_verified(path, fname, expected)
    else:
        model_state = _read_decoded(path, MODEL_FILE, expected)
    train_state: dict[str, Any] = {}
    if (path / TRAIN_STATE_FILE).exists():
        train_state = _read_decoded(path, TRAIN_STATE_FILE, expected)
        if not isinstance(train_state, dict):
            raise safe_load.refused(str(path), TRAIN_STATE_FILE, f"holds a {type(train_state).__name__}, not a dict", previous_retained(path))
    input_states: dict[int, Any] = {}
    for f in sorted(path.glob("input-*.*")):
        input_states[int(f.stem.split("-", 1)[1])] = _read_decoded(path, f.name, expected)
    step = int(train_state.get("global_step", record["step"] if record else _step_of(path)))
    return LoadedCheckpoint(path, step, model_state, train_state, input_states, dcp_dir if model_state is None else None)


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


# ---------------------------------------------------------------------------- warm start
@dataclass(kw_only=True)
class WarmStartSettings:
    """Initialise some weights from another run before training starts (TF's ``WarmStartSettings``).

    Attributes:
        ckpt_to_initialize_from: a model_dir, a ``ckpt-<step>`` directory or a ``.safetensors`` file.
        vars_to_warm_start: a regular expression (or list of them) selecting the model's
            parameter names to take; default all.
        var_name_to_prev_var_name: the name in the source for a model name, where they differ.
    """

    ckpt_to_initialize_from: str | os.PathLike[str]
    vars_to_warm_start: str | list[str] = ".*"
    var_name_to_prev_var_name: Mapping[str, str] = field(default_factory=dict)


@dataclass
class WarmStartReport:
    """Which weights a warm start took, and which it could not find or fit."""

    loaded: list[str]
    not_found: list[str]
    shape_mismatch: list[str]


def warm_start(model: nn.Module, settings: WarmStartSettings | str | os.PathLike[str]) -> WarmStartReport:
    """Copy matching weights from a checkpoint or safetensors file into ``model``."""
    if not isinstance(settings, WarmStartSettings):
        settings = WarmStartSettings(ckpt_to_initialize_from=settings)
    src = Path(settings.ckpt_to_initialize_from)
    if src.is_file() and src.suffix == ".safetensors":
        source = safe_load.decode(src.read_bytes(), src.name, str(src), None)
    else:
        resolved = CheckpointManager(src, writer=False).resolve(src) if src.exists() else None
        if resolved is None:
            raise CheckpointError(f"warm_start_from: {str(src)!r} does not exist")
        loaded = load_checkpoint(resolved)
        if loaded.model_state is not None:
            source = loaded.model_state
        else:
            from .distributed.sharded import consolidate

            source = consolidate(loaded.dcp_dir)  # type: ignore[arg-type]
    patterns = settings.vars_to_warm_start
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    selected = [re.compile(p) for p in patterns]
    own = model.state_dict()
    report = WarmStartReport([], [], [])
    updates: dict[str, torch.Tensor] = {}
    for name, tensor in own.items():
        if not any(p.fullmatch(name) for p in selected):
            continue
        prev = settings.var_name_to_prev_var_name.get(name, name)
        if prev not in source:
            report.not_found.append(name)
        elif source[prev].shape != tensor.shape:
            report.shape_mismatch.append(f"{name}: {list(source[prev].shape)} vs {list(tensor.shape)}")
        else:
            updates[name] = source[prev]
            report.loaded.append(name)
    model.load_state_dict(updates, strict=False)
    if report.not_found or report.shape_mismatch:
        log.warning(
            "warm start from %s: %d weights loaded, not found: %s, shape mismatch: %s",
            src, len(report.loaded), report.not_found or "none", report.shape_mismatch or "none",
        )
    else:
        log.info("warm start from %s: %d weights loaded", src, len(report.loaded))
    return report
