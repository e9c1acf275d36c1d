"""``RunConfig`` and the config slices it is made of.

- ``run_config.py``: ``RunConfig``, the user's flat TPUEstimator-style settings, composed of
  the slices below and checking how they combine;
- ``slices.py``: the engine components' slices (``LoopConfig``, ``InputConfig``,
  ``StateConfig``, ``EvalConfig``, and ``EMA``, the state's moving average) and the hooks'
  (``RunInfo``); the other slices live beside their components
  (``stoker.checkpoint.CheckpointConfig``, ``stoker.distributed.DistributionConfig``,
  ``stoker.precision.Precision``).

The config may import errors, resolve, precision, checkpoint, distributed and kernels; never the engine
(the hooks import the config, and must never reach the engine).
"""

from ..distributed.config import STRATEGIES
from ..distributed.pipeline import PIPELINE_SCHEDULES, PipelineConfig, check_schedule
from ..precision import PRECISIONS
from .run_config import PrecisionName, RunConfig, run_info
from .slices import COMPILE_MODES, EMA, EvalConfig, InputConfig, LoopConfig, RunInfo, StateConfig

__all__ = [
    "COMPILE_MODES",
    "PIPELINE_SCHEDULES",
    "PRECISIONS",
    "STRATEGIES",
    "EMA",
    "EvalConfig",
    "InputConfig",
    "LoopConfig",
    "PipelineConfig",
    "PrecisionName",
    "RunConfig",
    "RunInfo",
    "StateConfig",
    "check_schedule",
    "run_info",
]
