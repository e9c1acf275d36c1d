"""Plain SGD applied inside the weight-gradient product of the large linear layers.

For a linear layer trained by plain SGD the backward writes ``grad_W = grad_y.T @ x`` (a full
weight-sized tensor) and the optimizer then reads the weight and that gradient and writes the
weight again. Where the weight is large and the batch small (the 4096x1001 classifier of
``trivial`` at batch 32: 16 MB of weight against 0.5 MB of activations) those passes over memory
cost as much as the product itself. :func:`update_in_backward` makes such layers accumulate the
product straight into the weight, ``W.addmm_(grad_y.T, x, beta=1 - lr * wd, alpha=-lr)``
(:class:`~stoker.kernels.linear.LinearSGDInBackwardFunction`): the same update to fp32 rounding,
no gradient written. Measured on a 2-core AVX2 EPYC, one thread, the ``trivial`` training step at
batch 32: 32-36 ms against 40-51 ms (three interleaved pairs, 2026-11-26; ``docs/bench-reference.md``).

What it needs, because the update happens before ``optimizer.step`` and no ``.grad`` is left for
anyone to read (:func:`run_refusal` and :func:`optimizer_refusal` say which is missing):

- ``torch.optim.SGD`` without momentum, nesterov or ``maximize`` (its ``weight_decay`` is applied);
- one process and one micro-batch per step (replicas must average gradients first; accumulation
  sums several backwards before one update), no gradient clipping or loss scaling (both need
  every gradient before any update), fp32 on the CPU, eager (no ``compile``/CUDA graph);
- no optimizer step pre-hooks (they read gradients), and nothing else that reads these
  weights' ``.grad`` (hooks, gradient summaries): it stays ``None``.

Layers: every :class:`~stoker.kernels.linear.OneDNNLinear` (``fast_linear`` on or auto) whose
weight the optimizer holds, requires grad and is used by no other module (a tied weight's second
use would read it after its update). Everything else keeps ordinary gradients and is updated by
``optimizer.step()``, which skips parameters without a gradient. Where a layer's forward falls
back to ``F.linear`` (tracing, another dtype) it gets an ordinary gradient and the optimizer
updates it: correct either way. A run and its resumption on this path are bitwise equal (each
kernel is deterministic); against the ordinary path the weights agree to fp32 rounding, and a
checkpoint of either path resumes on the other (the optimizer's state is the same).
"""

from __future__ import annotations

import collections

import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_pre_hooks

from ..errors import ConfigError
from ..resolve import Choice, Reason, spelled
from .linear import OneDNNLinear, SGDUpdate, plain_sgd_refusal

SGD_IN_BACKWARD_MODES: tuple[str, ...] = ("off", "auto", "on")


def optimizer_refusal(optimizer: torch.optim.Optimizer) -> str | None:
    """What this optimizer lacks for its update to run inside the backward (``"needs ..."``), or
    ``None`` when it can."""
    if type(optimizer) is not torch.optim.SGD:
        return f"needs torch.optim.SGD (the optimizer is {type(optimizer).__name__})"
    if optimizer._optimizer_step_pre_hooks or _global_optimizer_pre_hooks:
        return "needs an optimizer without step pre-hooks (they read the gradients: decay or clipping added there)"
    for i, group in enumerate(optimizer.param_groups):
        why = plain_sgd_refusal(group, f"param group {i}")
        if why is not None:
            return f"needs plain SGD ({why.removeprefix('it is plain SGD only; ')})"
    return None


