"""Ensemblers: how a candidate combines its subnetworks' outputs, and what that costs.

An ``Ensembler`` builds, for one candidate, a *combiner* module holding the candidate's
trainable ensemble parameters (mixture weights, bias) and mapping the members'
``Subnetwork`` outputs to the ensemble's logits and its complexity regulariser.

``ComplexityRegularizedEnsembler`` is AdaNet's: logits ``b + sum_j w_j . h_j`` with, per
member ``j``, a SCALAR ``w_j`` (times the member's logits), a VECTOR ``w_j`` (elementwise
over the logits) or a MATRIX ``W_j`` (``last_layer_j @ W_j``, ignoring the member's own
logits layer), and the regulariser ``sum_j (lambda * r(h_j) + beta) * ||w_j||_1`` (the
entrywise L1 norm). ``MeanEnsembler`` averages the members' logits and has no parameters.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, cast

import torch
from torch import nn

from ..errors import ConfigError
from .outputs import Subnetwork

#: A ``stoker.adanet.subnetwork.Builder``, carried through opaquely (to strategies). Not imported:
#: a Builder receives the previous ``Ensemble``, so subnetwork.py imports this module.
_BuilderRef = Any

__all__ = [
    "BatchedWeightedSum",
    "Combiner",
    "ComplexityRegularizedEnsembler",
    "Ensemble",
    "Ensembler",
    "MeanEnsembler",
    "Member",
    "MixtureWeightType",
    "WeightedSubnetwork",
    "subnetwork_key",
]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def subnetwork_key(iteration_number: int, name: str) -> str:
    """The name a subnetwork has in modules and checkpoints: ``t<iteration>_<builder name>``."""
    return f"t{iteration_number}_{name}"


class MixtureWeightType(str, enum.Enum):
    """Shape of a member's mixture weight: ``[]``, ``[logits_dimension]`` or ``[width, logits_dimension]``."""

    SCALAR = "scalar"
    VECTOR = "vector"
    MATRIX = "matrix"


@dataclass
class Member:
    """One subnetwork of a candidate being built: its key, and one example output (for shapes
    and complexity)."""

    key: str
    name: str
    iteration_number: int
    example: Subnetwork


@dataclass(eq=False)
class WeightedSubnetwork:
    """A member of a built ensemble.

    Attributes:
        name / iteration_number: the builder's name and the iteration that trained it.
        subnetwork: its output on the run's example batch (``shared`` and ``complexity`` are
            what generators read).
        module: the subnetwork module itself.
        weight: its mixture weight (a live view of the combiner's parameter; ``None`` for
            ensemblers without weights).
        builder: the ``Builder`` that built it (strategies receive these).
    """

    name: str
    iteration_number: int
    subnetwork: Subnetwork
    module: nn.Module
    weight: torch.Tensor | None
    builder: _BuilderRef | None = None

    @property
    def key(self) -> str:
        return subnetwork_key(self.iteration_number, self.name)


@dataclass(eq=False)
class Ensemble:
    """A candidate ensemble, as later iterations' generators and builders see it.

    Attributes:
        name: ``t<iteration>_<candidate>`` (plus ``_<ensembler>`` when there are several).
        candidate_name / ensembler_name: as in ``architecture-<t>.json``.
        iteration_number: the iteration that built it.
        weighted_subnetworks: its members, oldest first.
        combiner: the module holding its mixture weights and bias.
    """

    name: str
    candidate_name: str
    ensembler_name: str
    iteration_number: int
    weighted_subnetworks: list[WeightedSubnetwork]
    combiner: Combiner

    @property
    def subnetworks(self) -> list[Subnetwork]:
        return [w.subnetwork for w in self.weighted_subnetworks]

    @property
    def bias(self) -> torch.Tensor | None:
        return self.combiner.bias_term()

    @property
    def builders(self) -> list[_BuilderRef]:
        return [w.builder for w in self.weighted_subnetworks if w.builder is not None]

    def weight_of(self, key: str) -> torch.Tensor | None:
        """The mixture weight of the member ``key`` (``t<i>_<name>``), if it has one."""
        for j, w in enumerate(self.weighted_subnetworks):
            if w.key == key:
                return self.combiner.member_weight(j)
        return None


