"""Training memory with and without activation recompute, and bf16-sr weights against fp32 master weights.

Two workloads: the zoo's ``resnet50`` (ImageNet, batch 32, SGD with momentum as
tf_cnn_benchmarks trains it; recompute per residual block, ``features.*``) and the ``bert``
recipe's model (its default size, batch 32, AdamW; recompute per encoder layer, ``layers.*``).
Each runs one training step (two on CUDA) in every combination of

- precision: ``fp32``; ``bf16`` (autocast, fp32 master weights and state); ``bf16-sr``
  (bf16 weights and state, stochastic rounding);
- recompute: off, per block/layer, ``all`` (the whole model: only its inputs are kept),

built from stoker's own pieces (``to_bf16``, ``StochasticRounding``, ``apply_recompute``,
``autocast_context``), and reports:

- CPU (and CUDA): **activations** (the bytes autograd holds between forward and backward,
  counted exactly by ``stoker.memory.SavedActivations``; deterministic, independent of load),
  and **state** (parameters, gradients and optimizer state after the step,
  ``stoker.memory.state_bytes``); their sum, and each figure as a ratio of the fp32 / no
  recompute row. What this leaves out on CPU: the activations one recomputed block holds
  again during its backward (the peak is at most one block above "activations + state").
- CUDA only: **peak** ``torch.cuda.max_memory_allocated`` over the second training step (the
  optimizer state exists by then), which includes that and every temporary.
- the step's wall time, as a ratio of the baseline in the same run (recompute's cost; only
  meaningful on an idle machine).

Runners return dicts; :func:`print_table` prints them::

    python benchmarks/memory.py                       # both workloads, CUDA if available
    python benchmarks/memory.py --workloads bert --device cpu --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stoker.memory import SavedActivations, state_bytes
from stoker.memory.recompute import apply_recompute
from stoker.memory.stochastic_rounding import StochasticRounding, to_bf16
from stoker.models import create_model
from stoker.precision import autocast_context
from stoker.recipes.bert import IGNORE, VOCAB, BertConfig, BertMLM, make_optimizer, mlm_loss

PRECISIONS = ("fp32", "bf16", "bf16-sr")
MiB = 2**20


@dataclass(kw_only=True)
class Workload:
    """A model, one batch, its loss and optimizer, and what "per block" recompute names."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.device], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    blocks: str  # the recompute pattern of one block / layer


def resnet50(batch_size: int, image_size: int) -> Workload:
    def batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        return images.to(device), torch.randint(0, 1001, (batch_size,), generator=g).to(device)

    return Workload(
        name=f"resnet50 (batch {batch_size}, {image_size}x{image_size})",
        build=lambda: create_model("resnet50"),
        batch=batch,
        loss=lambda logits, labels: F.cross_entropy(logits.float(), labels),
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        blocks="features.*",
    )


def bert(batch_size: int, config: BertConfig) -> Workload:
    # The written-out attention (--attention=math): its attention weights are a saved tensor, which
    # is what the figures in docs/memory.md count; sdpa's kernels save less and are not counted alike.
    params = {**config.model_params(), "attention": "math", "weight_decay": config.weight_decay, "lr": config.lr}
    targets = round(config.mask_prob * config.seq_len)

    def batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCAB, (batch_size, config.seq_len), generator=g)
        labels = torch.full_like(tokens, IGNORE)
        positions = torch.rand(batch_size, config.seq_len, generator=g).argsort(1)[:, :targets]
        labels.scatter_(1, positions, torch.randint(0, 256, positions.shape, generator=g))
        return tokens.to(device), labels.to(device)

    return Workload(
        name=(
            f"bert (batch {batch_size}, seq {config.seq_len}, hidden {config.hidden_size}, {config.num_layers} layers)"
        ),
        build=lambda: BertMLM.from_params(params),
        batch=batch,
        loss=mlm_loss,
        optimizer=lambda m: make_optimizer(params, m.parameters()),
        blocks="layers.*",
    )


