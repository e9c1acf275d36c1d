"""``ContinuousEvaluation``: evaluate the checkpoints of a ``model_dir`` while training writes them.

It runs in its own process (``Estimator.evaluate_continuously``, ``stoker evaluate --watch``),
beside the trainer and possibly on another device, so evaluation never stalls training.

*Iterate* and *step* are apart, as in the training loop: :meth:`ContinuousEvaluation.watch`
iterates the checkpoints to evaluate, waiting for new ones; and
:meth:`ContinuousEvaluation.evaluate_one` evaluates one and reports it. Two orders:

* ``"newest"`` (the default, TensorFlow's ``checkpoints_iterator``): when several checkpoints
  are pending, the newest is evaluated and the older ones are recorded as **superseded** (a
  flag on their index record and a count in the index's ``coverage``; logged once), so an
  evaluator slower than training keeps up and never works on what retention deletes next;
* ``"oldest"``: every pending checkpoint in step order (what retention keeps long enough).

While a checkpoint is read and evaluated, the evaluator holds a **lease** on it
(``stoker.checkpoint.lease``): retention keeps it until the lease ends, so no evaluation is
computed and then thrown away. After recording the result the evaluator releases the lease and
runs one retention pass itself, which deletes the checkpoint if nothing else keeps it.

The index is the whole state: a checkpoint whose record holds ``metrics`` is done, one marked
``superseded`` is never evaluated, so a killed evaluator that is started again carries on
without repeating an evaluation or a report, and needs no file of its own. The index's
``coverage`` counts, for the model_dir, the checkpoints evaluated, superseded, removed by
retention before an evaluator read them, and evaluated but discarded.

Two processes write the index, so every write goes through ``CheckpointManager.update_index``
/ ``record_eval`` under the index lock (``checkpoint.lock``). A result is recorded on its
checkpoint (feeding ``RunConfig.keep_best``: the best checkpoint is then kept by retention),
then logged as scalars at the checkpoint's step in ``model_dir/eval`` (TensorBoard events,
``metrics.csv``), only for checkpoints really evaluated.

The watch ends when training has finished (``finished.json``, written when training reaches
``max_steps``) and every checkpoint up to it is evaluated or superseded, when training stopped
early (``early_stop.json``) and nothing is pending, or when no new checkpoint came for
``timeout_secs``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import storage
from ..checkpoint.index import Best, CheckpointIndex, CheckpointRecord, Coverage, coverage_line
from ..checkpoint.lease import LEASE_STALE_AFTER, LeaseHolder, live_leases
from ..checkpoint.manager import CheckpointManager
from ..distributed import make_strategy
from ..errors import CheckpointError, ConfigError
from ..hooks.early_stopping import STOP_FILE, read_stop
from ..storage.stores import Location
from ..summary.writer import CSV_NAME, ScalarWriter
from .evaluation import EvaluationRun
from .inputs import InputFn, InputPlan
from .model_state import ModelState

log = logging.getLogger("stoker")

EVAL_SUBDIR = "eval"
ORDERS = ("newest", "oldest")


@dataclass(kw_only=True)
class ContinuousEvalConfig:
    """How a watching evaluator runs.

    Attributes:
        steps: batches per evaluation (``None``: all of ``input_fn``).
        timeout_secs: stop when no new checkpoint came for this long (``None``: wait until
            training has finished, however long).
        poll_secs: how often the index is read while waiting for a checkpoint
            (tf_cnn_benchmarks' ``--eval_interval_secs``).
        last_step: also stop once the checkpoint of this step is evaluated (and ignore a
            ``finished.json`` of an earlier step).
        summaries: write TensorBoard events and ``metrics.csv`` into ``model_dir/<subdir>``.
        subdir: where the scalars go, under ``model_dir``.
        order: ``"newest"``: when several checkpoints are pending, evaluate the newest and
            record the older ones as superseded; ``"oldest"``: every pending one, oldest first.
        lease_secs: hold a lease on the checkpoint being evaluated, renewed every fifth of
            this; retention breaks it after this long without renewal (``None``: no lease).
    """

    steps: int | None = None
    timeout_secs: float | None = 3600.0
    poll_secs: float = 1.0
    last_step: int | None = None
    summaries: bool = True
    subdir: str = EVAL_SUBDIR
    order: str = "newest"
    lease_secs: float | None = LEASE_STALE_AFTER

    def __post_init__(self) -> None:
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(f"evaluate_continuously: steps must be a positive integer or None; got {self.steps!r}")
        if self.timeout_secs is not None and not self.timeout_secs > 0:
            raise ConfigError(f"evaluate_continuously: timeout_secs must be > 0 or None; got {self.timeout_secs!r}")
        if not self.poll_secs > 0:
            raise ConfigError(f"evaluate_continuously: poll_secs must be > 0; got {self.poll_secs!r}")
        if self.last_step is not None and (not isinstance(self.last_step, int) or self.last_step < 0):
            raise ConfigError(
                f"evaluate_continuously: last_step must be a non-negative integer or None; got {self.last_step!r}"
            )
        if self.order not in ORDERS:
            raise ConfigError(f"evaluate_continuously: order must be 'newest' or 'oldest'; got {self.order!r}")
        if self.lease_secs is not None and not self.lease_secs > 0:
            raise ConfigError(f"evaluate_continuously: lease_secs must be > 0 or None; got {self.lease_secs!r}")


@dataclass
class ContinuousEvalResult:
    """What one watch did, and why it stopped.

    ``evaluated``: the steps it evaluated and recorded, in order; ``superseded``: the steps it
    passed over for a newer one (order ``"newest"``); ``skipped``: those it could not read
    (removed by retention before reading, or damaged); ``discarded``: evaluated, but the
    checkpoint was gone before the result could be recorded (never, while the lease holds).
    ``best``: the index's best checkpoint when it stopped. ``coverage``: the model_dir's totals
    over every evaluator (the index's ``coverage``: the steps ``evaluated``, ``superseded``,
    ``removed`` before reading, ``discarded``).
    """

    evaluated: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    results: dict[int, dict[str, float]] = field(default_factory=dict)
    stop_reason: str = ""
    best: Best | None = None
    superseded: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    coverage: Coverage | None = None

    def coverage_line(self) -> str:
        """``N evaluated, N superseded, N removed before reading, N discarded`` (model_dir totals)."""
        return coverage_line(self.coverage)


class ContinuousEvaluation:
    """Evaluates the new checkpoints of ``checkpoints.model_dir``: the newest, or each in step order.

    Args:
        evaluation: the ``EvaluationRun`` (its model is built on the device it should run on).
        checkpoints: the ``model_dir``'s manager, opened as a writer (results go into its index),
            with the trainer's ``keep_checkpoint_max`` and ``keep_best``.
        config: a ``ContinuousEvalConfig``.
        on_result: called as ``on_result(step, results)`` after each recorded evaluation.
    """

    def __init__(
        self,
        evaluation: EvaluationRun,
        checkpoints: CheckpointManager,
        config: ContinuousEvalConfig | None = None,
        on_result: Callable[[int, dict[str, float]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not checkpoints.writer:
            raise CheckpointError(
                "evaluate_continuously records results in the index: open the CheckpointManager as a writer"
            )
        self.evaluation = evaluation
        self.checkpoints = checkpoints
        self.config = config or ContinuousEvalConfig()
        self.on_result = on_result
        self._clock = clock
        self._writer: ScalarWriter | None = None
        self._logged_steps: set[int] | None = None
        self._passed: set[tuple[str, float]] = set()  # (name, save time): handled in this process
        self._lease: LeaseHolder | None = None
        if self.config.lease_secs is not None:
            self._lease = LeaseHolder(checkpoints.model_dir, self.config.lease_secs, checkpoints.retry)

    # ------------------------------------------------------------ iterate
    def watch(self, result: ContinuousEvalResult | None = None) -> Iterator[CheckpointRecord]:
        """Yield the index record of each checkpoint to evaluate (order ``"newest"``: the newest
        pending one, the older ones recorded as superseded; ``"oldest"``: each, oldest first),
        waiting for new ones until training has finished or ``timeout_secs`` passed without one."""
        cfg = self.config
        result = result if result is not None else ContinuousEvalResult()
        last_news = self._clock()
        waiting_logged = False
        while True:
            # The marker is read before the index: training writes its last checkpoint before
            # the marker, so an index read after seeing the marker names that checkpoint.
            finished = self.checkpoints.finished_step()
            if finished is not None and cfg.last_step is not None and finished < cfg.last_step:
                finished = None  # an earlier train() call's end (e.g. a warm-up), not the run's
            pending = self.pending()
            if pending:
                take = pending[0]
                if cfg.order == "newest" and len(pending) > 1:
                    take = pending[-1]
                    self._supersede(pending[:-1], take, result)
                self._passed.add(take.key)
                yield take
                last_news, waiting_logged = self._clock(), False
                continue
            if finished is not None:
                result.stop_reason = f"training finished at step {finished} and every checkpoint up to it is evaluated"
                return
            stopped = read_stop(self.checkpoints.model_dir)
            if stopped is not None:
                result.stop_reason = f"training stopped early at step {stopped['step']} ({STOP_FILE})"
                return
            if cfg.last_step is not None and self._done_through(cfg.last_step):
                result.stop_reason = f"the checkpoint of last_step={cfg.last_step} is evaluated"
                return
            if cfg.timeout_secs is not None and self._clock() - last_news >= cfg.timeout_secs:
                result.stop_reason = f"no new checkpoint for {cfg.timeout_secs:g} s"
                return
            if not waiting_logged:
                log.info("evaluator: waiting for a new checkpoint in %s", self.checkpoints.model_dir)
                waiting_logged = True
            time.sleep(cfg.poll_secs)

    def pending(self) -> list[CheckpointRecord]:
        """Index records without an evaluation, not superseded, that this process has not passed yet, by step."""
        records = self.checkpoints.records()
        todo = [r for r in records if not r.evaluated and not r.superseded and r.key not in self._passed]
        return sorted(todo, key=lambda r: r.step)

    def _supersede(self, older: list[CheckpointRecord], newest: CheckpointRecord, result: ContinuousEvalResult) -> None:
        """Record ``older`` as superseded by ``newest`` in the index (durably, in one write); log it once."""
        keys = {r.key for r in older}
        self._passed |= keys
        marked = self.checkpoints.update_index(lambda index: index.superseding(keys))
        if marked:
            log.info(
                "evaluator: %d checkpoint(s) behind; evaluating the newest, %s; superseded steps %s",
                len(marked),
                newest.name,
                marked,
            )
            result.superseded.extend(marked)

    def _done_through(self, step: int) -> bool:
        return any(r.step >= step and r.evaluated for r in self.checkpoints.records())

    # ------------------------------------------------------------ step
    def evaluate_one(
        self, input_fn: InputFn, record: CheckpointRecord, result: ContinuousEvalResult
    ) -> dict[str, float] | None:
        """Evaluate the checkpoint of ``record``, record and log the result; ``None`` if skipped."""
        name, step = record.name, record.step
        self._passed.add(record.key)
        if self._lease is not None and not self._take_lease(record):
            log.info("evaluator: %s was removed by retention before it was evaluated; skipped", name)
            result.skipped.append(step)
            return None
        try:
            path = self.checkpoints.model_dir / record.directory  # on an object store: its unique prefix
            self.evaluation.state.weights_of = None  # always read the files: a step saved again has new weights
            try:
                results, _ = self.evaluation.compute(input_fn, self.config.steps, path)
            except CheckpointError as e:
                if self._indexed(name):
                    # Still named by the index, so not retention's doing: a damaged checkpoint.
                    # The trainer resumes from an earlier one; evaluation goes on with the next.
                    log.warning("evaluator: %s cannot be evaluated, skipped: %s", name, e)
                else:
                    log.info("evaluator: %s was removed by retention before it was evaluated; skipped", name)
                result.skipped.append(step)
                return None
            # The index first (it is the evaluator's state), then the scalars, at most once per step.
            became_best = self.checkpoints.record_eval(step, results, coverage=True)
            if not became_best and not self._indexed(name):
                log.warning(
                    "evaluator: %s was removed by retention before its result was recorded; result discarded", name
                )
                result.discarded.append(step)
                return None
        finally:
            self._release_lease()
        self._log(step, results, became_best)
        result.evaluated.append(step)
        result.results[step] = results
        if self.on_result is not None:
            self.on_result(step, results)
        return results

    def _take_lease(self, record: CheckpointRecord) -> bool:
        """Lease ``record``'s checkpoint; False (no lease held) if retention removed it first.

        The lease is written first, then the index is updated (it must still name this very
        checkpoint): retention reads the leases after the index and writes the index
        conditionally or under its lock, so it either sees the lease or removed the checkpoint
        before this update, which then finds it gone (see ``stoker.checkpoint.lease``).
        """
        assert self._lease is not None
        self._lease.take(record)

        def change(index: CheckpointIndex) -> tuple[CheckpointIndex, bool]:
            return index.counting_coverage(), index.names(record.key)

        try:
            present = bool(self.checkpoints.update_index(change))
        except BaseException:
            self._lease.release()
            raise
        if not present:
            self._lease.release()
        return present

    def _release_lease(self) -> None:
        """End the lease and run one retention pass: what only the lease kept is deleted now."""
        if self._lease is None or self._lease.current is None:
            return
        self._lease.release()
        self.checkpoints.apply_retention()

    def run(self, input_fn: InputFn) -> ContinuousEvalResult:
        """Watch and evaluate until training has finished or the timeout; return what was done."""
        result = ContinuousEvalResult()
        if self._lease is not None:
            live_leases(self.checkpoints.model_dir, self.checkpoints.retry, who="evaluator")  # break dead ones
        try:
            for record in self.watch(result):
                self.evaluate_one(input_fn, record, result)
        finally:
            if self._lease is not None:
                self._lease.release()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        index = self.checkpoints.index()
        result.best, result.coverage = index.best, index.coverage
        log.info(
            "evaluator: stopped (%s); this evaluator evaluated %d checkpoint(s), superseded %d, skipped %d, "
            "discarded %d; model_dir totals: %s",
            result.stop_reason,
            len(result.evaluated),
            len(result.superseded),
            len(result.skipped),
            len(result.discarded),
            result.coverage_line(),
        )
        return result

    # ------------------------------------------------------------ reporting
    def _indexed(self, name: str) -> bool:
        return self.checkpoints.index().record(name) is not None

    def _log(self, step: int, results: dict[str, float], became_best: bool) -> None:
        scalars = {k: v for k, v in results.items() if k != "global_step"}
        keep_best = self.checkpoints.retention.keep_best
        log.info(
            "eval at step %d: %s%s",
            step,
            ", ".join(f"{k} = {v:.6g}" for k, v in scalars.items()),
            f" (best so far by {keep_best[0]})" if became_best and keep_best else "",
        )
        if not self.config.summaries:
            return
        logdir = self.checkpoints.model_dir / self.config.subdir
        if self._logged_steps is None:
            self._logged_steps = _logged_steps(logdir / CSV_NAME)
        if step in self._logged_steps:
            return  # an earlier evaluator of this model_dir logged it already
        if self._writer is None:
            self._writer = ScalarWriter(logdir, tensorboard=True)
        self._writer.write(step, scalars, prefix="eval/")
        self._writer.flush()
        self._logged_steps.add(step)


def _logged_steps(path: Location) -> set[int]:
    """Steps ``metrics.csv`` already has rows for; a torn last line (a kill mid-write) is ended."""
    if not storage.exists(path):
        return set()
    data = storage.read_bytes(path)
    if data and not data.endswith(b"\n") and isinstance(path, Path):
        with open(path, "ab") as f:  # so the next row starts on a line of its own
            f.write(b"\n")
    steps: set[int] = set()
    for row in csv.DictReader(io.StringIO(data.decode(errors="replace"), newline="")):
        try:
            steps.add(int(row["step"]))
        except (TypeError, ValueError):
            continue
    return steps


def watching(
    evaluation: EvaluationRun,
    config: ContinuousEvalConfig,
    *,
    device: str | None = None,
    on_result: Callable[[int, dict[str, float]], None] | None = None,
) -> ContinuousEvaluation:
    """``Estimator.evaluate_continuously``'s evaluator: ``evaluation``'s model_dir watched by this one
    process, evaluating on ``device`` (``None``: where ``evaluation`` runs)."""
    checkpoints = evaluation.state.checkpoints
    if checkpoints is None:
        raise ConfigError("evaluate_continuously: the Estimator needs RunConfig.model_dir (the directory to watch)")
    if evaluation.strategy.world_size > 1:
        raise ConfigError(
            "evaluate_continuously runs in one process: start it without torchrun (device= picks its device)"
        )
    return ContinuousEvaluation(evaluation_on_device(evaluation, device), checkpoints, config, on_result=on_result)


def evaluation_on_device(evaluation: EvaluationRun, device: str | None) -> EvaluationRun:
    """``evaluation``, or a copy of its components on ``device`` (one replica, no optimizer)."""
    state, inputs = evaluation.state, evaluation.inputs
    if device is None or device == evaluation.config.device:
        return evaluation
    strategy = make_strategy("single", device)  # one replica: no collective to time out
    new_state = ModelState(
        model=state.model_arg,
        params=state.params,
        config=dataclasses.replace(state.config, cuda_graph=False),  # graphs: training only
        precision=state.precision.fresh(),
        strategy=strategy,
        checkpoints=state.checkpoints,
    )
    new_inputs = InputPlan(
        params=inputs.params,
        config=inputs.config,
        strategy=strategy,
        train_batch_size=inputs.train_batch_size,
        eval_batch_size=inputs.eval_batch_size,
        predict_batch_size=inputs.predict_batch_size,
    )
    config = dataclasses.replace(evaluation.config, device=device)
    return EvaluationRun(new_state, new_inputs, evaluation.model_fn, config=config)


__all__ = [
    "EVAL_SUBDIR",
    "ContinuousEvalConfig",
    "ContinuousEvalResult",
    "ContinuousEvaluation",
    "ORDERS",
    "evaluation_on_device",
    "watching",
]
