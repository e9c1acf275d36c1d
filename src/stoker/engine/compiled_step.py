"""``RunConfig(compile="step")``: the whole training step compiled, the analogue of a compiled device loop.

``torch.compile`` of the module alone (``compile="module"``) compiles the forward and, through
AOTAutograd, its backward; loss scaling, gradient clipping and the optimizer update stay eager,
a Python loop of small kernels per parameter. ``CompiledTrainStep`` compiles two regions per step:

1. **forward + loss**: ``model_fn`` under autocast, the loss divided by
   ``gradient_accumulation_steps`` and multiplied by the loss scale (a device tensor, so a
   changing dynamic scale does not recompile). AOTAutograd compiles its backward with it, and
   ``loss.backward()`` runs that compiled backward.
2. **the update**: gradient clipping and ``optimizer.step()`` in one graph (PyTorch's
   "compiled optimizer"), called without ``Optimizer.step``'s wrappers: their deliberate
   graph breaks (for ``no_grad``) would compile the optimizer class's ``step`` as a frame of
   its own, cached per optimizer *instance* on the class's code object, which runs out of
   dynamo's recompile limit after a few Estimators in one process. The step's hooks run
   eagerly around it and ``no_grad`` is set outside the compiled region. The learning rate of
   every param group is handed in as a 0-dim tensor for the duration of the call, so an LR
   schedule changes a tensor's value instead of a
   Python float the graph would specialise on (no recompiles), and the optimizer's
   ``state_dict`` keeps its plain float ``lr``: checkpoints are the eager format.

Measured on torch 2.13 CPU (the MLP of ``benchmarks/overhead.py``), this split was as fast as
tracing ``backward()`` inside one region (``torch._dynamo.config.trace_autograd_ops``, which
still broke the graph) and 5x faster than compiled autograd, compiled in half the time, and
matched eager within 1e-7 after 20 steps (SGD).

Unscaling and the fp16 "found inf" check stay eager (one fused foreach kernel); with dynamic
loss scaling the step still reads that flag on the host, as the eager step does. The module is
not wrapped, so ``state_dict`` keys carry no ``_orig_mod.`` prefix and eager and compiled runs
resume each other's checkpoints.
"""

from __future__ import annotations

import inspect
import logging
import time
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo.exc  # named in an except clause: imported here, not left to torch.compile
import torch._dynamo.utils
import torch.optim.optimizer as _optim

from ..data._tree import batch_rows
from ..errors import ConfigError, ModelFnError, StokerError
from ..precision import autocast_context
from ..spec import ModeKeys
from .infeed import Infeed
from .loop import _NO_TRAIN_LOSS, TrainStep, _check_train_batch, _snapshot_host_call, check_spec, detach_cache

log = logging.getLogger("stoker")

#: Recompilations (after the second step, which compiles the update again for the optimizer's
#: new state) beyond which training stops with a ``CompileError``: a step that keeps
#: recompiling is slower than eager.
RECOMPILE_LIMIT = 4


class CompileError(StokerError):
    """The training step cannot be compiled (or keeps recompiling); the message names the cause."""


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``fn`` with its own code object: dynamo caches compiled graphs per code object,
    so every step (every Estimator) gets its own cache and its own recompile count."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _forward(module, model_fn, features, labels, params, precision, device, divisor, scale):  # noqa: ANN001, ANN202
    with autocast_context(precision, device):
        spec = model_fn(module, features, labels, ModeKeys.TRAIN, params)
    loss = spec.loss
    scaled = loss
    if isinstance(loss, torch.Tensor):
        if divisor != 1:
            scaled = scaled / divisor
        if scale is not None:
            scaled = scaled * scale
    return spec, scaled


def _update(raw_step, optimizer, parameters, clip_norm):  # noqa: ANN001, ANN202
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
    raw_step(optimizer)


def _graph_break_reasons() -> dict[str, int]:
    return dict(torch._dynamo.utils.counters["graph_break"])


def _first_line(reason: str) -> str:
    return " ".join(reason.strip().splitlines()[0].split())


