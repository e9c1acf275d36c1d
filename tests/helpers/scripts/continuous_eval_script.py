"""A trainer or a watching evaluator on one model_dir, run as real processes by
tests/engine/test_continuous_eval.py (not a test module).

``--role train`` trains the tiny classifier to ``--max_steps`` with a checkpoint every
``--save_steps`` steps; ``--role evaluate`` watches the same model_dir and appends each step it
evaluated to ``--evaluated_log`` (one line per evaluation, flushed and fsynced). Both keep
``--keep`` checkpoints and the best by accuracy. ``--no_lock`` replaces the index lock by
nothing (the mutation check: the tests must then fail). ``--order`` is the evaluator's order
(default ``oldest`` here: tests/test_continuous_eval.py checks that every retained checkpoint is
evaluated); ``--eval_sleep`` makes each evaluation batch slow (tests/test_evaluator_lease.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
import stoker.checkpoint  # noqa: E402  (its commit protocols are patched below)
from helpers.tiny import classifier_fn, eval_input, make_data, make_estimator, train_input  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=("train", "evaluate"), required=True)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--save_steps", type=int, default=2)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per training step / per eval batch")
    p.add_argument("--evaluated_log", default=None)
    p.add_argument("--timeout_secs", type=float, default=60.0)
    p.add_argument("--no_lock", action="store_true")
    p.add_argument("--order", choices=("newest", "oldest"), default="oldest", help="the evaluator's order")
    p.add_argument("--wait_for", default=None, help="train: start once this file exists (imports done before)")
    p.add_argument("--eval_sleep", type=float, default=0.0, help="seconds per eval batch (a slow evaluator)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if os.environ.get("STOKER_SHARED_STORE"):  # tests/shared_store.py: a store with a lock object
        from helpers import shared_store

        shared_store.register()
    if args.no_lock:
        for protocol in stoker.checkpoint.commit.PROTOCOLS:  # every index update takes the protocol's lock
            protocol.lock = lambda self: contextlib.nullcontext()  # type: ignore[method-assign]
    est = make_estimator(
        args.model_dir,
        iterations_per_loop=1,
        save_checkpoints_steps=args.save_steps,
        keep_checkpoint_max=args.keep,
        keep_best=("accuracy", "max"),
        summaries=args.role == "evaluate",
    )

    def slow_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
        time.sleep(args.eval_sleep if mode == stoker.ModeKeys.EVAL and args.eval_sleep else args.sleep)
        # slows the run (so the processes overlap); changes no number
        return classifier_fn(model, features, labels, mode, params)

    est.model_fn = slow_fn
    if args.role == "train":
        while args.wait_for and not os.path.exists(args.wait_for):
            time.sleep(0.01)
        x, y = make_data(100)
        est.train(train_input(x, y), max_steps=args.max_steps)
        print(f"trained {est.global_step}", flush=True)
        return
    x, y = make_data(64, seed=1)

    def record(step: int, results: dict[str, float]) -> None:
        if args.evaluated_log:
            with open(args.evaluated_log, "a") as f:
                f.write(f"{os.getpid()} {step} {results['accuracy']!r}\n")
                f.flush()
                os.fsync(f.fileno())

    print("watching", flush=True)  # the Estimator is built: the watch starts now
    result = est.evaluate_continuously(
        eval_input(x, y), timeout_secs=args.timeout_secs, poll_secs=0.02, on_result=record, order=args.order
    )
    print(f"stopped: {result.stop_reason}; evaluated {result.evaluated}; skipped {result.skipped}", flush=True)
    print(f"superseded {result.superseded}; discarded {result.discarded}; totals {result.coverage_line()}", flush=True)


if __name__ == "__main__":
    main()