def run_refusal(
    *,
    device: torch.device | None,
    world_size: int,
    precision: str,
    accumulation: int,
    clip_norm: float | None,
    compiled: bool,
    cuda_graph: bool,
    fast_linear: str,
) -> Reason | None:
    """What a run with these settings lacks for the update to run inside the backward
    (``"needs ..."``, naming the setting), or ``None`` when it can (``device`` ``None``: not
    known yet, not checked)."""
    if device is not None and device.type != "cpu":
        return Reason(lambda n: f"needs the CPU (this run's device is {device})")
    if fast_linear == "off":
        return Reason(
            lambda n: f"needs {n('fast_linear', 'auto')} or {n.value('on')} (the update runs in those layers)"
        )
    if compiled:
        return Reason(lambda n: f"needs no {n('compile')} (the update runs eagerly)")
    if cuda_graph:
        return Reason(lambda n: f"needs no {n('cuda_graph')}")
    if precision != "fp32":
        return Reason(lambda n: f"needs {n('precision', 'fp32')} (got {precision})")
    if world_size > 1:
        return Reason(lambda n: "needs one replica (replicas average gradients before the update)")
    if accumulation > 1:
        return Reason(
            lambda n: f"needs one micro-batch per step (got {n('gradient_accumulation_steps', accumulation)})"
        )
    if clip_norm is not None:
        return Reason(lambda n: f"needs no {n('gradient_clip_norm')} (clipping needs every gradient first)")
    return None


def sgd_in_backward_choice(mode: str, device_type: str, need: str | None) -> Choice[str]:
    """What ``RunConfig.sgd_in_backward`` (``mode``) does on a ``device_type`` device, with ``need``
    the run's (:func:`run_refusal`, and :func:`optimizer_refusal` once the optimizer is built)."""
    if device_type != "cpu":
        return Choice("off", "CPU only")
    if mode == "off":
        return Choice("off", Reason(lambda n: n("sgd_in_backward", "off")))
    if need is not None:
        return Choice("off", Reason(lambda n: f"it {spelled(need, n)}"))
    return Choice(mode, "in the fast linear layers that allow it, chosen at the first step")


def cannot_update_in_backward(need: str) -> ConfigError:
    """The error of ``sgd_in_backward='on'`` where the run ``need`` s something (to ``raise``)."""
    return ConfigError(
        Reason(
            lambda n: (
                f"{n('sgd_in_backward', 'on')} {spelled(need, n)}; use {n('sgd_in_backward', 'auto')} or "
                f"{n.value('off')}"
            )
        )
    )


def update_in_backward(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Make each eligible :class:`~stoker.kernels.linear.OneDNNLinear` of ``model`` apply
    ``optimizer``'s SGD update in its backward; return their names.

    Raises:
        ValueError: :func:`optimizer_refusal` refuses the optimizer.
    """
    why = optimizer_refusal(optimizer)
    if why is not None:
        raise ConfigError(f"sgd_in_backward: the optimizer {why}")
    group_of = {id(p): i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
    uses = collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, OneDNNLinear):
            continue
        weight = module.weight
        index = group_of.get(id(weight))
        eligible = (
            index is not None
            and uses[id(weight)] == 1
            and weight.requires_grad
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and type(weight) in (torch.Tensor, nn.Parameter)
        )
        if eligible:
            assert index is not None
            module.__dict__["sgd_update"] = SGDUpdate(optimizer, index)  # a plain attribute, not a submodule
            names.append(name)
        else:
            module.__dict__.pop("sgd_update", None)
    return names


def remove_update_in_backward(model: nn.Module) -> int:
    """Give every layer of ``model`` ordinary weight gradients again; return how many changed."""
    count = 0
    for module in model.modules():
        if module.__dict__.pop("sgd_update", None) is not None:
            count += 1
    return count


def updating_in_backward(model: nn.Module, *, ran: bool = False) -> list[str]:
    """Names of the layers of ``model`` set to update their weight in the backward (``ran``: only
    those whose backward has done so at least once; a module that calls ``F.linear`` on its own,
    such as ``FlattenDense`` on a channels_last batch, never runs its layer's update)."""
    names = []
    for name, module in model.named_modules():
        update = module.__dict__.get("sgd_update")
        if isinstance(update, SGDUpdate) and (update.ran or not ran):
            names.append(name)
    return names


__all__: list[str] = [
    "SGD_IN_BACKWARD_MODES",
    "optimizer_refusal",
    "cannot_update_in_backward",
    "remove_update_in_backward",
    "run_refusal",
    "sgd_in_backward_choice",
    "update_in_backward",
    "updating_in_backward",
]
