"""A job run by the pipeline tests as real processes (not a test module): a small sequential
classifier trained, evaluated and used to predict, pipelined when WORLD_SIZE > 1."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.pipeline import make_model  # noqa: E402
from helpers.stops import install_from_env  # noqa: E402
from helpers.tiny import classifier_fn, make_data  # noqa: E402
from stoker.hooks import Hook  # noqa: E402


class LossLog(Hook):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.host: list[float] = []

    def after_loop(self, run, result):  # noqa: ANN001
        self.losses.extend(result.losses)
        self.host.extend(result.values.get("mean_logit", []))


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    if params["sleep"]:
        time.sleep(params["sleep"])
    spec = classifier_fn(model, features, labels, mode, params)
    if mode == stoker.ModeKeys.TRAIN:
        spec.host_call = {"mean_logit": spec.predictions["logits"].mean()}
    return spec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--split", default="1,2,3")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--per_process", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--recompute", default=None)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--out")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()
    install_from_env()  # a stop the test armed (helpers/stops.py)
    torch.set_num_threads(1)
    x, y = make_data(203)
    est = stoker.Estimator(
        model=make_model,
        model_fn=model_fn,
        optimizer=lambda params, parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
        lr_schedule=lambda params, opt: torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5),
        config=stoker.RunConfig(
            model_dir=args.model_dir,
            iterations_per_loop=2,
            save_checkpoints_steps=2,
            progress_bar=False,
            distributed_timeout=args.timeout,
            log_every_n_steps=10**6,
            gradient_clip_norm=args.clip,
            pipeline=stoker.PipelineConfig(
                split=tuple(f"{int(i)}" for i in args.split.split(",")),
                microbatches=args.micro,
                schedule=args.schedule,
                stages_per_process=args.per_process,
            ),
            recompute=args.recompute,
            precision=args.precision,
        ),
        params={"sleep": args.sleep},
        train_batch_size=args.batch,
        eval_batch_size=16,
    )

    def train_input(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(params))

    def eval_input(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params))

    losses = LossLog()
    est.train(train_input, max_steps=args.max_steps, hooks=[losses])
    metrics = est.evaluate(eval_input)
    preds = [r["logits"].tolist() for r in est.predict(eval_input)]
    if est.strategy.world_size > 1 and args.recompute == "all":  # each stage recomputes its whole forward
        from stoker.memory.recompute import recomputed_modules

        assert all(recomputed_modules(s) == [""] for s in est.strategy.runtime.stages)
    full = est.model_state_dict()
    if est.strategy.is_chief and args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "losses": losses.losses,
                    "host": losses.host,
                    "metrics": metrics,
                    "predictions": preds,
                    "weights": {k: v.tolist() for k, v in full.items()},
                    "world_size": est.strategy.world_size,
                }
            )
        )
    est.strategy.teardown()


if __name__ == "__main__":
    main()
