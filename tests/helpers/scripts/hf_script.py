"""A Hugging Face fine-tuning job run by tests/hf as real processes, one per replica (not a test module).

Trains the tiny DistilBERT classifier of helpers/hf on its labelled sentences (an HF dataset read
by stoker.hf.hf_dataset), evaluates and predicts, then writes the model as a save_pretrained folder (every replica calls
it; sharded weights are gathered) and a JSON of the losses, the evaluation, the predictions and the weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker.hf as hf  # noqa: E402
from helpers import hf as tiny  # noqa: E402
from stoker.hooks import Hook  # noqa: E402


class LossLog(Hook):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_loop(self, run, result):  # noqa: ANN001
        self.losses.extend(result.losses)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir")
    p.add_argument("--max_steps", type=int, default=6)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--hf_out", help="write the save_pretrained folder here at the end")
    p.add_argument("--out", help="write losses, predictions and weights here (JSON)")
    args = p.parse_args()
    torch.set_num_threads(1)
    data, tok = tiny.dataset(48), tiny.tokenizer()
    est = tiny.classifier(
        args.model_dir,
        model=hf.from_config(AutoModelForSequenceClassification, tiny.tiny_config(dropout=0.0)),
        save_checkpoints_steps=2,
        progress_bar=False,
        strategy=args.strategy,
        distributed_timeout=120.0,
    )
    losses = LossLog()
    est.train(tiny.input_fn(data, tok), max_steps=args.max_steps, hooks=[losses])
    evaluation = est.evaluate(tiny.input_fn(data, tok, train=False))
    predictions = [r["logits"].tolist() for r in est.predict(tiny.input_fn(data, tok, train=False))]
    if args.hf_out:
        hf.save_pretrained(est, args.hf_out, tokenizer=tok)
    full = est.model_state_dict()  # collective when sharded
    if est.strategy.is_chief and args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "losses": losses.losses,
                    "evaluation": evaluation,
                    "predictions": predictions,
                    "weights": {k: v.tolist() for k, v in full.items()},
                    "world_size": est.strategy.world_size,
                }
            )
        )
    est.strategy.teardown()


if __name__ == "__main__":
    main()
