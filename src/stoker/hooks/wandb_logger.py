"""``WandbLogger``: a training run logged to Weights & Biases, one W&B run across kills.

wandb is imported when the hook starts, never before (``pip install 'stoker[wandb]'``). W&B
cannot take back a step it has received, and its offline mode cannot be asked what it has: the
hook records the last step it sent in ``model_dir/wandb_sent.json`` (written atomically after
each send), and a resumed run continues the same W&B run (``resume="allow"`` with the run id
from the checkpoint) sending only steps after it. See docs/callbacks.md.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import RunContext
from .tracking import Point, Tracker, TrackerHook, missing_extra

SENT_FILE = "wandb_sent.json"


class WandbLogger(TrackerHook):
    """Log params (as the run's config), training loss and rates every ``every_n_steps``, every
    evaluation (``eval/<name>``) and the final and best checkpoints (an artifact) to W&B.

    Args:
        project, entity, name, group, tags, mode, dir: handed to ``wandb.init`` (``mode="offline"``
            or ``WANDB_MODE=offline`` logs to local files, synced later with ``wandb sync``).
        every_n_steps: how often training values are logged (default ``log_every_n_steps``).
        log_checkpoints: log the final and best checkpoints as a W&B artifact at the end.
        init_kwargs: more ``wandb.init`` arguments.
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
        self.run = self.wandb.init(id=run_id, resume="allow", config=dict(params) or None, **self.init_kwargs)
        # A resumed cloud run knows the next step it expects; offline runs know nothing: our record.
        self.sent_step = int(getattr(self.run, "starting_step", 0) or 0) - 1
        if self.sent_file is not None and self.sent_file.exists():
            found = json.loads(self.sent_file.read_text())
            if found.get("run_id") == run_id:
                self.sent_step = max(self.sent_step, int(found["step"]))
        return run_id

    def last_steps(self, keys: set[str]) -> dict[str, int]:
        return dict.fromkeys(keys, self.sent_step)

    def log(self, points: list[Point]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for key, value, step, _ in points:
            by_step.setdefault(step, {})[key] = value
        for step in sorted(by_step):  # W&B takes steps in increasing order only
            self.run.log(by_step[step], step=step)
        self.sent_step = max(self.sent_step, max(by_step))
        if self.sent_file is not None:
            tmp = self.sent_file.with_name(f".{SENT_FILE}.{uuid.uuid4().hex}.tmp")
            tmp.write_text(json.dumps({"run_id": self.run.id, "step": self.sent_step}))
            os.replace(tmp, self.sent_file)

    def log_artifacts(self, directory: Path, name: str) -> None:
        artifact = self.wandb.Artifact(f"{self.run.id}-{directory.name}", type="model")
        artifact.add_dir(str(directory))
        self.run.log_artifact(artifact, aliases=[directory.name])

    def finish(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


__all__ = ["WandbLogger"]
