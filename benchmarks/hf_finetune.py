"""The Hugging Face fine-tuning example under stoker, a plain PyTorch loop and HF's ``Trainer``.

The model, data and batches of ``examples/finetune_hf.py`` (a 2-layer DistilBERT of width 64 made
from a config, the standard library's docstring sentences, batches of 32 tokenised to 32 tokens by
``stoker.hf.Tokenize``), with dropout off, so that every runner computes the same thing and the
loss curves can be compared step by step. Every runner starts from the same initial weights and
reads the same batches in the same order (the order of ``stoker.hf.hf_dataset`` with
``ReadOptions(seed=0)``), with AdamW at a constant 1e-3, no clipping, fp32, one thread:

- ``plain``: a hand-written loop over those batches (``dataset[indices]``, the collate, forward
  with the labels, backward, step, ``zero_grad``), the baseline of every ratio;
- ``stoker``: ``Estimator.train`` with ``stoker.hf.model_fn`` on ``stoker.hf.hf_dataset``, no
  ``model_dir`` (nothing written, as the others), ``iterations_per_loop=10``, no log lines;
- ``stoker+ckpt``: the example's own settings, a ``model_dir`` with a checkpoint every 50 steps
  (each durable: files fsynced) and the final one;
- ``trainer``: ``transformers.Trainer`` (if it imports: it needs accelerate) over the same
  examples in the same order (a sequential sampler over them), the same collate, ``save_strategy="no"``,
  ``report_to="none"``, ``lr_scheduler_type="constant"``, ``max_grad_norm=0``.

Each runner is timed from building its optimizer to the end of training (the model is built
and loaded with the shared initial weights before the clock starts). The runners take turns
round by round, in an order that rotates, so the load of a shared machine hits them alike; the
figures are the medians over the rounds of examples/sec and of each round's ratio to ``plain``.
The loss curves are recorded in every round (without a host sync per step) and compared with
``plain``'s: the largest difference over the steps is printed.

    python benchmarks/hf_finetune.py [--steps 200] [--rounds 5] [--out results.json]

The runners return dicts; printing is a separate step.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import finetune_hf  # noqa: E402
from transformers import AutoModelForSequenceClassification  # noqa: E402

import stoker  # noqa: E402
import stoker.hf as hf  # noqa: E402
from stoker.data import ReadOptions  # noqa: E402
from stoker.hooks import Hook  # noqa: E402

BATCH = 32
LEARNING_RATE = 1e-3

Setup = dict[str, Any]
Runner = Callable[[Setup, int], dict[str, Any]]


def setup(data_dir: Path) -> Setup:
    """The example's tokenizer and training set, the model config without dropout, the shared
    initial weights and the batches' example indices in stoker's order."""
    tokenizer, train, _ = finetune_hf.prepare(data_dir)
    config = finetune_hf.small_config(tokenizer)
    config.dropout = config.attention_dropout = config.seq_classif_dropout = 0.0
    torch.manual_seed(0)
    initial = AutoModelForSequenceClassification.from_config(config).state_dict()
    collate = hf.Tokenize(tokenizer=tokenizer, max_length=finetune_hf.MAX_LENGTH)
    source = hf.hf_dataset(train, read=ReadOptions(seed=0, batch_size=BATCH), collate=collate)
    return {"config": config, "initial": initial, "train": train, "collate": collate, "source": source}


def batch_indices(s: Setup, steps: int) -> list[list[int]]:
    source = s["source"]
    return [source.batch_indices(*divmod(step, source.batches_per_epoch)).tolist() for step in range(steps)]


def fresh_model(s: Setup) -> torch.nn.Module:
    model = AutoModelForSequenceClassification.from_config(s["config"])
    model.load_state_dict(s["initial"])
    return model.train()


def run_plain(s: Setup, steps: int) -> dict[str, Any]:
    model, train, collate = fresh_model(s), s["train"], s["collate"]
    order = batch_indices(s, steps)
    losses: list[torch.Tensor] = []
    start = time.perf_counter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    for indices in order:
        features, labels = collate(train[indices])
        loss = model(**features, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "losses": torch.stack(losses).tolist()}


class _Losses(Hook):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_loop(self, run, result):  # noqa: ANN001
        self.losses.extend(result.losses)


def stoker_runner(checkpoints: bool) -> Runner:
    def run(s: Setup, steps: int) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="hf_finetune-") as tmp:
            est = stoker.Estimator(
                model=fresh_model(s),
                model_fn=hf.model_fn,
                optimizer=lambda params, parameters: torch.optim.AdamW(parameters, lr=LEARNING_RATE),
                config=stoker.RunConfig(
                    model_dir=tmp if checkpoints else None,
                    save_checkpoints_steps=50 if checkpoints else None,
                    iterations_per_loop=10,
                    log_every_n_steps=None,
                    progress_bar=False,
                    summaries=checkpoints,
                ),
                train_batch_size=BATCH,
            )
            data = s["train"]

            def input_fn(params: dict) -> hf.HFDatasetSource:
                return hf.hf_dataset(data, read=ReadOptions(seed=0).for_replica(params), collate=s["collate"])

            losses = _Losses()
            start = time.perf_counter()
            est.train(input_fn, max_steps=steps, hooks=[losses])
            seconds = time.perf_counter() - start
        return {"seconds": seconds, "losses": losses.losses}

    return run


def trainer_runner() -> Runner | None:
    """``Trainer`` over the same examples in the same order, or ``None`` when it does not import."""
    try:
        from torch.utils.data import SequentialSampler
        from transformers import PrinterCallback, Trainer, TrainingArguments
    except ImportError:
        return None

    class SameOrder(Trainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.step_losses: list[torch.Tensor] = []

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> SequentialSampler:
            return SequentialSampler(self.train_dataset)

        def compute_loss(self, model, inputs, *args: Any, **kwargs: Any):  # noqa: ANN001, ANN201
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            self.step_losses.append((loss[0] if isinstance(loss, tuple) else loss).detach())
            return loss

    def run(s: Setup, steps: int) -> dict[str, Any]:
        collate, model = s["collate"], fresh_model(s)
        ordered = s["train"].select([i for batch in batch_indices(s, steps) for i in batch])

        def collator(rows: list[dict[str, Any]]) -> dict[str, Any]:
            features, labels = collate({key: [row[key] for row in rows] for key in rows[0]})
            return {**features, "labels": labels}

        with tempfile.TemporaryDirectory(prefix="hf_finetune-trainer-") as tmp:
            args = TrainingArguments(
                output_dir=tmp, max_steps=steps, per_device_train_batch_size=BATCH, learning_rate=LEARNING_RATE,
                lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=0.0, save_strategy="no",
                report_to="none", logging_strategy="no", disable_tqdm=True, use_cpu=True, seed=0,
                dataloader_num_workers=0, remove_unused_columns=False,
            )  # fmt: skip
            optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
            trainer = SameOrder(
                model=model, args=args, train_dataset=ordered, data_collator=collator, optimizers=(optimizer, None)
            )
            trainer.remove_callback(PrinterCallback)  # its end-of-training dict, printed
            start = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - start
        return {"seconds": seconds, "losses": torch.stack(trainer.step_losses).tolist()}

    return run


def benchmark(steps: int, rounds: int, data_dir: Path) -> dict[str, Any]:
    """Every runner ``rounds`` times, interleaved; medians of examples/sec and of the paired ratios."""
    torch.set_num_threads(1)
    logging.getLogger("stoker").setLevel(logging.WARNING)
    s = setup(data_dir)
    runners: dict[str, Runner] = {
        "plain": run_plain,
        "stoker": stoker_runner(checkpoints=False),
        "stoker+ckpt": stoker_runner(checkpoints=True),
    }
    trainer = trainer_runner()
    if trainer is not None:
        runners["trainer"] = trainer
    names = list(runners)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # the order rotates
            runs[name].append(runners[name](s, steps))
    return summarise(runs, steps)


def summarise(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    plain = runs["plain"]
    out: dict[str, Any] = {"steps": steps, "batch": BATCH, "rounds": len(plain), "runners": {}}
    for name, results in runs.items():
        rates = [steps * BATCH / r["seconds"] for r in results]
        ratios = [p["seconds"] / r["seconds"] for p, r in zip(plain, results, strict=True)]
        curve = results[0]["losses"]
        out["runners"][name] = {
            "examples_per_sec": statistics.median(rates),
            "ratio_to_plain": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "max_loss_difference": max(abs(a - b) for a, b in zip(curve, plain[0]["losses"], strict=True)),
            "loss_first_last": [curve[0], curve[-1]],
        }
    return out


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['steps']} steps of batch {result['batch']}, {result['rounds']} interleaved rounds (medians)",
        f"{'runner':<12} {'examples/s':>10} {'x plain':>8} {'min-max':>12} {'loss 1st/last':>16} {'max |dloss|':>11}",
    ]
    for name, r in result["runners"].items():
        first, last = r["loss_first_last"]
        lines.append(
            f"{name:<12} {r['examples_per_sec']:>10.1f} {r['ratio_to_plain']:>8.3f} "
            f"{r['ratio_min']:>5.3f}-{r['ratio_max']:<6.3f} {first:>7.4f}/{last:<8.4f} "
            f"{r['max_loss_difference']:>11.2e}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data_dir", help="where the example's data and tokenizer are made (default: a temporary one)")
    parser.add_argument("--out", help="also write the result as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf_finetune-data-") as tmp:
        result = benchmark(args.steps, args.rounds, Path(args.data_dir or tmp))
    print(report(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
