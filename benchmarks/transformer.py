r"""BERT training on this CPU: the ``bert`` recipe against a plain PyTorch loop, side by side (issue 41).

The CPU counterpart of ``make gpu-check``'s BERT rows (``benchmarks/gpu_check.py``, whose plain
loop this script runs: ``gpu_check.plain_bert_step``), at a size two CPU cores train in a few
seconds per row. Every row trains the same shape (``--hidden``, ``--layers``, ``--heads``,
``--intermediate``, ``--seq_len``, ``--batch``) in the same process and run:

- ``plain``: BERT as a PyTorch user writes it: token and position embeddings, an
  ``nn.TransformerEncoder`` (post-norm, GELU, dropout 0.1; its attention is
  ``scaled_dot_product_attention``), BERT's MLM head (dense, GELU, LayerNorm, decoder), the loss
  over 15 % of the positions in fp32, AdamW (weight decay 0.01, none on biases and LayerNorm
  weights; torch's default foreach kernel on CPU, as the recipe's), gradient clipping at 1.0.
- ``stoker sdpa`` / ``stoker math``: ``stoker train bert`` (``RECIPE.build_estimator`` on a
  ``BertConfig`` of that shape) trained by ``Estimator.train`` with ``--attention sdpa`` (torch's
  ``scaled_dot_product_attention``) or ``math`` (the attention written out, its weights a saved
  tensor).
- ``plain compiled`` (``torch.compile`` of the plain model) and ``stoker compiled`` (the recipe
  with ``--compile module``, sdpa; ``--compile step`` compiles its whole step instead, ``none``
  leaves both rows out). Inductor compiles the forward and backward to C++ on a CPU: about half
  a minute per model on two busy cores the first time, seconds from its on-disk cache after.

Printed: examples/sec of each row, its ratio to ``plain`` (a compiled row: to ``plain compiled``
as well), and sdpa / math; first, each model's training FLOPs per step (``torch.utils.flop_counter``):
equal, or the line says DIFFERENT WORK. ``--json`` writes the figures.

Timing: each row first trains ``--warmup`` untimed steps (compilation, the allocator's and the
kernels' warm-up); then ``--rounds`` rounds, the rows interleaved and their order reversed every
other round so that load drifts hit all alike, each round ``--steps`` timed steps of every row;
a row's rate is the median of its rounds. A stoker round is one ``Estimator.train`` call of one
device loop of ``--steps`` steps, timed as the engine times its loops (``LoopResult.seconds``:
the steps and the input pipeline feeding them, not ``train()``'s set-up); a plain round is the
wall time of its ``--steps`` step calls.

What differs between the rows: the parameters and the matmul FLOPs are equal (the line above);
``nn.TransformerEncoderLayer`` also drops out inside the feed-forward block (one more dropout per
layer, on the widest activation) and its attention copies q, k and v into the layout it wants,
which the recipe's layer does not; the plain loop trains on one batch of
random tokens made once; the recipe reads masked windows of the standard-library corpus through
its input pipeline (``MaskedTextWindows``), steps a learning-rate schedule (LambdaLR) and
checkpoints nothing (no ``model_dir``). The plain loop's learning rate is 1e-4, the recipe's its
warm-up schedule; neither changes the work. ``--fast_linear`` is ``off`` by default so both use
the same BLAS kernels (``auto`` adds stoker's per-shape oneDNN choice, a CPU-only gain that the
GPU comparison does not have). ``benchmarks/compute.py --sections bert`` measures the recipe
against the machine's kernels (GFLOP/s) instead.

    python benchmarks/transformer.py                                  # the default shape: 1-2 minutes
    python benchmarks/transformer.py --rounds 7 --steps 10 --json transformer.json
    python benchmarks/transformer.py --compile none                   # eager rows only: seconds
    python benchmarks/transformer.py --hidden 512 --heads 8 --intermediate 2048 --batch 16
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_check import plain_bert_step  # this directory: the GPU check's plain loop, the same code

from stoker.hooks import Hook
from stoker.kernels.machine import cpu_model
from stoker.recipes.bert import RECIPE, BertConfig, input_fns

PLAIN, SDPA, MATH = "plain", "stoker sdpa", "stoker math"
PLAIN_COMPILED, STOKER_COMPILED = "plain compiled", "stoker compiled"
ROW_TEXT = {
    PLAIN: "plain nn.TransformerEncoder + AdamW, eager",
    SDPA: "stoker train bert --attention sdpa",
    MATH: "stoker train bert --attention math",
    PLAIN_COMPILED: "plain, torch.compile of the model",
    STOKER_COMPILED: "stoker train bert --attention sdpa --compile {mode}",
}


class _LoopSeconds(Hook):
    """The wall time of every device loop, as the engine measures it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def after_loop(self, run: Any, result: Any) -> None:
        self.seconds.append(result.seconds)