class Combiner(nn.Module, abc.ABC):
    """A candidate's ensemble parameters: members' outputs -> (logits, regulariser).

    ``members`` are the member keys, in the order ``forward`` receives their outputs.
    """

    def __init__(self, members: Sequence[str]) -> None:
        super().__init__()
        self.members = list(members)

    @abc.abstractmethod
    def forward(
        self, outputs: Sequence[Subnetwork], regularize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The ensemble's logits and complexity regulariser (``None``: none, or not asked for)."""

    def member_weight(self, j: int) -> torch.Tensor | None:
        """Member ``j``'s mixture weight, or ``None``."""
        return None

    def bias_term(self) -> torch.Tensor | None:
        return None


class Ensembler(abc.ABC):
    """Builds a candidate's ``Combiner`` and the optimizer of its parameters."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Written to ``architecture-<t>.json`` as ``ensembler_name``."""

    @abc.abstractmethod
    def build_ensemble(
        self, members: Sequence[Member], logits_dimension: int, previous_ensemble: Ensemble | None
    ) -> Combiner:
        """The combiner of a candidate whose members are ``members`` (oldest first)."""

    def build_optimizer(self, parameters: Sequence[nn.Parameter]) -> torch.optim.Optimizer | None:
        """The optimizer of the ensemble parameters of this ensembler's candidates, or
        ``None`` to leave them at their initial values."""
        return None


# ---------------------------------------------------------------- complexity regularised
class _WeightedSum(Combiner):
    """``b + sum_j w_j . h_j`` with the L1 complexity regulariser."""

    def __init__(
        self,
        members: Sequence[str],
        weights: Sequence[torch.Tensor],
        bias: torch.Tensor | None,
        mixture_weight_type: MixtureWeightType | str,
        adanet_lambda: float,
        adanet_beta: float,
        trainable: bool,
    ) -> None:
        super().__init__(members)
        self.mixture_weights = nn.ParameterList([nn.Parameter(w, requires_grad=trainable) for w in weights])
        self.bias = nn.Parameter(bias, requires_grad=trainable) if bias is not None else None
        self.mixture_weight_type = MixtureWeightType(mixture_weight_type)
        self.adanet_lambda = float(adanet_lambda)
        self.adanet_beta = float(adanet_beta)

    def forward(
        self, outputs: Sequence[Subnetwork], regularize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        matrix = self.mixture_weight_type is MixtureWeightType.MATRIX
        logits: torch.Tensor | None = None
        reg: torch.Tensor | None = None
        regularised = regularize and (self.adanet_lambda != 0.0 or self.adanet_beta != 0.0)
        for w, out in zip(self.mixture_weights, outputs, strict=True):
            term = out.last_layer @ w if matrix else out.logits * w
            logits = term if logits is None else logits + term
            if regularised:
                # (lambda * r(h) + beta) * ||w||_1, the AdaNet objective's penalty of member j
                coef = self.adanet_lambda * out.complexity + self.adanet_beta
                r = coef * w.abs().sum()
                reg = r if reg is None else reg + r
        assert logits is not None
        if self.bias is not None:
            logits = logits + self.bias
        return logits, reg

    def member_weight(self, j: int) -> torch.Tensor | None:
        return self.mixture_weights[j]

    def bias_term(self) -> torch.Tensor | None:
        return self.bias


class BatchedWeightedSum(nn.Module):
    """The SCALAR or VECTOR weighted sums of several candidates, as a few tensor ops per step.

    Training speed only: the candidates of one ensembler share their members' outputs, so
    their mixture weights are packed into one parameter ``weights`` of shape ``[C, K]``
    (SCALAR) or ``[C, K, D]`` (VECTOR): row ``c`` holds candidate ``c``'s weights in member
    order, padded with zeros to the largest member count ``K``. A step gathers each
    candidate's members' logits (``[C, K, ...]``, padding from a zero row) and contracts
    them with its weights. A candidate only ever reads its own members, so one member's
    NaN cannot leak into another candidate; padding entries get zero gradients. With an
    elementwise optimizer (SGD, Adam, Adagrad, RMSprop, ...) each candidate trains exactly as
    if it had its own. ``unpack`` copies the trained values back into each candidate's own
    ``Combiner`` (which is what is saved and rebuilt).
    """

    columns: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, combiners: Sequence[_WeightedSum]) -> None:
        super().__init__()
        first = combiners[0]
        self.combiners = list(combiners)  # plain list: not submodules, not in the state dict
        self.keys: list[str] = []
        for c in combiners:
            for k in c.members:
                if k not in self.keys:
                    self.keys.append(k)
        index = {k: m for m, k in enumerate(self.keys)}
        width = max(len(c.members) for c in combiners)
        self.padded = any(len(c.members) < width for c in combiners)
        pad = len(self.keys)  # the zero row appended when padding
        cols = [[index[k] for k in c.members] + [pad] * (width - len(c.members)) for c in combiners]
        shape = tuple(first.mixture_weights[0].shape)
        device = first.mixture_weights[0].device
        weights = torch.zeros((len(combiners), width, *shape), device=device)
        with torch.no_grad():
            for c, comb in enumerate(combiners):
                for j, w in enumerate(comb.mixture_weights):
                    weights[c, j] = w
        trainable = first.mixture_weights[0].requires_grad
        self.weights = nn.Parameter(weights, requires_grad=trainable)
        self.register_buffer(
            "columns", torch.tensor(cols, dtype=torch.long, device=device).reshape(-1), persistent=False
        )
        self.bias = None
        if first.bias is not None:  # the combiners share one signature(): each has a bias
            biases = [cast(nn.Parameter, c.bias).detach() for c in combiners]
            self.bias = nn.Parameter(torch.stack(biases), requires_grad=trainable)
        self.vector = first.mixture_weight_type is MixtureWeightType.VECTOR
        self.adanet_lambda = first.adanet_lambda
        self.adanet_beta = first.adanet_beta
        self._cols = cols
        self._coef_cache: dict[tuple[float, ...], torch.Tensor] = {}

    @staticmethod
    def signature(combiner: Combiner) -> tuple[Any, ...] | None:
        """Combiners with equal signatures can be batched together (None: never)."""
        if not isinstance(combiner, _WeightedSum) or combiner.mixture_weight_type is MixtureWeightType.MATRIX:
            return None
        w = combiner.mixture_weights[0]
        return (
            combiner.mixture_weight_type,
            tuple(w.shape),
            w.device,
            w.dtype,
            w.requires_grad,
            combiner.bias is not None,
            combiner.adanet_lambda,
            combiner.adanet_beta,
        )

    def _coefficients(self, outputs: Sequence[Subnetwork], device: torch.device) -> torch.Tensor:
        """``lambda * r(h) + beta`` of each candidate's members, ``[C, K]`` (0 for padding);
        cached while the complexities are Python floats."""
        complexities = [o.complexity for o in outputs]
        if all(not isinstance(c, torch.Tensor) for c in complexities):
            key = tuple(float(c) for c in complexities)
            cached = self._coef_cache.get(key)
            if cached is None:
                per_member = [self.adanet_lambda * c + self.adanet_beta for c in key] + [0.0]
                cached = torch.tensor([[per_member[m] for m in row] for row in self._cols], device=device)
                self._coef_cache[key] = cached
            return cached
        per_member_t = torch.stack(
            [
                torch.as_tensor(c, dtype=torch.float32, device=device).reshape(()) * self.adanet_lambda
                + self.adanet_beta
                for c in complexities
            ]
            + [torch.zeros((), device=device)]
        )
        return per_member_t.index_select(0, self.columns).reshape(len(self._cols), -1)

    def forward(
        self, outputs: Sequence[Subnetwork], regularize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``outputs`` follow ``self.keys``; returns logits ``[C, batch, ..., D]`` and the
        regulariser ``[C]`` (or None)."""
        stacked = torch.stack([o.logits for o in outputs])  # [M, B, ..., D]
        flat = stacked.reshape(stacked.shape[0], -1)  # [M, N]
        if self.padded:
            flat = torch.cat([flat, flat.new_zeros(1, flat.shape[1])])
        w = self.weights
        gathered = flat.index_select(0, self.columns).reshape(w.shape[0], w.shape[1], -1)  # [C, K, N]: own members only
        if self.vector:  # w: [C, K, D]
            d = stacked.shape[-1]
            logits = (gathered.reshape(*gathered.shape[:2], -1, d) * w.unsqueeze(2)).sum(1)
        else:  # w: [C, K]
            logits = torch.bmm(w.unsqueeze(1), gathered).squeeze(1)
        logits = logits.reshape(w.shape[0], *stacked.shape[1:])
        if self.bias is not None:
            logits = logits + self.bias.reshape(self.bias.shape[0], *([1] * (logits.dim() - 2)), self.bias.shape[-1])
        reg = None
        if regularize and (self.adanet_lambda != 0.0 or self.adanet_beta != 0.0):
            l1 = w.abs() if w.dim() == 2 else w.abs().sum(-1)  # ||w_ck||_1: [C, K]
            reg = (l1 * self._coefficients(outputs, w.device)).sum(1)
        return logits, reg

    def unpack(self) -> None:
        """Copy the trained values into every candidate's own combiner."""
        with torch.no_grad():
            for c, comb in enumerate(self.combiners):
                for j, w in enumerate(comb.mixture_weights):
                    w.copy_(self.weights[c, j])
                if comb.bias is not None and self.bias is not None:
                    comb.bias.copy_(self.bias[c])


@dataclass
class ComplexityRegularizedEnsembler(Ensembler):
    """AdaNet's ensembler: learned mixture weights with a complexity-weighted L1 penalty.

    Attributes:
        optimizer: ``optimizer(parameters) -> torch.optim.Optimizer`` for the mixture weights
            and biases; ``None`` leaves them at their initial values (as in the original).
        mixture_weight_type: SCALAR, VECTOR or MATRIX.
        mixture_weight_initializer: a float (every entry), or a function that fills a
            tensor in place (e.g. ``torch.nn.init.xavier_uniform_``). Default: ``1/N`` for
            SCALAR and VECTOR (N members), zeros for MATRIX.
        warm_start_mixture_weights: start the weights (and bias) of members that were in the
            previous ensemble from their learned values there, instead of the initializer.
        adanet_lambda / adanet_beta: the regulariser ``sum_j (lambda * r(h_j) + beta) ||w_j||_1``.
        use_bias: learn a bias ``b`` of shape ``[logits_dimension]`` (zeros at start).
        ensembler_name: written to ``architecture-<t>.json`` (default ``complexity_regularized``).
    """

    optimizer: OptimizerFactory | None = None
    _: KW_ONLY
    mixture_weight_type: MixtureWeightType | str = MixtureWeightType.SCALAR
    mixture_weight_initializer: float | Callable[[torch.Tensor], Any] | None = None
    warm_start_mixture_weights: bool = False
    adanet_lambda: float = 0.0
    adanet_beta: float = 0.0
    use_bias: bool = False
    ensembler_name: str = field(default="complexity_regularized")

    def __post_init__(self) -> None:
        self.mixture_weight_type = MixtureWeightType(self.mixture_weight_type)
        for attr in ("adanet_lambda", "adanet_beta"):
            value = getattr(self, attr)
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"ComplexityRegularizedEnsembler.{attr} must be a number >= 0; got {value!r}")

    @property
    def name(self) -> str:
        return self.ensembler_name

    def weight_shape(self, example: Subnetwork, logits_dimension: int) -> tuple[int, ...]:
        if self.mixture_weight_type is MixtureWeightType.SCALAR:
            return ()
        if self.mixture_weight_type is MixtureWeightType.VECTOR:
            return (logits_dimension,)
        return (int(example.last_layer.shape[-1]), logits_dimension)

    def initial_weight(self, shape: tuple[int, ...], num_members: int) -> torch.Tensor:
        """A fresh mixture weight of ``shape`` from the initializer (or the default)."""
        w = torch.empty(shape)
        init = self.mixture_weight_initializer
        with torch.no_grad():
            if init is None:
                w.fill_(0.0 if self.mixture_weight_type is MixtureWeightType.MATRIX else 1.0 / num_members)
            elif isinstance(init, (int, float)):
                w.fill_(float(init))
            else:
                init(w)
        return w

    def build_ensemble(
        self, members: Sequence[Member], logits_dimension: int, previous_ensemble: Ensemble | None
    ) -> Combiner:
        weights: list[torch.Tensor] = []
        device = members[0].example.logits.device if members else None
        for m in members:
            shape = self.weight_shape(m.example, logits_dimension)
            prior = (
                previous_ensemble.weight_of(m.key)
                if (previous_ensemble is not None and self.warm_start_mixture_weights)
                else None
            )
            if prior is not None and tuple(prior.shape) == shape:
                weights.append(prior.detach().clone().cpu())
            else:
                weights.append(self.initial_weight(shape, len(members)))
        bias = None
        if self.use_bias:
            prior_bias = (
                previous_ensemble.bias if (previous_ensemble is not None and self.warm_start_mixture_weights) else None
            )
            bias = prior_bias.detach().clone().cpu() if prior_bias is not None else torch.zeros(logits_dimension)
        combiner = _WeightedSum(
            [m.key for m in members],
            weights,
            bias,
            self.mixture_weight_type,
            self.adanet_lambda,
            self.adanet_beta,
            trainable=self.optimizer is not None,
        )
        return combiner.to(device) if device is not None else combiner

    def build_optimizer(self, parameters: Sequence[nn.Parameter]) -> torch.optim.Optimizer | None:
        if self.optimizer is None or not parameters:
            return None
        return self.optimizer(parameters)


# ---------------------------------------------------------------- mean
class _Mean(Combiner):
    def forward(
        self, outputs: Sequence[Subnetwork], regularize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = outputs[0].logits
        for out in outputs[1:]:
            logits = logits + out.logits
        return (logits / len(outputs) if len(outputs) > 1 else logits), None


@dataclass
class MeanEnsembler(Ensembler):
    """The unweighted mean of the members' logits; nothing to train, no regulariser."""

    ensembler_name: str = "mean"

    @property
    def name(self) -> str:
        return self.ensembler_name

    def build_ensemble(
        self, members: Sequence[Member], logits_dimension: int, previous_ensemble: Ensemble | None
    ) -> Combiner:
        return _Mean([m.key for m in members])
