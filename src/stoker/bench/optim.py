"""Optimizers and learning-rate schedules with tf_cnn_benchmarks' semantics.

- ``sgd``: plain gradient descent.
- ``momentum``: TensorFlow's ``MomentumOptimizer(use_nesterov=True)``, which is
  ``torch.optim.SGD(momentum=m, nesterov=True)`` (both start the accumulator at the first
  gradient).
- ``rmsprop``: TensorFlow's ``RMSPropOptimizer``, which differs from ``torch.optim.RMSprop``
  in three ways that matter with tf_cnn_benchmarks' default ``epsilon = 1.0``: the mean
  square starts at 1 (not 0), epsilon is added inside the square root, and the learning rate
  is applied inside the momentum accumulator. :class:`TFRMSProp` implements it.
- ``adam``: ``torch.optim.Adam``. TensorFlow applies epsilon after the bias correction of the
  learning rate (``eps_tf = eps_torch * sqrt(1 - beta2^t)``); with ``1e-8`` the difference is
  below fp32 rounding for any realistic gradient.

The learning rate follows ``get_learning_rate``: a piecewise-constant schedule over epochs,
or an initial rate with optional staircase exponential decay and a floor, then optional
linear warm-up from 0.

Weight decay: tf_cnn_benchmarks adds ``weight_decay * sum(w^2) / 2`` to the loss, whose
gradient is ``weight_decay * w``. Differentiating it through autograd costs a norm backward
per parameter (it halved the speed of the ``trivial`` model); adding ``weight_decay * w`` to
the gradients in one fused operation is the same update. It runs in an optimizer pre-step
hook, so the order is TensorFlow's: the gradients are unscaled (fp16), the decay is added,
``--gradient_clip`` clips every element to ``[-c, c]``, then the optimizer updates. The
reported loss still includes the L2 value (``train.py``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from .config import BenchConfig, parse_piecewise_schedule  # parsed where the flag is validated

OptimizerFn = Callable[[dict[str, Any], Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
ScheduleFn = Callable[[dict[str, Any], torch.optim.Optimizer], Any]


class TFRMSProp(torch.optim.Optimizer):
    """RMSProp as TensorFlow 1 computes it::

    ms  = decay * ms + (1 - decay) * g^2          # ms starts at 1
    mom = momentum * mom + lr * g / sqrt(ms + eps)
    w  -= mom
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        decay: float = 0.9,
        momentum: float = 0.0,
        eps: float = 1e-10,
        capturable: bool = False,
    ) -> None:
        if lr < 0 or not 0 <= decay <= 1 or momentum < 0 or eps < 0:
            raise ConfigError(
                f"TFRMSProp: bad hyper-parameters lr={lr}, decay={decay}, momentum={momentum}, eps={eps}; "
                "lr, momentum and eps must be >= 0 and decay within [0, 1]"
            )
        # capturable: step() reads nothing back to the host, and takes a device-tensor lr (as the
        # CUDA-graph step hands it), so a CUDA graph can capture it. A float lr runs as before.
        defaults = {"lr": lr, "decay": decay, "momentum": momentum, "eps": eps, "capturable": capturable}
        super().__init__(params, defaults)

    @torch.no_grad()
    # override: torch overloads step on closure (None -> None, a closure -> float), this is one def
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            for p in params:
                state = self.state[p]
                if not state:
                    state["ms"] = torch.ones_like(p, memory_format=torch.preserve_format)
                    state["mom"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            ms = [self.state[p]["ms"] for p in params]
            mom = [self.state[p]["mom"] for p in params]
            torch._foreach_mul_(ms, group["decay"])
            torch._foreach_addcmul_(ms, grads, grads, value=1.0 - group["decay"])
            denom = torch._foreach_add(ms, group["eps"])
            torch._foreach_sqrt_(denom)
            torch._foreach_mul_(mom, group["momentum"])
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):  # a CUDA graph's rate: float() would read it back (a host sync)
                scaled = torch._foreach_div(grads, denom)
                torch._foreach_mul_(scaled, lr)
                torch._foreach_add_(mom, scaled)
            else:
                torch._foreach_addcdiv_(mom, grads, denom, value=float(lr))
            torch._foreach_sub_(params, mom)
        return loss