def shape_of(args: argparse.Namespace) -> dict[str, int]:
    """The plain loop's shape (``gpu_check.BERT_LARGE``'s keys) from the flags."""
    return {
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": args.heads,
        "intermediate": args.intermediate,
        "seq_len": args.seq_len,
        "batch": args.batch,
    }


def recipe_config(args: argparse.Namespace, attention: str, compile_mode: str = "none") -> BertConfig:
    """The ``stoker train bert`` flags of the same shape, one loop per ``--steps`` steps."""
    return BertConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=args.intermediate,
        seq_len=args.seq_len,
        batch_size=args.batch,
        attention=attention,
        compile=compile_mode,
        precision=args.precision,
        fast_linear=args.fast_linear,
        corpus_bytes=2**20,
        iterations_per_loop=args.steps,
        log_every_n_steps=10**9,
        device="cpu",
    )


def _stoker_row(args: argparse.Namespace, attention: str, compile_mode: str = "none") -> Callable[[int], float]:
    """A function that trains ``n`` more steps of the recipe and returns their loop's seconds."""
    config = recipe_config(args, attention, compile_mode)
    est = RECIPE.build_estimator(config)
    train_fn = input_fns(config)[0]
    timer = _LoopSeconds()

    def train(steps: int) -> float:
        before = len(timer.seconds)
        est.train(train_fn, steps=steps, hooks=[timer])
        return sum(timer.seconds[before:])

    return train


