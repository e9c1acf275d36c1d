"""stoker: a PyTorch-native Estimator.

Train, evaluate, predict and benchmark a ``model_fn`` at the speed of a hand-written loop,
and resume a killed run bitwise exactly from its ``model_dir``.

The names below are loaded when first used (PEP 562), so ``import stoker`` and the ``stoker``
command's help do not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # the table below for type checkers: each name re-exported as itself (PEP 484)
    from . import data as data
    from . import hooks as hooks
    from . import metrics as metrics
    from . import precision as precision
    from .checkpoint import CheckpointIO as CheckpointIO
    from .checkpoint import WarmStartSettings as WarmStartSettings
    from .config import EMA as EMA
    from .config import RunConfig as RunConfig
    from .distributed import PipelineConfig as PipelineConfig
    from .errors import CheckpointError as CheckpointError
    from .errors import CheckpointMismatchError as CheckpointMismatchError
    from .errors import ConfigError as ConfigError
    from .errors import CorruptCheckpointError as CorruptCheckpointError
    from .errors import DamagedCheckpointError as DamagedCheckpointError
    from .errors import DataError as DataError
    from .errors import DistributedError as DistributedError
    from .errors import ExportError as ExportError
    from .errors import FlagError as FlagError
    from .errors import ImageDecodeError as ImageDecodeError
    from .errors import ModelFnError as ModelFnError
    from .errors import NanLossError as NanLossError
    from .errors import NonFiniteError as NonFiniteError
    from .errors import RequestError as RequestError
    from .errors import StateError as StateError
    from .errors import StokerError as StokerError
    from .errors import StorageError as StorageError
    from .errors import UnknownNameError as UnknownNameError
    from .errors import UserCodeError as UserCodeError
    from .estimator import Estimator as Estimator
    from .memory import keep_freed_host_memory as keep_freed_host_memory
    from .precision import LossScale as LossScale
    from .spec import EstimatorSpec as EstimatorSpec
    from .spec import ModeKeys as ModeKeys
    from .storage import RetryPolicy as RetryPolicy

#: The public API, one table: each name ``import stoker`` gives -> the module it is loaded from (a
#: subpackage or module given by name is that module). ``__all__`` and the loading below are made
#: from it; tests/test_public_api.py holds the imports above and the API reference's table to it.
_PUBLIC: dict[str, str] = {
    # the facade and what a model_fn returns
    "Estimator": ".estimator",
    "EstimatorSpec": ".spec",
    "ModeKeys": ".spec",
    # how a run executes, and its groups of settings
    "RunConfig": ".config",
    "CheckpointIO": ".checkpoint",
    "EMA": ".config",
    "LossScale": ".precision",
    "PipelineConfig": ".distributed",
    "RetryPolicy": ".storage",
    "WarmStartSettings": ".checkpoint",
    "keep_freed_host_memory": ".memory",
    # the error tree
    "StokerError": ".errors",
    "CheckpointError": ".errors",
    "CheckpointMismatchError": ".errors",
    "ConfigError": ".errors",
    "CorruptCheckpointError": ".errors",
    "DamagedCheckpointError": ".errors",
    "DataError": ".errors",
    "DistributedError": ".errors",
    "ExportError": ".errors",
    "FlagError": ".errors",
    "ImageDecodeError": ".errors",
    "ModelFnError": ".errors",
    "NanLossError": ".errors",
    "NonFiniteError": ".errors",
    "RequestError": ".errors",
    "StateError": ".errors",
    "StorageError": ".errors",
    "UnknownNameError": ".errors",
    "UserCodeError": ".errors",
    # subpackages and modules loaded on first use
    "data": ".data",
    "hooks": ".hooks",
    "metrics": ".metrics",
    "precision": ".precision",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")
    module = importlib.import_module(where, __name__)
    value = module if where == f".{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
