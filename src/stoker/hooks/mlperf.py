"""MLPerf-style logging hook: ``:::MLLOG`` events of a run and a CSV of evaluations (opt-in).

:class:`MLPerfLogHook` writes the MLPerf training log events of a run (``run_start``,
``epoch_start`` / ``epoch_stop``, ``eval_start`` / ``eval_stop``, ``eval_accuracy``,
``run_stop``) as ``:::MLLOG {json}`` lines. It uses the ``mlperf-logging`` package's ``mllog``
when it is installed and otherwise writes the same lines itself, so a compliance checker or
a log parser reads either. Given an ``estimator`` and an ``eval_input_fn`` it also runs the
evaluations (MLPerf times them inside the run), appends one row per evaluated checkpoint to
a CSV, and with a ``target`` stops training once the accuracy reaches it ("time to train").

:func:`evaluate_checkpoints` does the same after the fact: it evaluates every retained
checkpoint of a model_dir and writes the same CSV rows (the seed's ``write_to_csv`` of a
validation run).

This module is engine-side (``RunConfig(mlperf_log=True)`` adds the hook): it does not import
the Estimator; the hook and :func:`evaluate_checkpoints` need only what :class:`Evaluates`
describes.
"""

from __future__ import annotations

import csv
import inspect
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from .. import storage
from ..checkpoint.manager import CheckpointManager
from ..errors import ConfigError
from .base import Hook, LoopResult, RunContext, every_n_steps_due, next_due_step

log = logging.getLogger("stoker")

InputFn = Callable[[dict[str, Any]], Iterable[Any]]


class Evaluates(Protocol):
    """What the hook and :func:`evaluate_checkpoints` use of a ``stoker.Estimator``
    (a Protocol, not the class: the Estimator imports the hooks)."""

    global_step: int

    @property
    def model_dir(self) -> str | None: ...

    def evaluate(
        self, input_fn: InputFn, steps: int | None = None, checkpoint_path: str | os.PathLike[str] | None = None
    ) -> Mapping[str, Any]: ...


# The MLPerf keys (the values of mlperf_logging.mllog.constants).
RUN_START, RUN_STOP = "run_start", "run_stop"
EPOCH_START, EPOCH_STOP = "epoch_start", "epoch_stop"
EVAL_START, EVAL_STOP, EVAL_ACCURACY = "eval_start", "eval_stop", "eval_accuracy"
GLOBAL_BATCH_SIZE, SEED, SUBMISSION_BENCHMARK = "global_batch_size", "seed", "submission_benchmark"
DEFAULT_LOG_NAME = "mlperf.log"
DEFAULT_CSV_NAME = "eval_results.csv"