def _plain_row(args: argparse.Namespace, variant: str) -> Callable[[int], float]:
    """A function that runs ``n`` more steps of the plain loop and returns their wall time."""
    step = plain_bert_step(args.precision, variant, "cpu", shape_of(args))

    def train(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return time.perf_counter() - start

    return train


def build_rows(args: argparse.Namespace) -> dict[str, Callable[[int], float]]:
    """Every row's training function, built in this order (the plain loop first)."""
    rows = {PLAIN: _plain_row(args, "eager"), SDPA: _stoker_row(args, "sdpa"), MATH: _stoker_row(args, "math")}
    if args.compile != "none":
        rows[PLAIN_COMPILED] = _plain_row(args, "compiled")
        rows[STOKER_COMPILED] = _stoker_row(args, "sdpa", args.compile)
    return rows


def step_flops(args: argparse.Namespace) -> dict[str, float]:
    """Training FLOPs of one step of each model (forward and backward, every matmul and the
    attention), counted by ``torch.utils.flop_counter`` on one batch: the rows' work is the same."""
    from gpu_check import _plain_bert_model
    from torch.utils.flop_counter import FlopCounterMode

    from stoker.recipes.bert import BertMLM, mlm_loss

    config = recipe_config(args, "sdpa")
    models = {PLAIN: _plain_bert_model(shape_of(args)), "stoker": BertMLM.from_params(config.model_params())}
    tokens = torch.randint(0, 256, (args.batch, args.seq_len))
    labels = torch.where(torch.rand(args.batch, args.seq_len) < 0.15, tokens, -100)
    flops = {}
    for name, model in models.items():
        with FlopCounterMode(display=False) as counter:
            mlm_loss(model(tokens), labels).backward()
        flops[name] = float(counter.get_total_flops())
    return flops


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Examples/sec of every row (the median of ``--rounds`` interleaved rounds) and the ratios."""
    rows = build_rows(args)
    warm_up_s = {name: train(args.warmup) for name, train in rows.items()}
    rounds: dict[str, list[float]] = {name: [] for name in rows}
    order = list(rows.items())
    for r in range(args.rounds):
        for name, train in order if r % 2 == 0 else order[::-1]:
            rounds[name].append(args.steps * args.batch / train(args.steps))
    rate = {name: statistics.median(values) for name, values in rounds.items()}
    ratios = {name: rate[name] / rate[PLAIN] for name in rate}
    if STOKER_COMPILED in rate:
        ratios["stoker compiled / plain compiled"] = rate[STOKER_COMPILED] / rate[PLAIN_COMPILED]
    ratios["stoker sdpa / stoker math"] = rate[SDPA] / rate[MATH]
    return {"examples_per_sec": rate, "rounds": rounds, "ratios": ratios, "warm_up_s": warm_up_s}


def print_table(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The rows (examples/sec and the ratio to ``plain``), then the other ratios."""
    ratios = result["ratios"]
    print(f"  {'row':<68} {'examples/sec':>12}  {'ratio to plain':>14}")
    for name, rate in result["examples_per_sec"].items():
        text = ROW_TEXT[name].format(mode=args.compile)
        print(f"  {name + ': ' + text:<68} {rate:12.1f}  {ratios[name]:13.2f}x")
    for name, ratio in ratios.items():
        if " / " in name:
            print(f"  {name}: {ratio:.2f}x")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--fast_linear", choices=("off", "on", "auto"), default="off", help="the recipe's (CPU only)")
    p.add_argument(
        "--compile",
        choices=("none", "module", "step"),
        default="module",
        help="the compiled rows: plain, torch.compile of the model; stoker, --compile MODE (none: no compiled rows)",
    )
    p.add_argument("--steps", type=int, default=5, help="timed steps per row and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each row first")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median counts")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    for name in ("hidden", "layers", "heads", "intermediate", "seq_len", "batch", "steps", "warmup", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.hidden % args.heads:
        p.error(f"--hidden ({args.hidden}) must be divisible by --heads ({args.heads})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("stoker").setLevel(logging.WARNING)  # the recipe's step lines: this script prints its own
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  {cpu_model()}  torch {torch.__version__}  "
        f"{torch.get_num_threads()} threads  load {load:.2f}  ({platform.machine()})"
    )
    print(
        f"  hidden {args.hidden}, {args.layers} layers, {args.heads} heads, intermediate {args.intermediate}, "
        f"seq {args.seq_len}, batch {args.batch}, {args.precision}, fast_linear {args.fast_linear}; "
        f"warm-up {args.warmup} steps, then the median of {args.rounds} interleaved rounds of {args.steps} steps"
    )
    flops = step_flops(args)
    print(
        f"  one step: plain {flops[PLAIN] / 1e9:.2f} GFLOP, stoker {flops['stoker'] / 1e9:.2f} GFLOP "
        f"({'the same work' if flops[PLAIN] == flops['stoker'] else 'DIFFERENT WORK'}; torch.utils.flop_counter)"
    )
    if args.compile != "none":
        import torch._inductor.config as inductor

        inductor.compile_threads = 1  # no pool of compile workers warming up in the background of the timed rounds
    result = {"step_flops": flops, **measure(args)}
    print_table(args, result)
    if args.json:
        figures = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": cpu_model(), "torch": torch.__version__}
        figures.update(threads=torch.get_num_threads(), load_before=load, args=vars(args), **result)
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
