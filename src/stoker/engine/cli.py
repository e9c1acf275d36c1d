"""The ``stoker evaluate [--watch] MODEL_DIR`` command.

The model_dir's ``run_spec.json`` says how its Estimator and its held-out data are built (the
builders a recipe registers with ``stoker.run_spec.register_run_spec`` and
``register_eval_input``, found through the ``stoker.run_spec`` entry points). Without ``--watch`` it
evaluates one checkpoint (the newest, or ``--checkpoint``) and records the result; with
``--watch`` it is the evaluator that runs beside training (:class:`stoker.engine.ContinuousEvaluation`).
See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import storage
from ..errors import FlagError, StokerError
from ..flags import add_flags, check_values, field_flags, given_values, option
from ..hooks.early_stopping import EarlyStopping
from ..run_spec import RUN_SPEC_FILE, estimator_from_model_dir, eval_input_from_run_spec
from . import evaluation_on_device
from .evaluator import ORDERS

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def add_parser(subparsers: Any) -> None:
    """Register ``stoker evaluate [--watch] MODEL_DIR``."""
    p = subparsers.add_parser(
        "evaluate",
        help="evaluate a model_dir's checkpoints; --watch: each new one as training writes it",
        description="Evaluate the checkpoints of a model_dir written by a stoker recipe (it needs "
        f"{RUN_SPEC_FILE}) on the recipe's held-out data, and record each result on its checkpoint "
        "in the index (keep_best chooses from it). --watch runs beside training until training has "
        "finished or --timeout_secs pass without a new checkpoint: by default it evaluates the newest "
        "checkpoint and records the older pending ones as superseded (--order oldest: each in step "
        "order), holding a lease so retention never deletes the checkpoint it evaluates. "
        "See docs/evaluation.md.",
    )
    p.add_argument("model_dir", help=f"a model_dir with {RUN_SPEC_FILE} (written when its training starts)")
    add_flags(p, field_flags(EvaluateFlags), style="argparse")
    p.set_defaults(func=_evaluate_command)


@dataclass(kw_only=True)
class EvaluateFlags:
    """``stoker evaluate``'s flags, declared once (:mod:`stoker.flags`: the parser and the checks)."""

    watch: bool = option(False, "keep evaluating each new checkpoint until training has finished")
    device: str | None = option(None, "auto, cpu, cuda or cuda:N (default: the device the run's recipe names)")
    steps: int | None = option(None, "batches per evaluation (default: the recipe's eval_steps)", minimum=1)
    checkpoint: str | None = option(None, "without --watch: a ckpt-<step> directory (default: the newest)")
    timeout_secs: float = option(
        3600.0, "--watch: stop after this long without a new checkpoint; default %(default)s", above=0
    )
    poll_secs: float = option(2.0, "--watch: how often to look for a new checkpoint; default %(default)s", above=0)
    last_step: int | None = option(
        None,
        "--watch: also stop once the checkpoint of this step is evaluated, and ignore a "
        "finished.json of an earlier step (continuing a finished run to a larger max_steps)",
        minimum=0,
    )
    order: str = option(
        "newest",
        "--watch: newest (default): when several checkpoints are pending, evaluate the newest and "
        "record the older ones as superseded, so a slow evaluator keeps up; oldest: evaluate every "
        "pending checkpoint in step order (those retention deletes first are lost)",
        choices=ORDERS,
    )
    early_stopping: str | None = option(
        None,
        "--watch: stop training when MONITOR (an evaluation metric) has not improved for PATIENCE "
        "evaluations (MODE auto, min or max; default auto:3:0, auto reads the name: loss min, accuracy max): "
        "the evaluator writes early_stop.json into MODEL_DIR and the trainer stops at its next checkpoint "
        "(docs/callbacks.md)",
        metavar="MONITOR[:MODE[:PATIENCE[:MIN_DELTA]]]",
    )


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.device is not None and not _DEVICE.match(args.device):
        return f"--device must be auto, cpu, cuda or cuda:N; got {args.device!r}"
    try:
        check_values(EvaluateFlags(**given_values(EvaluateFlags, args)))
    except FlagError as e:
        return str(e)
    if args.last_step is not None and not args.watch:
        return "--last_step applies only with --watch"
    if args.order != "newest" and not args.watch:
        return "--order applies only with --watch"
    if args.early_stopping is not None:
        if not args.watch:
            return "--early_stopping applies only with --watch"
        try:
            EarlyStopping.parse(args.early_stopping)
        except StokerError as e:
            return str(e)
    if args.watch and args.checkpoint is not None:
        return "--checkpoint evaluates one checkpoint; it cannot be used with --watch"
    if not args.watch and not storage.exists(storage.location(args.model_dir)):
        # --watch may start before training has made the directory; one evaluation may not
        return f"MODEL_DIR {args.model_dir!r} does not exist"
    return None


def _evaluate_command(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem:
        print(f"stoker evaluate: {problem}", file=sys.stderr)
        return 2
    try:
        if args.watch:
            _wait_for_run_spec(Path(args.model_dir), args.timeout_secs, args.poll_secs)
        est, _, spec = estimator_from_model_dir(args.model_dir)
        input_fn, steps = eval_input_from_run_spec(spec, args.model_dir)
        steps = args.steps or steps
        if args.watch:
            on_result = _early_stopping(args.early_stopping, est)
            result = est.evaluate_continuously(
                input_fn,
                steps,
                args.timeout_secs,
                poll_secs=args.poll_secs,
                last_step=args.last_step,
                device=args.device,
                order=args.order,
                on_result=on_result,
            )
            best = result.best
            print(
                f"stoker evaluate: stopped ({result.stop_reason}); evaluated steps {result.evaluated or 'none'}, "
                f"superseded {result.superseded or 'none'}, skipped {result.skipped or 'none'} "
                f"(removed by retention first), discarded {result.discarded or 'none'}; "
                f"model_dir totals: {result.coverage_line()}"
                + (f"; best {best.name} with {best.metric} = {best.value:.6g}" if best else "")
            )
            return 0
        evaluation = evaluation_on_device(est.evaluation, args.device)
        results = evaluation.run(input_fn, steps, args.checkpoint)
    except (StokerError, ValueError) as e:
        print(f"stoker evaluate: {e}", file=sys.stderr)
        return 1
    shown = ", ".join(f"{k} = {v:.6g}" for k, v in results.items() if k != "global_step")
    print(f"evaluated step {results['global_step']:.0f} of {args.model_dir}: {shown}")
    return 0


def _early_stopping(spec: str | None, est: Any) -> Callable[[int, dict[str, float]], None] | None:
    """``--early_stopping``'s ``on_result``, its state rebuilt from the evaluations already
    recorded in the index (a restarted evaluator decides as if it had never stopped)."""
    if spec is None:
        return None
    early = EarlyStopping.parse(spec)
    records = est.state.checkpoints.records() if est.state.checkpoints is not None else []
    early.replay((r.step, r.metrics) for r in records if r.evaluated)
    return early.evaluator_callback(est.model_dir)


def _wait_for_run_spec(model_dir: Path, timeout: float, poll: float) -> None:
    """An evaluator may start before the trainer has written ``run_spec.json``: wait for it."""
    deadline = time.monotonic() + timeout
    while not (model_dir / RUN_SPEC_FILE).exists() and time.monotonic() < deadline:
        time.sleep(poll)


__all__ = ["EvaluateFlags", "add_parser"]
