r"""How close stoker's training comes to the fastest kernels torch has on this machine (issue 26).

Sections (``--sections``, default all; each prints its table, ``--json`` writes every figure):

- ``kernels``: GFLOP/s of the kernels the MFU peak is the fastest of (``stoker.kernels.peak``):
  the BLAS gemm, oneDNN's linear and a channels_last 3x3 convolution, fp32 and bf16, and what
  this CPU has for bf16/fp16 (``/proc/cpuinfo`` flags).
- ``mlp``: a 3-layer 2048-wide MLP, batch 512, forward + backward + SGD, ``nn.Linear`` (BLAS)
  against ``fast_linear="on"`` (oneDNN for the forward and both backward products), rounds
  interleaved; the largest relative gradient difference. ``--autotune`` adds ``torch.compile``
  with ``max_autotune`` and ``max_autotune_gemm_backends="CPP,ATEN"`` (inductor's CPU GEMM
  templates; minutes of compiling).
- ``sgd``: the ``trivial`` ImageNet model's training step (batch 32 of 227px uint8 images cast
  and normalised by ``ImagePreprocessor``, fast linears ``auto``, SGD with weight decay as
  ``stoker bench`` runs it, glibc keeping freed memory as ``stoker bench`` does) with the ordinary
  update against ``sgd_in_backward`` (``stoker.kernels.sgd_in_backward``), rounds interleaved;
  and the largest relative weight difference after ``--steps`` steps from the same start.
- ``bert``: the BERT recipe's model (``stoker.recipes.bert``) at hidden 512, 4 layers, 8 heads,
  FFN 2048, seq 128, batch 32, trained by the Estimator with AdamW on the recipe's masked
  windows, fast_linear off / on / auto and fp32 / bf16; training GFLOP/s (FLOPs counted by
  ``torch.utils.flop_counter`` on one step: every matmul of forward and backward) against the
  oneDNN linear kernel's and the BLAS gemm's GFLOP/s measured in the same run (ratios).
- ``bf16``: resnet50 (``stoker bench``, synthetic ImageNet) fp32 against bf16: images/sec and
  the speed-up; the BERT speed-up is in ``bert``.
- ``loss``: a small BERT (hidden 128, 2 layers, seq 64, batch 16) trained ``--loss_steps``
  steps in fp32 and in bf16 from the same seed and data; the loss curves averaged over windows
  of 25 steps, and whether every window's bf16 mean is within ``--loss_tolerance`` (default
  3 %) of fp32's.

The defaults are short (a few steps each; minutes on a 2-core machine); the figures for the
docs come from a quiet machine with more steps:

    python benchmarks/compute.py                                   # everything, short
    python benchmarks/compute.py --sections bert --steps 20 --rounds 3
    python benchmarks/compute.py --sections sgd --steps 10 --rounds 5 --threads 1
    python benchmarks/compute.py --sections bf16 --resnet_batch 32 --steps 10
    python benchmarks/compute.py --sections loss --loss_steps 500 --json out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import stoker
from stoker.bench import BenchConfig, run_benchmark
from stoker.bench.model import l2_loss
from stoker.data.images import TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor
from stoker.kernels import linear as fast_linear
from stoker.kernels.machine import BF16_FLAGS, FP16_FLAGS, cpu_flags, cpu_model
from stoker.kernels.peak import measure_kernels
from stoker.kernels.sgd_in_backward import update_in_backward
from stoker.memory.host import keep_freed_host_memory
from stoker.models.trivial import trivial_imagenet
from stoker.recipes.bert import BertConfig, BertMLM, bert_model_fn, input_fns, mlm_loss

BERT = {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "intermediate_size": 2048, "dropout": 0.1, "seq_len": 128}
SMALL_BERT = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 512,
    "dropout": 0.1,
    "seq_len": 64,
}


def kernels(args: argparse.Namespace) -> dict[str, Any]:
    flags = cpu_flags()
    out: dict[str, Any] = {
        "fast_bf16_flags": sorted(f for f in BF16_FLAGS if f in flags),
        "fast_fp16_flags": sorted(f for f in FP16_FLAGS if f in flags),
    }
    for precision in ("fp32", "bf16"):
        for name, gflops in measure_kernels(torch.device("cpu"), precision, budget_s=args.budget).items():
            out[name] = gflops
            print(f"  {name:<36} {gflops:8.1f} GFLOP/s")
    print(
        f"  fast bf16 instructions: {out['fast_bf16_flags'] or 'none'}; fast fp16: {out['fast_fp16_flags'] or 'none'}"
    )
    return out


# ---------------------------------------------------------------------------------------------- mlp
def _mlp_step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def mlp(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    width, batch = 2048, 512
    plain = nn.Sequential(*(m for _ in range(3) for m in (nn.Linear(width, width), nn.ReLU())))
    fast = copy.deepcopy(plain)
    fast_linear.use_fast_linear(fast, "on")
    x = torch.randn(batch, width)
    grads = []
    for model in (plain, fast):
        model.zero_grad()
        model(x).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    diff = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads[1], grads[0], strict=True))
    flop = 3 * 3 * 2.0 * batch * width * width  # 3 layers x (forward + 2 backward products)
    variants = {"nn.Linear (BLAS)": _mlp_step(plain, x), "fast_linear=on (oneDNN)": _mlp_step(fast, x)}
    if args.autotune:
        import torch._inductor.config as inductor

        inductor.max_autotune_gemm_backends = "CPP,ATEN"
        compiled = copy.deepcopy(plain)
        step = _mlp_step(torch.compile(compiled, mode="max-autotune-no-cudagraphs"), x)
        start = time.perf_counter()
        step()
        print(f"  (compiling with max_autotune took {time.perf_counter() - start:.0f} s)")
        variants["torch.compile max_autotune CPP,ATEN"] = step
    best = _interleaved(variants, args.rounds, args.steps)
    out = {name: flop / t / 1e9 for name, t in best.items()}
    for name, gflops in out.items():
        print(f"  {name:<40} {gflops:8.1f} GFLOP/s  ({gflops / out['nn.Linear (BLAS)']:.2f}x)")
    print(f"  largest relative gradient difference oneDNN vs BLAS: {diff:.1e}")
    return {"gflops": out, "max_relative_grad_diff": diff}


def _interleaved(variants: dict[str, Callable[[], None]], rounds: int, steps: int) -> dict[str, float]:
    """The fastest step time of each variant, rounds interleaved so that load drifts hit all alike."""
    for step in variants.values():
        step()
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, step in variants.items():
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------------------------------------- sgd
def _trivial_step(in_backward: bool, batches: list[torch.Tensor], labels: torch.Tensor) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = trivial_imagenet(1001).to(memory_format=torch.channels_last)
    fast_linear.use_fast_linear(model, "auto")
    opt = torch.optim.SGD(model.parameters(), lr=0.005, weight_decay=4e-5, fused=True)
    if in_backward:
        update_in_backward(model, opt)
    pre = ImagePreprocessor(TF_CNN_MEAN, TF_CNN_STD, channels_last=True)
    count = [0]

    def step() -> None:
        images = batches[count[0] % len(batches)]
        count[0] += 1
        loss = F.cross_entropy(model(pre(images)), labels) + 4e-5 * l2_loss(model)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return model, step


def sgd(args: argparse.Namespace) -> dict[str, Any]:
    keep_freed_host_memory()  # as stoker bench does: no page faults on each step's fresh gradients
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (32, 227, 227, 3), dtype=torch.uint8, generator=gen) for _ in range(4)]
    labels = torch.randint(0, 1001, (32,), generator=gen)
    variants = {
        "ordinary update (optimizer.step)": _trivial_step(False, batches, labels)[1],
        "sgd_in_backward": _trivial_step(True, batches, labels)[1],
    }
    best = _interleaved(variants, args.rounds, args.steps)
    base = best["ordinary update (optimizer.step)"]
    for name, t in best.items():
        print(f"  {name:<36} {t * 1e3:8.2f} ms/step  {32 / t:8.1f} images/sec  ({base / t:.2f}x)")
    # Agreement from a fresh start (the timed models have diverged apart as trivial does on random labels).
    (ordinary, ordinary_step), (fused, fused_step) = (_trivial_step(b, batches, labels) for b in (False, True))
    for _ in range(3):
        ordinary_step()
        fused_step()
    diff = max(
        float((a - b).abs().max() / b.abs().max())
        for a, b in zip(fused.state_dict().values(), ordinary.state_dict().values(), strict=True)
    )
    print(f"  largest relative weight difference after 3 steps from the same start: {diff:.1e}")
    return {
        "ms_per_step": {k: v * 1e3 for k, v in best.items()},
        "speedup": base / best["sgd_in_backward"],
        "max_relative_weight_diff": diff,
    }


# --------------------------------------------------------------------------------------------- bert
def _bert_estimator(model_params: dict[str, Any], batch: int, precision: str, mode: str) -> stoker.Estimator:
    params = {**model_params, "mask_prob": 0.15}
    return stoker.Estimator(
        model=BertMLM.from_params,
        model_fn=bert_model_fn,
        optimizer=lambda p, ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
        config=stoker.RunConfig(
            precision=precision,  # type: ignore[arg-type]
            fast_linear=mode,  # type: ignore[arg-type]
            iterations_per_loop=1,
            log_every_n_steps=None,
            progress_bar=False,
            summaries=False,
            seed=0,
        ),
        params=params,
        train_batch_size=batch,
    )


def _bert_input(model_params: dict[str, Any], batch: int) -> Any:
    config = BertConfig(seq_len=model_params["seq_len"], batch_size=batch, corpus_bytes=2**20, seed=0)
    return input_fns(config)[0]


def _train_flop(model_params: dict[str, Any], batch: int) -> float:
    """FLOPs of one training step (forward and backward matmuls, attention included), counted."""
    from torch.utils.flop_counter import FlopCounterMode

    params = {**model_params}
    model = BertMLM.from_params(params)
    tokens = torch.randint(0, 256, (batch, params["seq_len"]))
    labels = torch.where(torch.rand(batch, params["seq_len"]) < 0.15, tokens, -100)
    with FlopCounterMode(display=False) as counter:
        mlm_loss(model(tokens), labels).backward()
    return float(counter.get_total_flops())


def bert(args: argparse.Namespace) -> dict[str, Any]:
    batch = args.bert_batch
    flop = _train_flop(BERT, batch)
    kernels = measure_kernels(torch.device("cpu"), "fp32", budget_s=args.budget)
    onednn, blas = kernels.get("oneDNN linear fp32", float("nan")), kernels["BLAS gemm fp32"]
    print(f"  one step: {flop / 1e9:.1f} GFLOP (batch {batch} x {BERT['seq_len']} tokens, forward + backward)")
    print(f"  kernels now: oneDNN linear {onednn:.1f} GFLOP/s, BLAS gemm {blas:.1f} GFLOP/s")
    input_fn = _bert_input(BERT, batch)
    runs = {}
    for precision in args.bert_precisions:
        for mode in args.bert_modes:
            est = _bert_estimator(BERT, batch, precision, mode)
            fast_linear.reset_choices()
            est.train(input_fn, steps=args.warmup)  # compiles nothing; measures the auto choice, warms the allocator
            runs[(precision, mode)] = (est, fast_linear.describe_choices())
    seconds: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    order = list(runs.items())
    for r in range(args.rounds):  # interleaved, and the order reversed every other round: drifts hit all alike
        for key, (est, _) in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            est.train(input_fn, steps=args.steps)
            seconds[key].append((time.perf_counter() - start) / args.steps)
    out: dict[str, Any] = {"step_gflop": flop / 1e9, "onednn_linear_gflops": onednn, "blas_gemm_gflops": blas}
    fp32_off = None
    for (precision, mode), times in seconds.items():
        t = min(times)
        gflops = flop / t / 1e9
        fp32_off = fp32_off or (t if (precision, mode) == ("fp32", "off") else None)
        row = {
            "seconds_per_step": t,
            "gflops": gflops,
            "of_onednn_linear": gflops / onednn,
            "of_blas_gemm": gflops / blas,
            "choices": runs[(precision, mode)][1],
        }
        out[f"{precision} fast_linear={mode}"] = row
        print(
            f"  {precision} fast_linear={mode:<4} {1 / t * batch:7.1f} seq/s  {gflops:7.1f} GFLOP/s  "
            f"{100 * gflops / onednn:5.1f} % of oneDNN linear  {100 * gflops / blas:5.1f} % of BLAS gemm"
            + (f"  speed-up {fp32_off / t:.2f}x of fp32/off" if fp32_off else "")
        )
    return out


# --------------------------------------------------------------------------------------------- bf16
def bf16(args: argparse.Namespace) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for precision in rates:
            cfg = BenchConfig(
                model="resnet50",
                batch_size=args.resnet_batch,
                num_batches=args.steps,
                num_warmup_batches=args.warmup,
                precision=precision,
                data_format="NHWC",
                device="cpu",
                display_every=10**6,
                peak_tflops=1.0,  # no peak measurement inside the timing rounds
            )
            rates[precision].append(run_benchmark(cfg, log=lambda line: None)["images_per_sec"])
    fp32, low = max(rates["fp32"]), max(rates["bf16"])
    print(
        f"  resnet50 batch {args.resnet_batch}: fp32 {fp32:.2f} img/s, bf16 {low:.2f} img/s, speed-up {low / fp32:.2f}x"
    )
    return {"resnet50_fp32_images_per_sec": fp32, "resnet50_bf16_images_per_sec": low, "speedup": low / fp32}


# --------------------------------------------------------------------------------------------- loss
class _LossRecorder(stoker.hooks.Hook):
    """Every step's training loss, as the device loop hands them over."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_loop(self, run: Any, result: Any) -> None:
        self.losses.extend(result.losses)


