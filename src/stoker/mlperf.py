"""MLPerf-style tools: evaluate every checkpoint of a model_dir into a CSV, after the fact.

:func:`evaluate_checkpoints` evaluates every retained checkpoint of a model_dir and writes the
same CSV rows as :class:`MLPerfLogHook` does while training (the seed's ``write_to_csv`` of a
validation run).

The hook, the ``:::MLLOG`` writer and the CSV live in :mod:`stoker.hooks.mlperf` (the engine
adds the hook for ``RunConfig(mlperf_log=True)``); their names are re-exported here, so
``from stoker.mlperf import MLPerfLogHook`` keeps working. Neither module imports the Estimator:
they use what :class:`~stoker.hooks.mlperf.Evaluates` describes of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointManager
from .hooks.mlperf import (
    DEFAULT_CSV_NAME,
    DEFAULT_LOG_NAME,
    EVAL_ACCURACY,
    EVAL_START,
    EVAL_STOP,
    EvalCSV,
    Evaluates,
    InputFn,
    MLLogger,
    MLPerfLogHook,
    _epoch_num,
    _timed_evaluation,
    read_mllog,
)


def evaluate_checkpoints(estimator: Evaluates, input_fn: InputFn, csv_path: str | os.PathLike[str] | None = None, *,
                         steps: int | None = None, steps_per_epoch: int | None = None,
                         logger: MLLogger | None = None, accuracy_key: str = "accuracy") -> list[dict[str, Any]]:
    """Evaluate every retained checkpoint of ``estimator``'s model_dir, oldest first; append a
    row per checkpoint to ``csv_path`` (default ``model_dir/eval_results.csv``) and, with a
    ``logger``, log ``eval_start`` / ``eval_stop`` / ``eval_accuracy`` for each. Returns the rows."""
    if not estimator.model_dir:
        raise ValueError("evaluate_checkpoints: the Estimator has no model_dir")
    manager = CheckpointManager(estimator.model_dir, writer=False)
    table = EvalCSV(csv_path or Path(estimator.model_dir) / DEFAULT_CSV_NAME)
    rows = []
    for rec in manager.records():
        path = manager.model_dir / rec["name"]
        if not path.is_dir():
            continue
        meta = {"epoch_num": _epoch_num(rec["step"], steps_per_epoch), "step": rec["step"]}
        if logger:
            logger.start(EVAL_START, metadata=meta)
        row = _timed_evaluation(estimator, input_fn, steps=steps, checkpoint_path=path, steps_per_epoch=steps_per_epoch)
        if logger:
            logger.end(EVAL_STOP, metadata=meta)
            if accuracy_key in row:
                logger.event(EVAL_ACCURACY, value=row[accuracy_key], metadata=meta)
        table.write(row)
        rows.append(row)
    return rows


__all__ = ["DEFAULT_CSV_NAME", "DEFAULT_LOG_NAME", "EvalCSV", "Evaluates", "MLLogger", "MLPerfLogHook",
           "evaluate_checkpoints", "read_mllog"]
