"""Training hooks: the ``Hook`` base class and the built-ins, one module each.

A hook's methods are no-ops unless overridden; the training run calls them between device
loops (docs/hooks.md). Hooks may import checkpoint, storage, summary, data, config and errors; they never
import the Estimator (they see it through small Protocols) or anything above the engine.

The hooks that act on evaluations and talk to other tools (``EarlyStopping``,
``ReduceLROnPlateau``, ``MLflowLogger``, ``WandbLogger``, ``OptunaPruning``; docs/callbacks.md)
are loaded on first use, so ``import stoker.hooks`` imports none of mlflow, wandb or optuna.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..config.slices import RunInfo
from .base import Hook, HookRunner, LoopResult, RunContext, every_n_steps_due
from .checkpoint_saver import CheckpointSaverHook
from .logging_hook import LoggingHook
from .mlperf import MLPerfLogHook
from .nan import NanLossHook, RollbackRequest
from .preemption import PreemptionHook
from .profiler import ProfilerHook
from .progress import ProgressBarHook
from .step_counter import StepCounterHook
from .stop import StopAtStepHook
from .summary import SummaryHook

if TYPE_CHECKING:
    from .early_stopping import EarlyStopping
    from .mlflow_logger import MLflowLogger
    from .optuna_pruning import OptunaPruning
    from .plateau import ReduceLROnPlateau
    from .wandb_logger import WandbLogger

ExamplesPerSecondHook = StepCounterHook  # the TPUEstimator name

# name -> module of the hooks loaded on first use
_LAZY = {
    "EarlyStopping": "early_stopping",
    "ReduceLROnPlateau": "plateau",
    "MLflowLogger": "mlflow_logger",
    "WandbLogger": "wandb_logger",
    "OptunaPruning": "optuna_pruning",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stoker.hooks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CheckpointSaverHook",
    "EarlyStopping",
    "ExamplesPerSecondHook",
    "Hook",
    "HookRunner",
    "LoggingHook",
    "LoopResult",
    "MLPerfLogHook",
    "MLflowLogger",
    "NanLossHook",
    "OptunaPruning",
    "PreemptionHook",
    "ProfilerHook",
    "ProgressBarHook",
    "ReduceLROnPlateau",
    "RollbackRequest",
    "RunContext",
    "RunInfo",
    "StepCounterHook",
    "StopAtStepHook",
    "SummaryHook",
    "WandbLogger",
    "every_n_steps_due",
]