def loss(args: argparse.Namespace) -> dict[str, Any]:
    batch, window = 16, 25
    input_fn = _bert_input(SMALL_BERT, batch)
    curves = {}
    for precision in ("fp32", "bf16"):
        est = _bert_estimator(SMALL_BERT, batch, precision, "off")
        recorder = _LossRecorder()
        est.train(input_fn, steps=args.loss_steps, hooks=[recorder])
        curves[precision] = recorder.losses
    means = {p: [statistics.fmean(c[i : i + window]) for i in range(0, len(c), window)] for p, c in curves.items()}
    rel = [abs(b - a) / a for a, b in zip(means["fp32"], means["bf16"], strict=True)]
    ok = max(rel) <= args.loss_tolerance
    print(f"  steps  {'fp32':>7} {'bf16':>7}  rel.diff   (means over {window} steps)")
    for i, (a, b, r) in enumerate(zip(means["fp32"], means["bf16"], rel, strict=True)):
        print(f"  {i * window + 1:>4}-{min((i + 1) * window, args.loss_steps):<4} {a:7.4f} {b:7.4f}  {100 * r:6.3f} %")
    print(
        f"  every window within {100 * args.loss_tolerance:.0f} %: {'yes' if ok else 'NO'} "
        f"(largest {100 * max(rel):.2f} %)"
    )
    return {"window": window, "means": means, "max_relative_diff": max(rel), "tolerance": args.loss_tolerance, "ok": ok}


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "kernels": kernels,
    "mlp": mlp,
    "sgd": sgd,
    "bert": bert,
    "bf16": bf16,
    "loss": loss,
}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--steps", type=int, default=3, help="timed steps per round (mlp, sgd, bert, bf16)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (bert, bf16)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the fastest counts")
    p.add_argument("--budget", type=float, default=1.0, help="seconds per kernel measurement")
    p.add_argument("--bert_batch", type=int, default=32)
    p.add_argument("--bert_modes", nargs="+", choices=fast_linear.FAST_LINEAR_MODES, default=["off", "on", "auto"])
    p.add_argument("--bert_precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--resnet_batch", type=int, default=8)
    p.add_argument("--loss_steps", type=int, default=300)
    p.add_argument("--loss_tolerance", type=float, default=0.03)
    p.add_argument("--autotune", action="store_true", help="mlp: add torch.compile max_autotune (slow to compile)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  {cpu_model()}  torch {torch.__version__}  "
        f"{torch.get_num_threads()} threads  load {load:.2f}  ({platform.machine()})"
    )
    figures: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpu": cpu_model(),
        "torch": torch.__version__,
    }
    figures["threads"], figures["load_before"] = torch.get_num_threads(), load
    for name in args.sections:
        print(f"== {name}")
        figures[name] = SECTIONS[name](args)
    figures["load_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2, default=str)
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
