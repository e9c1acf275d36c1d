"""``--cuda_graph``: whether a ``stoker bench`` training step can be captured, and if not, why.

:func:`cuda_graph_refusals` reads only the flags and the device type, so it runs before anything
is built (a refusal is a flag error: exit 2) and is tested on CPU for a CUDA target. What it
says of the update is the engine's own rule (:func:`stoker.engine.cuda_graph_step.captures_update`
and :func:`~stoker.engine.cuda_graph_step.skips_update_on_device`) applied to the optimizer the
bench builds for the device (:func:`stoker.bench.optim.optimizer_for`, on a CPU stand-in), so the
two cannot disagree; this check only says it in the bench's terms, with the flag to change. The
engine checks the built step again when it runs (``capture_refusals``).
"""

from __future__ import annotations

from ..engine.cuda_graph_step import captures_update, skips_update_on_device
from .config import BenchConfig
from .optim import optimizer_for


def cuda_graph_refusals(cfg: BenchConfig, device_type: str, *, replicas: int = 1) -> list[str]:
    """Why the training step ``cfg`` describes cannot be captured as a CUDA graph on a
    ``device_type`` device with ``replicas`` replicas (empty: it can). Each reason names the
    flag and the fix."""
    reasons = []
    if device_type != "cuda":
        reasons.append(f"a CUDA graph needs a CUDA device; this run's is {device_type!r} (use --device=cuda)")
    if cfg.compile_mode == "step":
        reasons.append("--compile=step is the other way to run the step whole; drop --compile=step or --cuda_graph")
    if replicas > 1:
        reasons.append(
            f"{replicas} replicas: their gradient all-reduce is not captured; run one replica (--num_gpus=1)"
        )
    if cfg.precision == "bf16-sr":
        reasons.append("--precision=bf16-sr's stochastically rounded update is not captured; use --precision=bf16")
    update = optimizer_for(cfg, "cuda")
    if not captures_update(update) and cfg.compile_mode != "step":
        reasons.append(f"--optimizer={cfg.optimizer} has no capturable update on CUDA")
    if cfg.precision == "fp16" and cfg.fp16_enable_auto_loss_scale and not skips_update_on_device(update):
        reasons.append(
            "--fp16_enable_auto_loss_scale skips an update on the device only inside a fused optimizer, and "
            f"--optimizer={cfg.optimizer} has none; use --optimizer=sgd, momentum or adam, or a static loss "
            "scale (drop --fp16_enable_auto_loss_scale)"
        )
    return reasons


__all__ = ["cuda_graph_refusals"]
