"""What a training benchmark writes besides its lines: TensorBoard summaries
(``--summary_verbosity``), MLPerf logs (``--ml_perf``) and the benchmark logger's files
(``--benchmark_log_dir``). Each is a hook or a function the runner adds when its flag is set.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..hooks import Hook, LoopResult, RunContext, every_n_steps_due
from ..hooks.mlperf import MLPerfLogHook
from .config import BenchConfig
from .workload import Workload

BENCHMARK_RUN_LOG = "benchmark_run.log"
METRIC_LOG = "metric.log"


class BenchSummaries(Hook):
    """TensorBoard summaries in ``--train_dir/events``, every ``every_n_steps`` steps (chief only).

    ``verbosity`` 1: scalars (the reported loss, learning rate, images/sec); 2: also a histogram
    of every weight; 3: also of every gradient (of the step written, as the optimizer applies it).
    """

    phase = "reporting"  # after the step timer and the evaluations, as the engine's SummaryHook

    def __init__(self, log_dir: str | os.PathLike[str], *, verbosity: int, every_n_steps: int, loss_tag: str) -> None:
        self.log_dir = Path(log_dir)
        self.verbosity = verbosity
        self.every_n_steps = every_n_steps
        self.loss_tag = loss_tag
        self._writer: Any = None
        self._examples = 0
        self._seconds = 0.0
        self._step = 0
        self._gradients: dict[str, torch.Tensor] = {}
        self._handle: Any = None

    def after_setup(self, run: RunContext) -> None:
        if not run.is_chief:
            return
        # Imported here: tensorboard is slow to import.
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(self.log_dir))
        if self.verbosity >= 3:
            # The engine frees gradients after each update, so they are copied inside the update
            # of each step a summary is due at, as the optimizer sees them (weight decay added).
            self._step = run.global_step
            names = {id(p): n for n, p in _named_parameters(run.model)}
            self._handle = run.optimizer.register_step_pre_hook(
                lambda optimizer, args, kwargs: self._grab_gradients(optimizer, names)
            )

    def _grab_gradients(self, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> None:
        self._step += 1
        if self._step % self.every_n_steps == 0:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            self._gradients = {
                names.get(id(p), str(i)): p.grad.detach().float().cpu()
                for i, p in enumerate(params)
                if p.grad is not None
            }

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._examples += result.examples
        self._seconds += result.seconds
        if self._writer is None or not result.steps:
            return
        if not every_n_steps_due(result.first_step, run.global_step, self.every_n_steps):
            return
        step = run.global_step
        self._writer.add_scalar(self.loss_tag, result.losses[-1], step)
        if "learning_rate" in result.values:
            self._writer.add_scalar("learning_rate", result.values["learning_rate"][-1], step)
        if self._seconds > 0:
            self._writer.add_scalar("images_per_sec", self._examples / self._seconds, step)
        self._examples, self._seconds = 0, 0.0
        if self.verbosity >= 2:
            for name, param in _named_parameters(run.model):
                self._writer.add_histogram(f"weights/{name}", param.detach().float().cpu(), step)
            for name, grad in self._gradients.items():
                self._writer.add_histogram(f"gradients/{name}", grad, step)
            self._gradients = {}
        self._writer.flush()

    def end(self, run: RunContext) -> None:
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    # DDP and torch.compile wrap the model: report the user's names.
    return [(n.removeprefix("module.").removeprefix("_orig_mod."), p) for n, p in model.named_parameters()]


def summary_hook(cfg: BenchConfig) -> BenchSummaries | None:
    """``--summary_verbosity`` >= 1: summaries every ``--save_summaries_steps`` (else every
    ``--display_every``) steps."""
    if not cfg.summary_verbosity or cfg.train_dir is None:
        return None
    return BenchSummaries(
        Path(cfg.train_dir) / "events",
        verbosity=cfg.summary_verbosity,
        every_n_steps=cfg.save_summaries_steps or cfg.display_every,
        loss_tag=cfg.loss_type_to_report,
    )


def mlperf_log_path(cfg: BenchConfig) -> str:
    """Where ``--ml_perf`` writes: ``--train_dir/mlperf.log``, else standard output."""
    return str(Path(cfg.train_dir) / "mlperf.log") if cfg.train_dir else "/dev/stdout"


def mlperf_hook(cfg: BenchConfig, workload: Workload) -> MLPerfLogHook | None:
    """``--ml_perf``: MLPerf ``:::MLLOG`` events (run, epochs of ``train_examples / batch`` steps)."""
    if not cfg.ml_perf:
        return None
    steps_per_epoch = max(1, workload.train_examples // workload.batch_size)
    return MLPerfLogHook(mlperf_log_path(cfg), steps_per_epoch=steps_per_epoch, benchmark=cfg.model, use_mllog=False)


def write_benchmark_logs(log_dir: str | os.PathLike[str], cfg: BenchConfig, result: Mapping[str, Any]) -> Path:
    """``--benchmark_log_dir``: ``benchmark_run.log`` (one JSON object: what ran, where, with which
    flags) and ``metric.log`` (one JSON object per line: name, value, unit, global_step,
    timestamp, extras), the files of the TensorFlow models' benchmark logger."""
    out = Path(log_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    run = {
        "model_name": cfg.model,
        "dataset": {"name": result.get("dataset")},
        "test_id": cfg.benchmark_test_id,
        "run_date": now,
        "machine_config": {
            "cpu_info": {"num_cores": os.cpu_count(), "cpu_info": platform.processor()},
            "gpu_info": {"count": torch.cuda.device_count()},
        },
        "torch_version": {"version": torch.__version__, "stoker": __version__},
        "run_parameters": [
            {"name": k, "string_value" if isinstance(v, str) else "value": v}
            for k, v in sorted(cfg.to_dict().items())
            if isinstance(v, (str, int, float, bool))
        ],
    }
    (out / BENCHMARK_RUN_LOG).write_text(json.dumps(run) + "\n")
    step = result.get("global_step")
    metrics = [
        ("average_examples_per_sec", result.get("images_per_sec"), "images/sec"),
        (cfg.loss_type_to_report, result.get("last_average_loss"), None),
        ("top_1_accuracy", result.get("top_1_accuracy"), None),
        ("top_5_accuracy", result.get("top_5_accuracy"), None),
    ]
    with open(out / METRIC_LOG, "a") as f:
        for name, value, unit in metrics:
            if value is not None:
                f.write(
                    json.dumps(
                        {
                            "name": name,
                            "value": float(value),
                            "unit": unit,
                            "global_step": step,
                            "timestamp": now,
                            "extras": [],
                        }
                    )
                    + "\n"
                )
    return out


__all__ = ["BenchSummaries", "mlperf_hook", "mlperf_log_path", "summary_hook", "write_benchmark_logs"]
