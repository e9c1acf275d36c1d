"""stoker: a PyTorch-native Estimator.

Train, evaluate, predict and benchmark a ``model_fn`` at the speed of a hand-written loop,
and resume a killed run bitwise exactly from its ``model_dir``.

The names below are loaded when first used (PEP 562), so ``import stoker`` and the ``stoker``
command's help do not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved
from ._version import __version__

if TYPE_CHECKING:
    from . import data, hooks, metrics, precision
    from .checkpoint import CheckpointIO, WarmStartSettings
    from .config import RunConfig
    from .distributed import PipelineConfig
    from .errors import (
        CheckpointError,
        CheckpointMismatchError,
        ConfigError,
        CorruptCheckpointError,
        DataError,
        DistributedError,
        ImageDecodeError,
        ModelFnError,
        NanLossError,
        NonFiniteError,
        RequestError,
        StateError,
        StokerError,
        StorageError,
        UnknownNameError,
        UserCodeError,
    )
    from .estimator import Estimator
    from .memory import keep_freed_host_memory
    from .precision import LossScale
    from .spec import EstimatorSpec, ModeKeys
    from .storage import RetryPolicy

#: public name -> the module that defines it (a module itself where the name is a subpackage)
_EXPORTS = {
    "CheckpointError": ".errors",
    "CorruptCheckpointError": ".errors",
    "ModelFnError": ".errors",
    "NanLossError": ".errors",
    "NonFiniteError": ".errors",
    "StokerError": ".errors",
    "StorageError": ".errors",
    "UserCodeError": ".errors",
    "CheckpointMismatchError": ".errors",
    "ConfigError": ".errors",
    "DataError": ".errors",
    "DistributedError": ".errors",
    "ImageDecodeError": ".errors",
    "RequestError": ".errors",
    "StateError": ".errors",
    "UnknownNameError": ".errors",
    "Estimator": ".estimator",
    "EstimatorSpec": ".spec",
    "ModeKeys": ".spec",
    "RunConfig": ".config",
    "CheckpointIO": ".checkpoint",
    "LossScale": ".precision",
    "PipelineConfig": ".distributed",
    "RetryPolicy": ".storage",
    "WarmStartSettings": ".checkpoint",
    "keep_freed_host_memory": ".memory",
}
_SUBMODULES = {"data", "hooks", "metrics", "precision"}


_moved.install()  # the pre-0.2 module names (stoker.serve, stoker.loop, ...) still import, with a warning


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CheckpointError",
    "CheckpointIO",
    "CorruptCheckpointError",
    "StorageError",
    "UserCodeError",
    "CheckpointMismatchError",
    "ConfigError",
    "DataError",
    "DistributedError",
    "ImageDecodeError",
    "RequestError",
    "StateError",
    "UnknownNameError",
    "Estimator",
    "EstimatorSpec",
    "LossScale",
    "ModeKeys",
    "ModelFnError",
    "NanLossError",
    "NonFiniteError",
    "PipelineConfig",
    "RetryPolicy",
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
