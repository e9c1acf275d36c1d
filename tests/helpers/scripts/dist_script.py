"""A job run by the distributed tests as real processes, one per replica (not a test module)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.stops import install_from_env  # noqa: E402
from helpers.tiny import TinyNet, classifier_fn, make_data  # noqa: E402
from stoker.hooks import Hook  # noqa: E402


class SleepAt(Hook):
    """Sleep ``seconds`` at the first loop boundary at or past ``step`` on replica ``rank`` only."""

    def __init__(self, rank: int, step: int, seconds: float) -> None:
        self.rank, self.step, self.seconds, self.done = rank, step, seconds, False

    def after_loop(self, run, result):  # noqa: ANN001
        if not self.done and run.global_step >= self.step and stoker.distributed.torchrun_rank() == self.rank:
            self.done = True
            time.sleep(self.seconds)


class LossLog(Hook):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.thirds: list[float] = []

    def after_loop(self, run, result):  # noqa: ANN001
        self.losses.extend(result.losses)
        self.thirds.extend(result.values["third"])


def slow_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    if params["sleep"]:
        time.sleep(params["sleep"])
    if mode == "train" and params["hang"] is not None:  # (rank, step, seconds): that replica hangs there
        params["calls"] = params.get("calls", 0) + 1
        rank, step, seconds = params["hang"]
        if params["replica_index"] == rank and params["calls"] == step:
            time.sleep(seconds)
    spec = classifier_fn(model, features, labels, mode, params)
    if mode == "train":  # a host_call value, averaged over replicas like the loss
        spec.host_call = {"third": spec.loss / 3}
    return spec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--opt", default="sgd")
    p.add_argument("--out")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--hang", type=float, nargs=3, help="rank, step, seconds: that replica sleeps in that step")
    p.add_argument("--stuck_min_seconds", type=float, default=20.0)
    p.add_argument("--hook_sleep", type=float, nargs=3, help="rank, step, seconds: a hook sleeps there")
    p.add_argument("--ema", type=float, default=None, help="RunConfig(ema=EMA(decay=..., start_step=3))")
    args = p.parse_args()
    install_from_env()  # a stop the test armed (helpers/stops.py)
    torch.set_num_threads(1)
    x, y = make_data(203)

    def optimizer(params, parameters):  # noqa: ANN001, ANN202
        if args.opt == "sgd":
            return torch.optim.SGD(parameters, lr=0.1)
        return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)

    est = stoker.Estimator(
        model=lambda params: TinyNet(dropout=0.0),
        model_fn=slow_fn,
        optimizer=optimizer,
        config=stoker.RunConfig(
            model_dir=args.model_dir,
            iterations_per_loop=2,
            save_checkpoints_steps=2,
            progress_bar=False,
            distributed_timeout=args.timeout,
            stuck_replica=stoker.distributed.StuckReplica(factor=20.0, min_seconds=args.stuck_min_seconds),
            strategy=args.strategy,
            log_every_n_steps=10**6,
            ema=None if args.ema is None else stoker.EMA(decay=args.ema, start_step=3),
        ),
        params={
            "sleep": args.sleep,
            "hang": None if args.hang is None else [int(args.hang[0]), int(args.hang[1]), args.hang[2]],
        },
        train_batch_size=16,
        eval_batch_size=16,
    )

    def train_input(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(params))

    def eval_input(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params))

    losses = LossLog()
    hooks: list[Hook] = [losses]
    if args.hook_sleep is not None:
        hooks.append(SleepAt(int(args.hook_sleep[0]), int(args.hook_sleep[1]), args.hook_sleep[2]))
    est.train(train_input, max_steps=args.max_steps, hooks=hooks)
    metrics = est.evaluate(eval_input)
    preds = [int(r["classes"]) for r in est.predict(eval_input)]
    full = est.model_state_dict()  # collective when sharded
    if est.strategy.is_chief and args.out:
        weights = {k: v.tolist() for k, v in full.items()}
        Path(args.out).write_text(
            json.dumps(
                {
                    "losses": losses.losses,
                    "thirds": losses.thirds,
                    "metrics": metrics,
                    "predictions": preds,
                    "weights": weights,
                    "world_size": est.strategy.world_size,
                }
            )
        )
    est.strategy.teardown()


if __name__ == "__main__":
    main()
