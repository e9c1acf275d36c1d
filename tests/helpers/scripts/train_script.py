"""A training job run as a real subprocess by the crash tests (not a test module)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.mixes import mixed_input  # noqa: E402
from helpers.stops import install_from_env  # noqa: E402
from helpers.stores import slow_checkpoint_writes  # noqa: E402
from helpers.tiny import classifier_fn, make_data, make_estimator, train_input  # noqa: E402


def slow_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    time.sleep(params["sleep"])  # slows the run so a kill lands mid-way; changes no number
    return classifier_fn(model, features, labels, mode, params)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--async_checkpoints", action="store_true")
    p.add_argument("--slow_write", type=float, default=0.0, help="seconds each checkpoint file write sleeps first")
    p.add_argument("--ema", type=float, default=None, help="RunConfig(ema=EMA(decay=..., start_step=5))")
    p.add_argument("--mix", choices=["batch", "example"], help="train on a mixture of two sources, mixed per ...")
    args = p.parse_args()
    install_from_env()  # a stop the test armed (helpers/stops.py)
    if args.slow_write:  # widens the window in which a kill lands inside a checkpoint write
        slow_checkpoint_writes(args.slow_write)
    torch.set_num_threads(1)
    x, y = make_data(100)
    est = make_estimator(
        args.model_dir,
        iterations_per_loop=2,
        save_checkpoints_steps=3,
        precision=args.precision,
        params={"sleep": args.sleep},
        log_every_n_steps=5,
        checkpoint_io=stoker.CheckpointIO(async_save=args.async_checkpoints),
        ema=None if args.ema is None else stoker.EMA(decay=args.ema, start_step=5),
    )
    est.model_fn = slow_fn
    est.train(mixed_input(x, y, per=args.mix) if args.mix else train_input(x, y), max_steps=args.max_steps)
    print(f"done {est.global_step}", flush=True)
    assert isinstance(est, stoker.Estimator)


if __name__ == "__main__":
    main()