def learning_rate_fn(
    cfg: BenchConfig,
    batches_per_epoch: float,
    *,
    default_lr: float | None = None,
    model_rate: Callable[[int], float] | None = None,
) -> Callable[[int], float] | None:
    """The learning rate of global step ``step`` (0-based), or ``None`` when it is constant.

    Without a rate flag the rate is the model's: ``model_rate`` (a schedule) or ``default_lr``
    (a constant; stoker's fallback 0.005 when not given).
    """
    warmup_steps = int(batches_per_epoch * cfg.num_learning_rate_warmup_epochs)
    init_lr = learning_rate(cfg, default_lr)
    if model_rate is not None and _no_rate_flag(cfg):
        base = model_rate
        init_lr = model_rate(warmup_steps)  # --num_learning_rate_warmup_epochs ramps up to the schedule
    elif cfg.piecewise_learning_rate_schedule is not None:
        epochs, rates = parse_piecewise_schedule(cfg.piecewise_learning_rate_schedule)
        # Rate i applies while step <= boundary i (TensorFlow's piecewise_constant).
        boundaries = [int(e * batches_per_epoch) - 1 for e in epochs]

        def base(step: int) -> float:
            return rates[bisect.bisect_left(boundaries, step)]
    elif cfg.num_epochs_per_decay > 0 and cfg.learning_rate_decay_factor > 0:
        decay_steps = max(1, int(batches_per_epoch * cfg.num_epochs_per_decay))
        factor, floor = cfg.learning_rate_decay_factor, cfg.minimum_learning_rate

        def base(step: int) -> float:
            return max(init_lr * factor ** (step // decay_steps), floor)
    elif warmup_steps > 0:

        def base(step: int) -> float:
            return init_lr
    else:
        return None
    if warmup_steps <= 0:
        return base

    def with_warmup(step: int) -> float:
        return init_lr * step / warmup_steps if step < warmup_steps else base(step)

    return with_warmup


@dataclasses.dataclass(frozen=True)
class UpdatePlan:
    """How :func:`make_optimizer` builds this run's update (see :func:`update_plan`)."""

    fused: bool  # torch's fused kernel (SGD and momentum, Adam)
    capturable: bool  # step() reads nothing back to the host: a CUDA graph can capture it
    decay_inside: bool  # the kernel applies --weight_decay in its one pass; else a pre-step hook adds it


def update_plan(cfg: BenchConfig, device_type: str, *, plain: bool = True) -> UpdatePlan:
    """How the update of ``cfg`` is built for parameters on ``device_type`` (``plain``: every
    parameter is a plain tensor, fp32 on CPU; no subclass such as FSDP's DTensor). No device is
    touched, so the choice is tested on CPU for a CUDA target.

    - **CPU**, ``--optimizer=sgd`` or ``momentum`` without ``--gradient_clip`` (which must clip
      the decayed gradient): torch's fused SGD with the weight decay inside it. ``g += wd * w``
      then ``w -= lr * g`` as two passes over every weight and gradient is memory-bound work a
      single fused pass halves (trivial on a 2-core AVX2 CPU: 8 % of the step was the decay
      pass). Adam and RMSProp stay as they were.
    - **CUDA**: every update is capturable, so ``--cuda_graph`` captures it: SGD and momentum
      as the fused kernel (the decay inside, unless ``--gradient_clip``: then the pre-hook adds
      and clips it, on the device), Adam fused and capturable, RMSProp (:class:`TFRMSProp`,
      which has no fused kernel) capturable.
    - ``--compile=step`` compiles the optimizer's own code: nothing is fused there.
    """
    none = UpdatePlan(fused=False, capturable=False, decay_inside=False)
    if not plain or cfg.compile_mode == "step":
        return none
    sgd = cfg.optimizer in ("sgd", "momentum")
    if device_type == "cpu":
        fused = sgd and cfg.gradient_clip is None
        return UpdatePlan(fused=fused, capturable=False, decay_inside=fused)
    if device_type == "cuda":
        return UpdatePlan(
            fused=cfg.optimizer != "rmsprop", capturable=True, decay_inside=sgd and cfg.gradient_clip is None
        )
    return none


def _placement(parameters: Sequence[torch.nn.Parameter]) -> tuple[str, bool]:
    """The parameters' device type (``"mixed"`` where they differ) and whether all are plain tensors
    (fp32 ones on CPU, where the fused kernel is used for fp32 only)."""
    types = {p.device.type for p in parameters}
    device_type = types.pop() if len(types) == 1 else "mixed"
    plain = bool(parameters) and all(
        type(p) in (torch.Tensor, torch.nn.Parameter) and (p.device.type != "cpu" or p.dtype == torch.float32)
        for p in parameters
    )
    return device_type, plain


def fuses_weight_decay(cfg: BenchConfig, parameters: Sequence[torch.nn.Parameter]) -> bool:
    """Whether the update of this run is torch's fused SGD kernel with the weight decay inside it
    (:func:`update_plan` for these parameters)."""
    device_type, plain = _placement(parameters)
    return update_plan(cfg, device_type, plain=plain).decay_inside


def make_optimizer(
    cfg: BenchConfig, parameters: Iterable[torch.nn.Parameter], lr: float, *, device_type: str | None = None
) -> torch.optim.Optimizer:
    """The optimizer ``--optimizer`` names, with its hyper-parameter flags, at rate ``lr``, built
    as :func:`update_plan` says for where the parameters are (``device_type``: as for parameters
    on such a device instead; see :func:`optimizer_for`).

    The weight decay is added to the gradients by a step pre-hook, or, where the plan says so,
    by torch's fused SGD kernel (the same update, one pass).
    """
    opt: torch.optim.Optimizer
    parameters = list(parameters)
    placed, plain = _placement(parameters)
    plan = update_plan(cfg, device_type or placed, plain=plain)
    decay = cfg.weight_decay if plan.decay_inside else 0.0
    fused = plan.fused or None  # None: torch's default (foreach where it applies)
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(parameters, lr=lr, weight_decay=decay, fused=fused)
    elif cfg.optimizer == "momentum":
        opt = torch.optim.SGD(parameters, lr=lr, momentum=cfg.momentum, nesterov=True, weight_decay=decay, fused=fused)
    elif cfg.optimizer == "rmsprop":
        opt = TFRMSProp(
            parameters,
            lr=lr,
            decay=cfg.rmsprop_decay,
            momentum=cfg.rmsprop_momentum,
            eps=cfg.rmsprop_epsilon,
            capturable=plan.capturable,
        )
    else:
        opt = torch.optim.Adam(
            parameters,
            lr=lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_epsilon,
            fused=fused,
            capturable=plan.capturable,
        )
    if not plan.decay_inside and (cfg.weight_decay or cfg.gradient_clip is not None):
        opt.register_step_pre_hook(_decay_and_clip(cfg.weight_decay, cfg.gradient_clip))
    opt.register_load_state_dict_post_hook(_keep_settings(opt))
    return opt


def optimizer_for(cfg: BenchConfig, device_type: str) -> torch.optim.Optimizer:
    """The optimizer :func:`make_optimizer` builds for this run's parameters on a ``device_type``
    device, over one fp32 CPU stand-in parameter: the same class, flags (``fused``,
    ``capturable``) and hooks, so the engine's checks of the built optimizer
    (:mod:`stoker.engine.cuda_graph_step`) can be asked before anything is built, without the device.
    (torch builds fused and capturable optimizers over CPU tensors; only their ``step`` would refuse.)"""
    return make_optimizer(cfg, [torch.nn.Parameter(torch.zeros(1))], 1.0, device_type=device_type)


def _keep_settings(optimizer: torch.optim.Optimizer) -> Callable[[torch.optim.Optimizer], None]:
    """A load_state_dict post-hook: how the update runs is this run's choice, not the checkpoint's.

    ``load_state_dict`` replaces every param group's hyper-parameters with the saved ones. A
    checkpoint written where the decay ran as a pre-hook (group ``weight_decay`` 0) would resume
    a fused run without decay, and one written by a fused run (group ``weight_decay`` > 0) would
    decay twice in a run with the pre-hook; so the keys are put back as this run built them. A
    fused or capturable Adam keeps its step counters on the parameters' device; one resumed from
    an unfused run's checkpoint (counters on the host) gets them moved there.
    """
    keys = ("weight_decay", "fused", "capturable")
    built: dict[str, Any] = {k: optimizer.param_groups[0][k] for k in keys if k in optimizer.param_groups[0]}

    def hook(opt: torch.optim.Optimizer) -> None:
        for group in opt.param_groups:
            group.update(built)
        if built.get("fused") or built.get("capturable"):
            for param, state in opt.state.items():
                step = state.get("step") if isinstance(state, dict) else None
                if isinstance(step, torch.Tensor) and isinstance(param, torch.Tensor) and step.device != param.device:
                    state["step"] = step.to(device=param.device, dtype=torch.float32)

    return hook


def _decay_and_clip(weight_decay: float, clip: float | None) -> Callable[..., None]:
    """An optimizer pre-step hook: ``g += weight_decay * w``, then clip ``g`` to ``[-clip, clip]``.

    It runs inside ``optimizer.step()``, after the engine has unscaled fp16 gradients (and not
    at all for a step the loss scaler skips), so both apply to true gradients.
    """

    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if weight_decay:
            torch._foreach_add_(grads, params, alpha=weight_decay)
        if clip is not None:
            torch._foreach_clamp_min_(grads, -clip)
            torch._foreach_clamp_max_(grads, clip)

    return hook


def learning_rate(cfg: BenchConfig, default_lr: float | None = None) -> float:
    """The initial rate: the flags' (``--init_learning_rate``, or the first piece of the schedule),
    else ``default_lr`` (the model's constant rate), else stoker's fallback."""
    if _no_rate_flag(cfg) and default_lr is not None:
        return default_lr
    return cfg.learning_rate


def _no_rate_flag(cfg: BenchConfig) -> bool:
    return cfg.init_learning_rate is None and cfg.piecewise_learning_rate_schedule is None


def optimizer_and_schedule(
    cfg: BenchConfig,
    batches_per_epoch: float,
    *,
    default_lr: float | None = None,
    model_rate: Callable[[int], float] | None = None,
) -> tuple[OptimizerFn, ScheduleFn | None]:
    """The Estimator's ``optimizer`` and ``lr_schedule`` arguments for this configuration
    (``default_lr`` / ``model_rate``: the model's rate, see :func:`learning_rate_fn`)."""
    schedule = learning_rate_fn(cfg, batches_per_epoch, default_lr=default_lr, model_rate=model_rate)
    if schedule is None:
        lr = learning_rate(cfg, default_lr)
        return (lambda params, parameters: make_optimizer(cfg, parameters, lr)), None
    # LambdaLR multiplies the optimizer's rate by the function's value: with a base rate of 1
    # the function gives the rate itself. It is stepped after every update, so step t runs at
    # schedule(t), as TensorFlow reads the rate from the global step before incrementing it.
    return (
        (lambda params, parameters: make_optimizer(cfg, parameters, 1.0)),
        (lambda params, optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)),
    )
