"""stoker: a PyTorch-native Estimator.

Train, evaluate, predict and benchmark a ``model_fn`` at the speed of a hand-written loop,
and resume a killed run bitwise exactly from its ``model_dir``.
"""

from . import data, hooks, metrics, precision
from ._version import __version__
from .checkpoint import WarmStartSettings
from .config import RunConfig
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    ModelFnError,
    NanLossError,
    StokerError,
    StorageError,
)
from .estimator import Estimator
from .host_memory import keep_freed_host_memory
from .spec import EstimatorSpec, ModeKeys

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "StorageError",
    "Estimator",
    "EstimatorSpec",
    "ModeKeys",
    "ModelFnError",
    "NanLossError",
    "RunConfig",
    "StokerError",
    "WarmStartSettings",
    "__version__",
    "data",
    "hooks",
    "keep_freed_host_memory",
    "metrics",
    "precision",
]