class _Compiled:
    """The two compiled regions of one optimizer's step and the graphs compiled for them."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.compilations = 0
        self.forward = torch.compile(_fresh(_forward), backend=self._backend, dynamic=False)
        self.update = torch.compile(_fresh(_update), backend=self._backend, dynamic=False)
        self.lr = [torch.zeros((), dtype=torch.float64, device=device) for _ in optimizer.param_groups]
        # Optimizer.step without its wrappers (hooks, profiling, the no_grad graph breaks).
        if optimizer.defaults.get("differentiable"):
            raise ConfigError(
                f"RunConfig.compile='step' does not support a differentiable optimizer ({type(optimizer).__name__}"
                "(differentiable=True)); use compile='module' or compile=False"
            )
        self.raw_step = inspect.unwrap(type(optimizer).step)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        self.compilations += 1
        return compile_fx(gm, example_inputs)


_COMPILED: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Compiled] = weakref.WeakKeyDictionary()


class CompiledTrainStep(TrainStep):
    """A ``TrainStep`` whose forward+loss(+backward) and update run as compiled graphs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # One compiled pair per optimizer, kept across train() calls (train_and_evaluate trains
        # in pieces): a later call reuses the graphs instead of compiling again.
        compiled = _COMPILED.get(self.optimizer)
        if compiled is None:
            compiled = _COMPILED[self.optimizer] = _Compiled(self.optimizer, self.device)
        self._compiled = compiled
        self._forward, self._update, self._lr = compiled.forward, compiled.update, compiled.lr
        self.recompiles = 0  # later steps that compiled again
        self._first_shapes: str | None = None
        self._compiled_once = compiled.compilations > 0
        self._warm = self._compiled_once  # past step 2: any compilation from now on is a recompile
        self._scale: torch.Tensor | None = None
        self._scale_value: float | None = None

    @property
    def compilations(self) -> int:
        """Graphs compiled so far for this optimizer's step (a step with graph breaks has several)."""
        return self._compiled.compilations

    def __call__(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        if not self._compiled_once:
            return self._first_call(infeed)
        before = self.compilations
        start = time.perf_counter()
        out = self._step(infeed)
        if self.compilations != before:
            if not self._warm:  # the optimizer's state appeared in step 1: its update compiles again
                log.info(
                    "compiled the update again for the optimizer's new state in %.1f s", time.perf_counter() - start
                )
            else:
                self._recompiled()
        self._warm = True
        return out

    def _first_call(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        breaks = _graph_break_reasons()
        start = time.perf_counter()
        try:
            out = self._step(infeed)
        except torch._dynamo.exc.TorchDynamoException as e:  # Unsupported, BackendCompilerFailed, ...
            raise CompileError(
                f"compile='step': the training step cannot be compiled: {_first_line(str(e))}; "
                "make model_fn traceable, or use compile='module' or compile=False"
            ) from e
        self._compiled_once = True
        log.info(
            "compiled the training step in %.1f s (%d graphs; the first step included)",
            time.perf_counter() - start,
            self.compilations,
        )
        new = {r: n - breaks.get(r, 0) for r, n in _graph_break_reasons().items() if n > breaks.get(r, 0)}
        mine = list(new)
        if mine:
            warnings.warn(
                "compile='step': model_fn does not compile as one graph; graph breaks: "
                + "; ".join(_first_line(r) for r in mine)
                + (
                    ". Each break runs Python between graphs; remove it (e.g. .item(), print, data-dependent if) for "
                    "speed"
                ),
                stacklevel=2,
            )
        return out

    def _recompiled(self) -> None:
        shapes = self._last_shapes
        self.recompiles += 1
        if self.recompiles > RECOMPILE_LIMIT:
            raise CompileError(
                f"compile='step': the training step was recompiled {self.recompiles} times; its inputs keep "
                f"changing (first batch {self._first_shapes}, this one {shapes}): give every batch the same "
                "shapes (drop_remainder, fixed sequence length) and keep Python values model_fn branches on fixed, "
                "or use compile='module' or compile=False"
            )
        log.info(
            "compile='step': recompiled the training step (batch %s; the first was %s)", shapes, self._first_shapes
        )

    def _scale_tensor(self) -> torch.Tensor | None:
        if self.scaler is None:
            return None
        if self._scale is None:
            self._scale = torch.zeros((), dtype=torch.float32, device=self.device)
        if self._scale_value != self.scaler.scale:
            self._scale.fill_(self.scaler.scale)
            self._scale_value = self.scaler.scale
        return self._scale

    def _step(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        loss_sum: torch.Tensor | None = None
        host_call = None
        scale = self._scale_tensor()
        for micro in range(self.accumulation):
            batch = next(infeed)
            self._last_shapes = _shapes(batch.features)
            if self._first_shapes is None:
                self._first_shapes = self._last_shapes
            spec, scaled = self._forward(
                self.module,
                self.model_fn,
                batch.features,
                batch.labels,
                self.params,
                self.precision.name,
                self.device,
                self.accumulation,
                scale,
            )
            if not self._checked:
                check_spec(spec, ModeKeys.TRAIN)
                _check_train_batch(batch_rows(batch.features) or 0, self.params["batch_size"])
                self._checked = True
            if spec.loss is None:  # check_spec ran at the first step only
                raise ModelFnError(_NO_TRAIN_LOSS)
            if spec.cache is not None or self.carries_cache:
                self.params["cache"] = detach_cache(spec.cache)
                self.carries_cache = True
            if self._no_sync is not None and micro < self.accumulation - 1:
                with self._no_sync():
                    scaled.backward()
            else:
                scaled.backward()
            detached = spec.loss.detach()
            loss_sum = detached if loss_sum is None else loss_sum + detached
            if spec.host_call is not None:
                host_call = _snapshot_host_call(spec.host_call)
        apply = self.precision.optimizer_step(self.parameters, self._compiled_update)
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            if apply:
                self.schedule.step()
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    self.schedule.step()
        assert loss_sum is not None
        return (loss_sum / self.accumulation if self.accumulation > 1 else loss_sum), host_call

    def _compiled_update(self) -> None:
        groups = self.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        for g, t in zip(groups, self._lr, strict=True):
            if isinstance(g["lr"], torch.Tensor):
                continue  # the user's optimizer already holds a tensor LR
            t.fill_(g["lr"])
            g["lr"] = t
        opt = self.optimizer
        try:
            # What Optimizer.step's wrappers do, around the undecorated step: its hooks run
            # eagerly (the bench's weight decay is one), and no_grad is set outside the
            # compiled region instead of by the wrapper's deliberate graph breaks, so the update
            # is one graph in this step's own dynamo cache (the breaks would cache the
            # optimizer class's step per instance: 8 optimizers per process, then eager).
            for hook in (*_optim._global_optimizer_pre_hooks.values(), *opt._optimizer_step_pre_hooks.values()):
                if hook(opt, (opt,), {}) is not None:
                    raise CompileError(
                        "compile='step': an optimizer step pre-hook that changes step's arguments is not supported"
                    )
            with torch.no_grad():
                self._update(self._compiled.raw_step, opt, self.parameters, self.clip_norm)
            opt._opt_called = True  # type: ignore[attr-defined]  # as the LR scheduler's step tracker does
            for hook in (*opt._optimizer_step_post_hooks.values(), *_optim._global_optimizer_post_hooks.values()):
                hook(opt, (opt,), {})
        finally:
            for g, value in zip(groups, saved, strict=True):
                g["lr"] = value


def _shapes(features: Any) -> str:
    if isinstance(features, torch.Tensor):
        return f"{list(features.shape)} {str(features.dtype).removeprefix('torch.')}"
    if isinstance(features, dict):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in features.items()) + "}"
    if isinstance(features, (list, tuple)):
        return "(" + ", ".join(_shapes(v) for v in features) + ")"
    return type(features).__name__


def check_compiled_step_supported(*, strategy_name: str, shards_state: bool) -> None:
    """Refuse what the compiled step does not support, naming the option."""
    if shards_state:
        raise ConfigError(
            f"RunConfig.compile='step' is not supported with strategy {strategy_name!r} (sharded, FSDP2): "
            "use compile='module' or compile=False"
        )


__all__ = ["RECOMPILE_LIMIT", "CompileError", "CompiledTrainStep", "check_compiled_step_supported"]
