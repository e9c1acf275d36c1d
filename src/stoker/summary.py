"""Scalar summaries of a run: TensorBoard events and a ``metrics.csv`` beside them.

``metrics.csv`` has one row per value (``step,wall_time,tag,value``), so new tags (eval
metrics, host_call values) never change its columns, and it reads with any CSV tool.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CSV_NAME = "metrics.csv"
EVENTS_DIR = "events"


class ScalarWriter:
    """Appends scalars to ``model_dir/events`` (TensorBoard) and ``model_dir/metrics.csv``."""

    def __init__(self, model_dir: str | os.PathLike[str], tensorboard: bool = True) -> None:
        self.model_dir = Path(model_dir)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is a dependency, but keep training if it is broken
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(log_dir=str(self.model_dir / EVENTS_DIR))
        path = self.model_dir / CSV_NAME
        new = not path.exists() or path.stat().st_size == 0
        self._csv_file = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._csv = csv.writer(self._csv_file)
        if new:
            self._csv.writerow(["step", "wall_time", "tag", "value"])

    def write(self, step: int, scalars: Mapping[str, float], prefix: str = "") -> None:
        now = time.time()
        for tag, value in scalars.items():
            full = f"{prefix}{tag}"
            self._csv.writerow([step, f"{now:.3f}", full, repr(float(value))])
            if self._tb is not None:
                self._tb.add_scalar(full, float(value), step, walltime=now)

    def flush(self) -> None:
        self._csv_file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self.flush()
        self._csv_file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics_csv(model_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of ``metrics.csv`` as dicts with ``step`` (int), ``tag`` and ``value`` (float)."""
    path = Path(model_dir) / CSV_NAME
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [
            {"step": int(r["step"]), "wall_time": float(r["wall_time"]), "tag": r["tag"], "value": float(r["value"])}
            for r in csv.DictReader(f)
        ]
