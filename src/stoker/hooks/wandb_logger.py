"""``WandbLogger``: a training run logged to Weights & Biases, one W&B run across kills.

wandb is imported when the hook starts, never before (``pip install 'stoker[wandb]'``). W&B
cannot take back a step it has received. A resumed run continues the same W&B run
(``resume="allow"`` with the run id from the checkpoint) sending only steps after the newest one
W&B has: offline, the newest step in the run's ``.wandb`` files on disk (W&B's service buffers
what it is sent and loses it on kill -9, so what was sent is not what W&B has); online, the
larger of the server's ``starting_step`` and the last step sent, recorded in
``model_dir/wandb_sent.json`` (written atomically after each send). See docs/callbacks.md.
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import RunContext
from .tracking import Point, Tracker, TrackerHook, missing_extra

SENT_FILE = "wandb_sent.json"
# How often W&B's service writes what it was sent to the .wandb file (its default, 15 s, would
# leave a kill -9 most of the points of the last interval to lose).
FLUSH_INTERVAL_S = 0.2


class WandbLogger(TrackerHook):
    """Log params (as the run's config), training loss and rates every ``every_n_steps``, every
    evaluation (``eval/<name>``) and the final and best checkpoints (an artifact) to W&B.

    Args:
        project, entity, name, group, tags, mode, dir: handed to ``wandb.init`` (``mode="offline"``
            or ``WANDB_MODE=offline`` logs to local files, synced later with ``wandb sync``).
        every_n_steps: how often training values are logged (default ``log_every_n_steps``).
        log_checkpoints: log the final and best checkpoints as a W&B artifact at the end.
        init_kwargs: more ``wandb.init`` arguments. Without ``settings``, the hook passes
            ``wandb.Settings(x_transaction_log_flush_interval=0.2)`` so that W&B's service writes
            what it is sent to disk within 0.2 s (a kill -9 loses what it has not written).
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,  # noqa: A002 - wandb.init's name
        every_n_steps: int | None = None,
        log_checkpoints: bool = True,
        **init_kwargs: Any,
    ) -> None:
        super().__init__(every_n_steps, log_checkpoints)
        self.init_kwargs: dict[str, Any] = dict(
            project=project, entity=entity, name=name, group=group, tags=tags, mode=mode, dir=dir, **init_kwargs
        )

    def _open(self, run: RunContext) -> Tracker:
        sent = Path(run.model_dir) / SENT_FILE if run.model_dir is not None and "://" not in run.model_dir else None
        return _Wandb({k: v for k, v in self.init_kwargs.items() if v is not None}, sent)


class _Wandb(Tracker):
    unsure_s = 50 * FLUSH_INTERVAL_S  # generous: the service may be starved of CPU

    def __init__(self, init_kwargs: dict[str, Any], sent_file: Path | None) -> None:
        try:
            import wandb
        except ImportError as e:
            raise missing_extra("wandb", "wandb", "WandbLogger") from e
        self.wandb = wandb
        self.init_kwargs, self.sent_file = init_kwargs, sent_file
        self.run: Any = None
        self.sent_step = -1

    def start(self, run_id: str | None, params: Mapping[str, str]) -> str:
        run_id = run_id or uuid.uuid4().hex[:12]
        kwargs = dict(self.init_kwargs)
        if "settings" not in kwargs and "x_transaction_log_flush_interval" in self.wandb.Settings.model_fields:
            kwargs["settings"] = self.wandb.Settings(x_transaction_log_flush_interval=FLUSH_INTERVAL_S)
        self.run = self.wandb.init(id=run_id, resume="allow", config=dict(params) or None, **kwargs)
        if self.run.offline:  # what the earlier processes' files hold (a kill loses what was unwritten)
            self.sent_step = max(offline_steps(Path(self.run.dir).parents[1], run_id), default=-1)
            return run_id
        # A resumed cloud run knows the next step it expects; our record may know a later one.
        self.sent_step = int(getattr(self.run, "starting_step", 0) or 0) - 1
        if self.sent_file is not None and self.sent_file.exists():
            found = json.loads(self.sent_file.read_text())
            if found.get("run_id") == run_id:
                self.sent_step = max(self.sent_step, int(found["step"]))
        return run_id

    def last_steps(self, keys: set[str]) -> dict[str, int]:
        return dict.fromkeys(keys, self.sent_step)

    def log_params(self, params: Mapping[str, str]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log(self, points: list[Point]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for key, value, step, _ in points:
            by_step.setdefault(step, {})[key] = value
        for step in sorted(by_step):  # W&B takes steps in increasing order only
            self.run.log(by_step[step], step=step)
        self.sent_step = max(self.sent_step, max(by_step))
        if self.sent_file is not None and not self.run.offline:
            tmp = self.sent_file.with_name(f".{SENT_FILE}.{uuid.uuid4().hex}.tmp")
            tmp.write_text(json.dumps({"run_id": self.run.id, "step": self.sent_step}))
            os.replace(tmp, self.sent_file)

    def log_artifacts(self, directory: Path, name: str) -> None:
        artifact = self.wandb.Artifact(f"{self.run.id}-{directory.name}", type="model")
        artifact.add_dir(str(directory))
        self.run.log_artifact(artifact, aliases=[directory.name])

    def finish(self, ok: bool, interrupted: bool = False) -> None:
        self.run.finish(exit_code=0 if ok else 1)


def offline_records(path: Path) -> list[Any]:
    """The ``wandb_internal_pb2.Record`` protobufs of one offline ``.wandb`` file, as far as it
    was written: W&B's LevelDB-style log (32 KiB blocks; records in pieces of 7-byte headers
    ``crc32, length, kind``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    records: list[Any] = []
    data, pos, buf = path.read_bytes(), 7, b""
    if data[:4] != b":W&B":
        return records
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):  # cut short by a kill
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module
            record.ParseFromString(buf)
            records.append(record)
            buf = b""
    return records


def offline_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of run ``run_id`` under ``wandb_dir``, oldest first: one per process
    (or start) that logged it, in ``offline-run-<time>-<id>``, or ``offline-run-<time>-<id>-<n>``
    when W&B found that folder there already (two starts within one second)."""
    folder = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    found = []
    for path in wandb_dir.glob(f"offline-run-*/run-{glob.escape(run_id)}.wandb"):
        if m := folder.fullmatch(path.parent.name):
            found.append(((m[1], int(m[2] or 0)), path))
    return [path for _, path in sorted(found)]


def offline_history(wandb_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """The history rows of run ``run_id`` in every offline directory under ``wandb_dir`` (one per
    process that logged it), oldest first."""
    rows = []
    for path in offline_files(wandb_dir, run_id):
        for record in offline_records(path):
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def offline_steps(wandb_dir: Path, run_id: str) -> list[int]:
    return [int(row["_step"]) for row in offline_history(wandb_dir, run_id) if "_step" in row]


__all__ = ["WandbLogger", "offline_files", "offline_history", "offline_records"]
