"""Activation recompute: named submodules drop their activations and recompute them in backward.

``RunConfig.recompute`` names what to recompute, and :func:`apply_recompute` wraps those
modules' ``forward`` in ``torch.utils.checkpoint.checkpoint`` (non-reentrant) when the model is
built:

- ``"all"``: the whole model (under pipeline parallelism: each stage's module). Only the
  model's inputs are kept; backward reruns the forward pass first. This lowers what is held
  *between* forward and backward, which is what matters when many micro-batches wait for their
  backward pass (pipelines), not the peak of a single step.
- glob patterns on module names (``named_modules()``; ``fnmatch`` rules, ``*`` also crosses
  dots), e.g. ``"layers.*"`` or ``("layers.0", "layers.1")``: only the outermost matches are
  wrapped (``layers.*`` wraps ``layers.0``, not also ``layers.0.attention``). Each wrapped module
  keeps only its inputs; its activations live again only while its own backward runs.

Gradients are bitwise those of the model without recompute: the recomputation runs the same
kernels on the same inputs, and ``checkpoint`` restores the RNG state (CPU, and the device's)
of the original forward so dropout draws the same masks. The wrapper replaces the module's
``forward`` attribute and adds no module, so parameter names, checkpoints and exported
programs are unchanged. It recomputes only when autograd records (``torch.is_grad_enabled()``);
evaluation, prediction and export run the plain forward.
"""

from __future__ import annotations

import fnmatch
import functools
import types
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError

#: set on a module whose forward recomputes (what :func:`recomputed_modules` reports)
_MARK = "_stoker_recompute"

RecomputeSpec = str | Sequence[str]


def select_modules(model: nn.Module, spec: RecomputeSpec) -> list[str]:
    """The names of the modules ``spec`` selects in ``model`` (``""``: the model itself).

    Raises ``ValueError`` naming ``RunConfig.recompute`` and listing the available module names
    when a pattern matches nothing.
    """
    if spec == "all":
        return [""]
    patterns = [spec] if isinstance(spec, str) else list(spec)
    names = [n for n, _ in model.named_modules() if n]
    chosen: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ConfigError(
                f"RunConfig.recompute: {pattern!r} matches no module of {type(model).__name__}; "
                f"its modules are: {_describe(names)} (or give 'all' for the whole model)"
            )
        chosen += [n for n in hits if n not in chosen]
    # Only the outermost: a module inside a recomputed one is recomputed with it already.
    return [n for n in chosen if not any(n.startswith(f"{outer}.") for outer in chosen if outer != n)]


def apply_recompute(model: nn.Module, spec: RecomputeSpec) -> list[str]:
    """Make the modules ``spec`` selects recompute their activations in backward; return
    their names. Applying it again to a module already wrapped changes nothing."""
    names = select_modules(model, spec)
    for name in names:
        module = model.get_submodule(name)
        if getattr(module, _MARK, False):
            continue
        module.forward = _recomputing(module)
        setattr(module, _MARK, True)
    return names


def recomputed_modules(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules that recompute (``""``: the model itself)."""
    return [n for n, m in model.named_modules() if getattr(m, _MARK, False)]


def _recomputing(module: nn.Module) -> Any:
    """``module``'s forward, recomputing. Bound to the module (not a closure over it), so a
    ``copy.deepcopy`` of the model (export makes one) recomputes its own layers, not the original's."""
    own = module.__dict__.get("forward")  # a forward set on the instance (not the class's)
    inner = own if own is not None else type(module).forward

    def recomputing_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        call = inner if own is not None else functools.partial(inner, self)
        if not torch.is_grad_enabled() or torch.compiler.is_exporting():
            return call(*args, **kwargs)
        # preserve_rng_state (the default) restores the RNG before recomputing: the same
        # dropout masks, so the gradients are bitwise those without recompute.
        return checkpoint(call, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)

    return types.MethodType(recomputing_forward, module)


def _describe(names: list[str], limit: int = 40) -> str:
    """The module names, shallow ones first, at most ``limit`` of them."""
    ordered = sorted(names, key=lambda n: (n.count("."), names.index(n)))
    shown = ", ".join(ordered[:limit])
    return shown if len(ordered) <= limit else f"{shown}, ... ({len(ordered) - limit} more)"


__all__ = ["RecomputeSpec", "apply_recompute", "recomputed_modules", "select_modules"]
