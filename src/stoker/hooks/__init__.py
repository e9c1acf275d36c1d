"""Training hooks: the ``Hook`` base class and the built-ins, one module each.

A hook's methods are no-ops unless overridden; the training run calls them between device
loops (docs/hooks.md). Hooks may import checkpoint, storage, summary, data, config and errors; they never
import the Estimator (they see it through small Protocols) or anything above the engine.
"""

from .base import Hook, HookRunner, LoopResult, RunContext, every_n_steps_due
from .checkpoint_saver import CheckpointSaverHook
from .logging_hook import LoggingHook
from .mlperf import MLPerfLogHook
from .nan import NanLossHook
from .preemption import PreemptionHook
from .profiler import ProfilerHook
from .progress import ProgressBarHook
from .step_counter import StepCounterHook
from .stop import StopAtStepHook
from .summary import SummaryHook

ExamplesPerSecondHook = StepCounterHook  # the TPUEstimator name

__all__ = [
    "CheckpointSaverHook",
    "ExamplesPerSecondHook",
    "Hook",
    "HookRunner",
    "LoggingHook",
    "LoopResult",
    "MLPerfLogHook",
    "NanLossHook",
    "PreemptionHook",
    "ProfilerHook",
    "ProgressBarHook",
    "RunContext",
    "StepCounterHook",
    "StopAtStepHook",
    "SummaryHook",
    "every_n_steps_due",
]