def measure(work: Workload, precision: str, recompute: str | None, device: torch.device) -> dict[str, Any]:
    """One variant's bytes (and CUDA peak, and step time) as a dict."""
    torch.manual_seed(0)
    model = work.build().to(device)
    if precision == "bf16-sr":
        to_bf16(model)
    if recompute is not None:
        apply_recompute(model, recompute)
    optimizer = work.optimizer(model)
    if precision == "bf16-sr":
        optimizer = StochasticRounding(optimizer, seed=0)
    features, labels = work.batch(device)
    cuda = device.type == "cuda"
    row: dict[str, Any] = {"workload": work.name, "precision": precision, "recompute": recompute or "off"}
    for step in range(2 if cuda else 1):  # on CUDA, the second step has the optimizer state already
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        with SavedActivations(exclude=[*model.parameters(), *model.buffers()]) as saved:
            with autocast_context(precision, device):
                loss = work.loss(model(features), labels)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize(device)
        row["step_s"] = time.perf_counter() - start
        row["activations"] = saved.bytes
        row.update(state_bytes(model, optimizer))
        if cuda:
            row["peak"] = torch.cuda.max_memory_allocated(device)
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            row["loss"] = float(loss.detach())
    row["state"] = row.pop("total")
    row["total"] = row["activations"] + row["state"]
    return row


def run(workloads: list[Workload], device: torch.device) -> list[dict[str, Any]]:
    """Every precision x recompute variant of every workload, with ratios to its fp32 / off row."""
    rows: list[dict[str, Any]] = []
    for work in workloads:
        base: dict[str, Any] | None = None
        measure(work, "fp32", None, device)  # warm-up: first-call costs stay out of the times
        for precision in PRECISIONS:
            for recompute in (None, work.blocks, "all"):
                row = measure(work, precision, recompute, device)
                base = base or row
                for key in ("activations", "state", "total", "peak", "step_s"):
                    if key in row:
                        row[f"{key}_ratio"] = row[key] / base[key]
                rows.append(row)
                print(f"  measured {work.name}: {precision}, recompute {row['recompute']}", file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows as a Markdown table (MiB, and ratios to each workload's first row)."""
    peak = any("peak" in r for r in rows)
    head = [
        "workload",
        "precision",
        "recompute",
        "activations MiB",
        "params+grads MiB",
        "optimizer MiB",
        "act.+state MiB",
        "activations ×",
        "state ×",
        "act.+state ×",
    ]
    head += ["CUDA peak MiB", "peak ×"] if peak else []
    head += ["step time ×"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [
            r["workload"],
            r["precision"],
            r["recompute"],
            f"{r['activations'] / MiB:.1f}",
            f"{(r['parameters'] + r['gradients']) / MiB:.1f}",
            f"{r['optimizer'] / MiB:.1f}",
            f"{r['total'] / MiB:.1f}",
            f"{r['activations_ratio']:.3f}",
            f"{r['state_ratio']:.3f}",
            f"{r['total_ratio']:.3f}",
        ]
        if peak:
            cells += [f"{r['peak'] / MiB:.1f}", f"{r['peak_ratio']:.3f}"]
        cells += [f"{r['step_s_ratio']:.2f}"]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=("resnet50", "bert"), default=["resnet50", "bert"])
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224, help="resnet50's input size")
    for name in ("seq_len", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
        parser.add_argument(
            f"--bert_{name}", type=int, default=getattr(BertConfig, name), help=f"bert's {name} (default: the recipe's)"
        )
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )
    bert_config = dataclasses.replace(
        BertConfig(),
        dropout=0.0,
        **{
            k: getattr(args, f"bert_{k}")
            for k in ("seq_len", "hidden_size", "num_layers", "num_heads", "intermediate_size")
        },
    )
    workloads = {
        "resnet50": lambda: resnet50(args.batch_size, args.image_size),
        "bert": lambda: bert(args.batch_size, bert_config),
    }
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or torch.get_num_threads()))
    rows = run([workloads[w]() for w in args.workloads], device)
    load = os.getloadavg()
    print(
        f"device {device} "
        f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'}), "
        f"torch {torch.__version__}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "load": load, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