class MLLogger:
    """``:::MLLOG`` lines to a file: through ``mlperf_logging.mllog`` when installed, else written
    here in the same format (``namespace``, ``time_ms``, ``event_type``, ``key``, ``value``,
    ``metadata`` with the caller's ``file`` and ``lineno``)."""

    def __init__(self, path: str | os.PathLike[str], *, use_mllog: bool | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._mllog: Any = None
        if use_mllog is not False:
            try:
                from mlperf_logging import mllog  # optional dependency
            except ImportError:
                if use_mllog:
                    raise
            else:
                mllog.config(filename=str(self.path))
                self._mllog = mllog.get_mllogger()
        self._file: IO[str] | None = None if self._mllog is not None else open(self.path, "a")  # noqa: SIM115 - closed in close()

    @property
    def backend(self) -> str:
        return "mlperf_logging.mllog" if self._mllog is not None else "stoker"

    def start(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        self._log("INTERVAL_START", key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        self._log("INTERVAL_END", key, value, metadata)

    def event(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        self._log("POINT_IN_TIME", key, value, metadata)

    def _log(self, event_type: str, key: str, value: Any, metadata: Mapping[str, Any] | None) -> None:
        if self._mllog is not None:
            method = {"INTERVAL_START": self._mllog.start, "INTERVAL_END": self._mllog.end}.get(
                event_type, self._mllog.event
            )
            method(key=key, value=value, metadata=dict(metadata or {}))
            return
        caller = inspect.stack(context=0)[2]  # who called start/end/event, as mllog records it
        record = {
            "namespace": "",
            "time_ms": int(time.time() * 1000),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": {"file": os.path.basename(caller.filename), "lineno": caller.lineno, **(metadata or {})},
        }
        assert self._file is not None
        self._file.write(":::MLLOG " + json.dumps(record) + "\n")
        self._file.flush()  # a killed run keeps every line written so far

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_mllog(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of an MLPerf log file (lines starting with ``:::MLLOG``)."""
    records = []
    for line in Path(path).read_text().splitlines():
        if line.startswith(":::MLLOG "):
            records.append(json.loads(line[len(":::MLLOG ") :]))
    return records


# ==================================================================== per-checkpoint CSV
class EvalCSV:
    """Appends one row per evaluation to a CSV, the header written with the first row.

    Columns come from the first row; a later row with other keys is refused (a CSV whose
    columns change half-way is unreadable), as is appending to a file with another header.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fields: list[str] | None = None
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="") as f:
                self._fields = next(csv.reader(f), None)

    def write(self, row: Mapping[str, Any]) -> None:
        keys = list(row)
        if self._fields is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerow(keys)
            self._fields = keys
        elif keys != self._fields:
            raise ConfigError(f"{self.path} has columns {self._fields}; this row has {keys}: write it to another file")
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow([_cell(row[k]) for k in keys])

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))


def _cell(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def _counting(input_fn: InputFn, counter: list[int]) -> InputFn:
    """``input_fn`` whose batches' rows are added to ``counter[0]`` (before any padding)."""
    from ..data._tree import batch_rows

    def wrapped(params: dict[str, Any]) -> Iterator[Any]:
        for item in input_fn(params):
            features = item[0] if isinstance(item, (tuple, list)) and len(item) == 2 else item
            counter[0] += batch_rows(features) or 0
            yield item

    return wrapped


def _timed_evaluation(
    estimator: Evaluates,
    input_fn: InputFn,
    *,
    steps: int | None,
    checkpoint_path: str | os.PathLike[str] | None,
    steps_per_epoch: int | None,
) -> dict[str, Any]:
    """Evaluate once; return a CSV row: checkpoint, step, epoch, metrics, time and throughput."""
    counter = [0]
    start = time.perf_counter()
    results = estimator.evaluate(_counting(input_fn, counter), steps=steps, checkpoint_path=checkpoint_path)
    seconds = time.perf_counter() - start
    step = int(results["global_step"])
    row: dict[str, Any] = {"checkpoint": f"ckpt-{step}", "step": step}
    row["epoch"] = step / steps_per_epoch if steps_per_epoch else ""
    row.update({k: v for k, v in results.items() if k != "global_step"})
    row.update(eval_seconds=seconds, examples=counter[0], examples_per_sec=counter[0] / seconds if seconds > 0 else 0.0)
    return row


def _epoch_num(step: int, steps_per_epoch: int | None) -> int:
    """MLPerf's 1-based ``epoch_num`` of the epoch that contains ``step`` (1 without epochs)."""
    return 1 + (max(step - 1, 0) // steps_per_epoch if steps_per_epoch else 0)


# ==================================================================== the hook
class MLPerfLogHook(Hook):
    """Log a training run as MLPerf events; optionally evaluate, record a CSV and stop at a target.

    Args:
        path: the log file (default ``model_dir/mlperf.log``; appended to, so a resumed run
            continues the same file).
        estimator, eval_input_fn, eval_every_n_steps, eval_steps: run an evaluation every
            ``eval_every_n_steps`` (on a checkpoint written for it) and at the end, logged as
            ``eval_start`` / ``eval_stop`` / ``eval_accuracy`` and written to ``csv_path``.
            Use this instead of ``train_and_evaluate`` (not together with it).
        accuracy_key: the evaluation result logged as ``eval_accuracy``.
        target: stop training when ``accuracy_key`` reaches it (``>=``; with
            ``lower_is_better``, ``<=``); ``run_stop`` then says ``success``.
        steps_per_epoch: how many steps make an epoch for ``epoch_start`` / ``epoch_stop``
            (``None``: the whole ``train`` call is one epoch).
        benchmark: the ``submission_benchmark`` value.
        csv_path: default ``model_dir/eval_results.csv``.
    """

    # After the checkpoint saver and EvaluationHook (its run_stop comes after the final evaluation),
    # before logging; its own evaluations (estimator=) act like decisions: a target stops training.
    phase = "decisions"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        estimator: Evaluates | None = None,
        eval_input_fn: InputFn | None = None,
        eval_every_n_steps: int | None = None,
        eval_steps: int | None = None,
        accuracy_key: str = "accuracy",
        target: float | None = None,
        lower_is_better: bool = False,
        steps_per_epoch: int | None = None,
        benchmark: str = "stoker",
        csv_path: str | os.PathLike[str] | None = None,
        use_mllog: bool | None = None,
    ) -> None:
        if (eval_input_fn is None) != (estimator is None):
            raise ConfigError("MLPerfLogHook: give both estimator= and eval_input_fn= to evaluate, or neither")
        if eval_every_n_steps is not None and eval_every_n_steps < 1:
            raise ConfigError(f"MLPerfLogHook: eval_every_n_steps must be >= 1; got {eval_every_n_steps}")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ConfigError(f"MLPerfLogHook: steps_per_epoch must be >= 1; got {steps_per_epoch}")
        if target is not None and estimator is None:
            raise ConfigError("MLPerfLogHook: a target needs evaluations (estimator= and eval_input_fn=)")
        self.path = path
        self.estimator = estimator
        self.eval_input_fn = eval_input_fn
        self.eval_every_n_steps = eval_every_n_steps
        self.eval_steps = eval_steps
        self.accuracy_key = accuracy_key
        self.target = target
        self.lower_is_better = lower_is_better
        self.steps_per_epoch = steps_per_epoch
        self.benchmark = benchmark
        self.csv_path = csv_path
        self.use_mllog = use_mllog
        self.logger: MLLogger | None = None
        self.table: EvalCSV | None = None
        self.last_results: dict[str, Any] | None = None
        self.reached_target = False
        self._open_epoch: int | None = None
        self._last_eval_step = 0
        self._stopped = False

    def begin(self, run: RunContext) -> None:
        if not run.is_chief:
            return
        base = Path(run.model_dir) if run.model_dir else Path.cwd()
        self.logger = MLLogger(self.path or base / DEFAULT_LOG_NAME, use_mllog=self.use_mllog)
        if self.estimator is not None:
            self.table = EvalCSV(self.csv_path or base / DEFAULT_CSV_NAME)

    def after_setup(self, run: RunContext) -> None:
        self._last_eval_step = run.global_step
        if self.logger is None:
            return
        self.logger.event(SUBMISSION_BENCHMARK, self.benchmark)
        self.logger.event(GLOBAL_BATCH_SIZE, run.global_batch_size)
        self.logger.event(SEED, run.info.seed)
        self.logger.start(RUN_START, metadata={"step": run.global_step, "resumed": run.global_step > 0})

    def before_loop(self, run: RunContext, steps: int) -> None:
        if self.logger is not None and self._open_epoch is None:
            self._open_epoch = _epoch_num(run.global_step + 1, self.steps_per_epoch)
            self.logger.start(EPOCH_START, metadata={"epoch_num": self._open_epoch, "step": run.global_step})

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self.logger is not None and self.steps_per_epoch and self._open_epoch is not None:
            # The loop may have crossed an epoch boundary: close the epoch it started in
            # (loops are the granularity at which the host sees the step count).
            if _epoch_num(run.global_step + 1, self.steps_per_epoch) != self._open_epoch:
                self._close_epoch(run)
        if (
            self.estimator is not None
            and self.eval_every_n_steps
            and every_n_steps_due(self._last_eval_step, run.global_step, self.eval_every_n_steps)
        ):
            self._evaluate(run)

    def scheduled_after(self, step: int) -> int | None:
        if self.estimator is None or not self.eval_every_n_steps:
            return None
        return next_due_step(step, self.eval_every_n_steps)

    def end(self, run: RunContext) -> None:
        if run.interrupted:  # a signal: the rerun evaluates where an uninterrupted run would
            self._close_epoch(run)
            self._stop("aborted", run.global_step)
            return
        if self.estimator is not None and (self.last_results is None or self.last_results["step"] != run.global_step):
            self._evaluate(run)
        self._close_epoch(run)
        if self.target is None:
            self._stop("success", run.global_step)
        else:
            self._stop("success" if self.reached_target else "aborted", run.global_step)

    def close(self) -> None:
        if not self._stopped and self.logger is not None:  # an exception ended training
            self._stop("aborted", None)
        if self.logger is not None:
            self.logger.close()

    def _close_epoch(self, run: RunContext) -> None:
        if self.logger is not None and self._open_epoch is not None:
            self.logger.end(EPOCH_STOP, metadata={"epoch_num": self._open_epoch, "step": run.global_step})
        self._open_epoch = None

    def _stop(self, status: str, step: int | None) -> None:
        if self.logger is not None and not self._stopped:
            self.logger.end(RUN_STOP, metadata={"status": status, "step": step})
        self._stopped = True

    def _evaluate(self, run: RunContext) -> None:
        assert self.estimator is not None and self.eval_input_fn is not None
        run.save_checkpoint()  # the evaluation is of a checkpoint, recorded in the index
        self._last_eval_step = run.global_step
        meta = {"epoch_num": _epoch_num(run.global_step, self.steps_per_epoch), "step": run.global_step}
        if self.logger:
            self.logger.start(EVAL_START, metadata=meta)
        self.estimator.global_step = run.global_step
        row = _timed_evaluation(
            self.estimator,
            self.eval_input_fn,
            steps=self.eval_steps,
            checkpoint_path=None,
            steps_per_epoch=self.steps_per_epoch,
        )
        self.last_results = row
        if self.logger:
            self.logger.end(EVAL_STOP, metadata=meta)
            if self.accuracy_key in row:
                self.logger.event(EVAL_ACCURACY, value=row[self.accuracy_key], metadata=meta)
        if self.table is not None:
            self.table.write(row)
        value = row.get(self.accuracy_key)
        if self.target is not None and value is not None:
            hit = value <= self.target if self.lower_is_better else value >= self.target
            if hit and not self.reached_target:
                self.reached_target = True
                run.request_stop(f"{self.accuracy_key} = {value:.6g} reached the target {self.target}")


def evaluate_checkpoints(
    estimator: Evaluates,
    input_fn: InputFn,
    csv_path: str | os.PathLike[str] | None = None,
    *,
    steps: int | None = None,
    steps_per_epoch: int | None = None,
    logger: MLLogger | None = None,
    accuracy_key: str = "accuracy",
) -> list[dict[str, Any]]:
    """Evaluate every retained checkpoint of ``estimator``'s model_dir, oldest first; append a
    row per checkpoint to ``csv_path`` (default ``model_dir/eval_results.csv``) and, with a
    ``logger``, log ``eval_start`` / ``eval_stop`` / ``eval_accuracy`` for each. Returns the rows."""
    if not estimator.model_dir:
        raise ConfigError("evaluate_checkpoints: the Estimator has no model_dir")
    manager = CheckpointManager(estimator.model_dir, writer=False)
    table = EvalCSV(csv_path or Path(estimator.model_dir) / DEFAULT_CSV_NAME)
    rows = []
    for rec in manager.records():
        path = manager.model_dir / rec.directory
        if not storage.is_dir(path):
            continue
        meta = {"epoch_num": _epoch_num(rec.step, steps_per_epoch), "step": rec.step}
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


__all__ = [
    "DEFAULT_CSV_NAME",
    "DEFAULT_LOG_NAME",
    "EvalCSV",
    "Evaluates",
    "MLLogger",
    "MLPerfLogHook",
    "evaluate_checkpoints",
    "read_mllog",
]
