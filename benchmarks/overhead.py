"""Framework overhead on a host-bound model: stoker's loop against a hand-written one.

The MLP of REFERENCE_NUMBERS.md (32 -> 64 -> 10, batch 64, SGD, in-memory data), trained for
``--steps`` steps four ways in one process, interleaved round by round so that machine noise
hits every variant alike:

- ``handwritten``: batches by tensor indexing from a per-epoch permutation, plain PyTorch;
- ``stoker_n1``: ``Estimator.train`` with ``iterations_per_loop=1`` (hooks every step);
- ``stoker_n100``: the same with ``iterations_per_loop=100``;
- ``lightning``: ``Trainer.fit`` (no logger, checkpointing or progress bar), if installed.

Prints the median steps/sec of each and its ratio to the hand-written loop.
Targets: stoker >= 0.95x with N=100, >= 0.85x with N=1.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import stoker

BATCH = 64
N_EXAMPLES = 64 * 200


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N_EXAMPLES, 32, generator=g), torch.randint(0, 10, (N_EXAMPLES,), generator=g)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def handwritten(x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    per_epoch = x.shape[0] // BATCH
    start = time.perf_counter()
    perm = torch.randperm(x.shape[0])
    for step in range(steps):
        b = step % per_epoch
        if b == 0 and step:
            perm = torch.randperm(x.shape[0])
        idx = perm[b * BATCH : (b + 1) * BATCH]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    loss.item()
    return steps / (time.perf_counter() - start)


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    return stoker.EstimatorSpec(loss=F.cross_entropy(model(features), labels))


def stoker_run(iterations: int) -> Callable[[torch.Tensor, torch.Tensor, int], float]:
    def run(x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
        est = stoker.Estimator(
            model=lambda p: mlp(),
            model_fn=model_fn,
            optimizer=lambda p, params: torch.optim.SGD(params, lr=0.05),
            config=stoker.RunConfig(iterations_per_loop=iterations, progress_bar=False, log_every_n_steps=10**9),
            train_batch_size=BATCH,
        )
        input_fn = lambda p: stoker.data.arrays(x, y, batch_size=p["batch_size"], seed=0)  # noqa: E731
        start = time.perf_counter()
        est.train(input_fn, max_steps=steps)
        return steps / (time.perf_counter() - start)

    return run


def lightning_run() -> Callable[[torch.Tensor, torch.Tensor, int], float] | None:
    try:
        import lightning.pytorch as pl  # type: ignore[import-not-found]
    except ImportError:
        try:
            import pytorch_lightning as pl  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return None
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.05)

    def run(x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
        trainer = pl.Trainer(
            max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, accelerator="cpu", devices=1,
        )
        start = time.perf_counter()
        trainer.fit(Module(), loader)
        return steps / (time.perf_counter() - start)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is steadier on a shared machine)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("stoker").setLevel(logging.WARNING)
    x, y = make_data()
    variants: dict[str, Callable[[torch.Tensor, torch.Tensor, int], float]] = {
        "handwritten": handwritten,
        "stoker_n1": stoker_run(1),
        "stoker_n100": stoker_run(100),
    }
    light = lightning_run()
    if light is not None:
        variants["lightning"] = light
    for fn in variants.values():  # warm-up: allocator, first-call costs
        fn(x, y, 50)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            rates[name].append(fn(x, y, args.steps))
    base = statistics.median(rates["handwritten"])
    results = {}
    print(f"MLP 32-64-10, batch {BATCH}, {args.steps} steps x {args.rounds} rounds, {args.threads} thread(s), torch {torch.__version__}")
    print(f"{'variant':<14}{'steps/sec':>12}{'ratio':>9}")
    for name, r in rates.items():
        med = statistics.median(r)
        results[name] = {"steps_per_sec": med, "ratio": med / base, "all": r}
        print(f"{name:<14}{med:>12.0f}{med / base:>8.3f}x")
    if light is None:
        print("(lightning not installed: pip install pytorch-lightning to add it)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
