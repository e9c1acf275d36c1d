"""``AutoEnsembleEstimator``: AdaNet over a fixed pool of ordinary models.

Every iteration trains a fresh copy of every model in the pool (each with its own
optimizer) and forms candidate ensembles from them with the usual strategies and
ensemblers. A pool model is a plain ``nn.Module`` whose ``forward(features)`` returns
logits (or a ``Subnetwork``); its complexity is 0, so only ``adanet_beta`` penalises it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, UserCodeError
from .ensemble import Ensemble, Ensembler
from .estimator import Estimator
from .heads import Head
from .subnetwork import Builder, SimpleGenerator

__all__ = ["AutoEnsembleEstimator", "AutoEnsembleSubestimator"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
ModelOrFactory = nn.Module | Callable[[], nn.Module]


@dataclass(kw_only=True)
class AutoEnsembleSubestimator:
    """A pool entry: the model (an instance, copied and re-initialised each iteration, or a
    zero-argument factory) and the optimizer that trains it."""

    model: ModelOrFactory
    optimizer: OptimizerFactory


def _reinitialise(module: nn.Module) -> None:
    """Fresh weights for a copied module: every submodule's ``reset_parameters``."""
    for m in module.modules():
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()


class _PoolBuilder(Builder):
    def __init__(self, name: str, entry: AutoEnsembleSubestimator) -> None:
        self._name = name
        self.entry = entry

    @property
    def name(self) -> str:
        return self._name

    def build_subnetwork(
        self,
        features: Any,
        logits_dimension: int,
        training: bool,
        iteration_step: torch.Tensor,
        previous_ensemble: Ensemble | None,
    ) -> nn.Module:
        model = self.entry.model
        if isinstance(model, nn.Module):
            module = copy.deepcopy(model)
            _reinitialise(module)  # seeded by the search: a new, reproducible draw each iteration
            return module
        module = model()
        if not isinstance(module, nn.Module):
            raise UserCodeError(
                f"the candidate pool's factory {self._name!r} must return an nn.Module; got {type(module).__name__}"
            )
        return module

    def build_subnetwork_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return self.entry.optimizer(parameters)


class AutoEnsembleEstimator(Estimator):
    """AdaNet whose candidates are the models of ``candidate_pool``.

    Args:
        head: the task's head.
        candidate_pool: ``{name: AutoEnsembleSubestimator | nn.Module | factory}`` or a
            list of them (named ``candidate_<i>``). Bare modules and factories are trained
            with ``optimizer``.
        max_iteration_steps: training steps per iteration.
        optimizer: ``optimizer(parameters)`` for pool entries that do not bring their own.
        ensemblers / ensemble_strategies / ...: as ``stoker.adanet.Estimator``.
    """

    def __init__(
        self,
        head: Head,
        candidate_pool: Mapping[str, AutoEnsembleSubestimator | ModelOrFactory]
        | Sequence[AutoEnsembleSubestimator | ModelOrFactory],
        max_iteration_steps: int,
        *,
        optimizer: OptimizerFactory | None = None,
        ensemblers: Sequence[Ensembler] | None = None,
        **kwargs: Any,
    ) -> None:
        pool = (
            dict(candidate_pool)
            if isinstance(candidate_pool, Mapping)
            else {f"candidate_{i}": c for i, c in enumerate(candidate_pool)}
        )
        if not pool:
            raise ConfigError("candidate_pool is empty")
        builders = []
        for name, entry in pool.items():
            if not isinstance(entry, AutoEnsembleSubestimator):
                if not (isinstance(entry, nn.Module) or callable(entry)):
                    raise UserCodeError(
                        f"candidate_pool[{name!r}] must be an AutoEnsembleSubestimator, an nn.Module or a "
                        f"factory; got {type(entry).__name__}"
                    )
                if optimizer is None:
                    raise ConfigError(
                        f"candidate_pool[{name!r}] has no optimizer: wrap it in "
                        "AutoEnsembleSubestimator(optimizer=...) or pass optimizer="
                    )
                entry = AutoEnsembleSubestimator(model=entry, optimizer=optimizer)
            builders.append(_PoolBuilder(str(name), entry))
        super().__init__(head, SimpleGenerator(builders), max_iteration_steps, ensemblers=ensemblers, **kwargs)
