"""The device loop: N training steps per host round trip, values kept on the device.

Stepping (this module) is kept apart from iterating (``infeed.py``). A *step* is one optimizer
update: ``gradient_accumulation_steps`` micro-batches of forward + backward, then (fp16)
unscale and inf check, optional clipping, the update, the LR schedule. A *loop* runs up to
``iterations_per_loop`` steps. Inside it nothing is read back to the host: each step's loss
and ``host_call`` values are kept as device tensors (the outfeed) and copied to the host
once, when the loop ends (on a CPU device, where reading waits for nothing, losses and dict
``host_call`` values are read as they come). The one exception is fp16 with dynamic loss
scaling, which must read an "inf found" flag each step to decide whether to skip the update.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..data._tree import batch_rows
from ..distributed import Strategy
from ..distributed.watchdog import BETWEEN_LOOPS, Progress
from ..errors import ModelFnError
from ..hooks.base import LoopResult, RunContext
from ..precision import Precision
from ..spec import EstimatorSpec, ModeKeys
from .infeed import Infeed

log = logging.getLogger("stoker")

ModelFn = Callable[[nn.Module, Any, Any, ModeKeys, dict[str, Any]], EstimatorSpec]

_NO_TRAIN_LOSS = "model_fn returned EstimatorSpec(loss=None) in TRAIN mode; training needs a scalar loss tensor"


def check_spec(spec: Any, mode: ModeKeys) -> EstimatorSpec:
    """Validate what ``model_fn`` returned in ``mode``; one-line errors that say what to change."""
    if not isinstance(spec, EstimatorSpec):
        raise ModelFnError(f"model_fn must return a stoker.EstimatorSpec; it returned a {type(spec).__name__}")
    if mode is ModeKeys.TRAIN:
        if spec.loss is None:
            raise ModelFnError(_NO_TRAIN_LOSS)
        if not isinstance(spec.loss, torch.Tensor) or spec.loss.dim() != 0:
            shape = list(spec.loss.shape) if isinstance(spec.loss, torch.Tensor) else type(spec.loss).__name__
            raise ModelFnError(
                f"EstimatorSpec.loss must be a scalar tensor in TRAIN mode; got {shape} (reduce it with .mean())"
            )
        if not spec.loss.requires_grad:
            raise ModelFnError(
                "EstimatorSpec.loss does not require grad: it is not computed from the model's trainable parameters"
            )
    return spec


class TrainStep:
    """One optimizer step over ``accumulation`` micro-batches."""

    def __init__(
        self,
        *,
        module: nn.Module,
        model_fn: ModelFn,
        optimizer: torch.optim.Optimizer,
        schedule: Any,
        precision: Precision,
        device: torch.device,
        params: dict[str, Any],
        accumulation: int = 1,
        clip_norm: float | None = None,
    ) -> None:
        self.module = module
        self.model_fn = model_fn
        self.optimizer = optimizer
        self.schedule = schedule
        self.precision = precision
        self.scaler = precision.scaler  # fp16's (the CUDA-graph step keeps its scale on the device)
        self.device = device
        self.params = params
        self.accumulation = accumulation
        self.clip_norm = clip_norm
        self.parameters = [p for g in optimizer.param_groups for p in g["params"]]
        self.carries_cache = False
        self.progress: Progress | None = None  # with several replicas: the backward is a collective
        self._checked = False
        self._autocast = precision.autocasts  # fp32 needs no context around the forward pass
        self._no_sync = getattr(module, "no_sync", None) if accumulation > 1 else None
        # One micro-batch, fp32, no loss scaling and no clipping: most runs. Its step is written
        # out without the branches the general one needs (on a host-bound model they show).
        self._plain = accumulation == 1 and self.scaler is None and not self._autocast and clip_norm is None
        self.clear_grads = grad_clearer(optimizer)
        # On a CPU device dict-form host_call values are read as floats at once (nothing to wait
        # for): ~1 us a step for three values, against ~7 us to stack them as a tensor.
        self._read_now = device.type == "cpu"

    def __call__(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        """Run one step; return its loss (a device scalar) and a copy of its ``host_call``."""
        if self._plain and self._checked:
            return self._plain_step(infeed)
        loss_sum: torch.Tensor | None = None
        host_call = None
        for micro in range(self.accumulation):
            batch = next(infeed)
            if self._autocast:
                with self.precision.forward_context(self.device):
                    spec = self.model_fn(self.module, batch.features, batch.labels, ModeKeys.TRAIN, self.params)
            else:
                spec = self.model_fn(self.module, batch.features, batch.labels, ModeKeys.TRAIN, self.params)
            if not self._checked:
                check_spec(spec, ModeKeys.TRAIN)
                _check_train_batch(batch_rows(batch.features) or 0, self.params["batch_size"])
                self._checked = True
            loss = spec.loss
            if loss is None:  # checked at the first step only: a later step's spec may still lack it
                raise ModelFnError(_NO_TRAIN_LOSS)
            if spec.cache is not None or self.carries_cache:
                self.params["cache"] = detach_cache(spec.cache)
                self.carries_cache = True
            scaled = loss / self.accumulation if self.accumulation > 1 else loss
            if self.scaler is not None:
                scaled = self.precision.scale_loss(scaled)
            if self._no_sync is not None and micro < self.accumulation - 1:
                with self._no_sync():  # replicas average gradients once, on the last micro-batch
                    scaled.backward()
            elif self.progress is not None:
                self._synced_backward(scaled)
            else:
                scaled.backward()
            detached = loss.detach()
            loss_sum = detached if loss_sum is None else loss_sum + detached
            if spec.host_call is not None:
                host_call = _snapshot_host_call(spec.host_call, self._read_now)
        apply = self.precision.optimizer_step(self.parameters, self._clip_and_step)
        self.clear_grads()
        if self.schedule is not None:
            if apply:
                self.schedule.step()
            else:  # a skipped fp16 step still counts: the schedule follows the global step
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    self.schedule.step()
        assert loss_sum is not None
        return (loss_sum / self.accumulation if self.accumulation > 1 else loss_sum), host_call

    def _clip_and_step(self) -> None:
        """Clip (if asked) and apply the update; ``Precision.optimizer_step`` decides whether it runs."""
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.clip_norm)
        self.optimizer.step()

    def step_fn(self) -> Callable[[Infeed], tuple[torch.Tensor, Any]]:
        """What runs one step now: ``self``, or once the first step has checked the spec, the
        plain step directly (one call less per step). Subclasses that define their own
        ``__call__`` keep it."""
        if self._plain and self._checked and type(self).__call__ is TrainStep.__call__:
            return self._plain_step
        return self

    def _plain_step(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        """``__call__`` for one fp32 micro-batch without scaling or clipping, after the first
        step has checked the spec."""
        batch = next(infeed)
        spec = self.model_fn(self.module, batch.features, batch.labels, ModeKeys.TRAIN, self.params)
        loss = spec.loss
        if loss is None:  # check_spec ran at the first step only
            raise ModelFnError(_NO_TRAIN_LOSS)
        if spec.cache is not None or self.carries_cache:
            self.params["cache"] = detach_cache(spec.cache)
            self.carries_cache = True
        if self.progress is not None:
            self._synced_backward(loss)
        else:
            loss.backward()
        host_call = spec.host_call
        if host_call is not None:
            host_call = _snapshot_host_call(host_call, self._read_now)
        self.optimizer.step()
        self.clear_grads()
        if self.schedule is not None:
            self.schedule.step()
        return loss.detach(), host_call

    def _synced_backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, marked as the collective it is with several replicas (DDP
        averages the gradients in it), so a replica stuck before it is named (watchdog.py)."""
        progress = self.progress
        assert progress is not None
        progress.enter("the backward pass (its gradient all-reduce)")
        try:
            loss.backward()
        finally:
            progress.leave()
        progress.mark("the optimizer update")


def grad_clearer(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """``optimizer.zero_grad(set_to_none=True)``, as cheap as it can be.

    For an optimizer that keeps ``torch.optim.Optimizer``'s own ``zero_grad``, setting every
    parameter's ``.grad`` to ``None`` is all that call does, minus its dynamo guard and its
    profiler scope, which cost ~5 us per step on the CPU: a few % of a host-bound step
    (benchmarks/overhead.py). An optimizer with its own ``zero_grad`` keeps it.
    """
    own = getattr(type(optimizer), "zero_grad", None) is not torch.optim.Optimizer.zero_grad
    if own or "zero_grad" in getattr(optimizer, "__dict__", {}):  # a class's or one set on the instance
        return lambda: optimizer.zero_grad(set_to_none=True)

    def clear() -> None:
        for group in optimizer.param_groups:  # read at every call: load_state_dict replaces the list
            for p in group["params"]:
                p.grad = None

    return clear


def _check_train_batch(rows: int, expected: int) -> None:
    if rows != expected:
        log.warning(
            "the train input_fn yields batches of %d rows but params['batch_size'] is %d: build batches "
            "with params['batch_size'] (the per-replica batch), or examples/sec will be wrong",
            rows,
            expected,
        )


def detach_cache(cache: Any) -> Any:
    """A carried cache (a tensor or a tuple of them, nested) cut from the autograd graph."""
    if cache is None:
        return None
    if isinstance(cache, torch.Tensor):
        return cache.detach()
    return tuple(detach_cache(c) for c in cache)


class DeviceLoop:
    """Runs loops of steps and reads their outfeed once per loop."""

    def __init__(self, step: TrainStep, run: RunContext, global_batch_size: int, strategy: Strategy) -> None:
        self.step = step
        self.run = run
        self.global_batch_size = global_batch_size
        self.strategy = strategy
        # A replica may leave a loop early only if it is alone: replicas must stay in step.
        self.may_break_early = strategy.world_size == 1
        self.exhausted = False
        self.on_cpu = strategy.device.type == "cpu"
        # Where this replica is, for naming a stuck one (watchdog.py); None alone.
        self.progress = strategy.progress if strategy.world_size > 1 else None
        step.progress = self.progress
        #: called with the global step after each step (``RunConfig.ema``'s update), if set
        self.after_step: Callable[[int], None] | None = None

    def run_loop(self, infeed: Infeed, steps: int) -> LoopResult:
        run, step = self.run, self.step
        first = run.global_step
        run_step = step.step_fn()  # resolved once per loop: with iterations_per_loop=1 every call shows
        may_break_early = self.may_break_early
        # On a CPU device every op has finished when it returns, so reading a loss at once costs
        # no wait; it costs less than keeping the loop's loss tensors alive until its end
        # (~2 us a step on a host-bound model, likely from fresh allocations replacing reused ones).
        on_cpu = self.on_cpu
        losses: list[Any] = []
        host_calls: list[Any] = []
        wait_before = infeed.wait_seconds
        progress = self.progress
        after_step = self.after_step
        start = time.perf_counter()
        for _ in range(steps):
            if progress is not None:
                progress.mark("the input and model_fn", run.global_step + 1)
            try:
                loss, host_call = run_step(infeed)
            except StopIteration:  # the data ended: drop a half-accumulated step and stop
                step.optimizer.zero_grad(set_to_none=True)
                self.exhausted = True
                break
            losses.append(loss.item() if on_cpu else loss)
            if host_call is not None:
                host_calls.append(host_call)
            run.global_step += 1
            if after_step is not None:
                after_step(run.global_step)
            if run.stop_requested and may_break_early:  # a signal: stop after this step
                break
        done = run.global_step - first
        alone = may_break_early
        if progress is not None:
            progress.loop_timed(time.perf_counter() - start, done)
            progress.mark(BETWEEN_LOOPS, exempt=True)  # another replica may take longer here
        if not alone:  # data ran out on some replica: all stop together
            self.exhausted = self.strategy.any_replica(self.exhausted)
        # The outfeed: one device-to-host copy for every value of every step in the loop
        # (after one all-reduce that averages them over replicas).
        if alone and (on_cpu or len(losses) == 1):  # read already, or one item() (exact for a half too)
            losses_host = losses if on_cpu else [losses[0].item()]
        elif not losses:
            losses_host = []
        else:
            stacked = torch.tensor(losses, dtype=torch.float32) if on_cpu else torch.stack(losses).float()
            losses_host = self._mean_over_replicas(stacked).tolist()
        values = _read_host_calls(host_calls, self._mean_over_replicas) if host_calls else {}
        seconds = time.perf_counter() - start
        values["learning_rate"] = [float(step.optimizer.param_groups[0]["lr"])] * done
        # Positional, in LoopResult's field order: first_step, steps, global_step, losses,
        # values, seconds, input_wait_seconds, examples.
        return LoopResult(
            first,
            done,
            run.global_step,
            losses_host,
            values,
            seconds,
            infeed.wait_seconds - wait_before,
            done * self.global_batch_size,
        )

    def _mean_over_replicas(self, values: torch.Tensor) -> torch.Tensor:
        if self.strategy.world_size == 1:
            return values.cpu()
        return (self.strategy.all_reduce_sum(values) / self.strategy.num_replicas).cpu()


def _snapshot_host_call(host_call: Any, read_now: bool = False) -> Any:
    """Copy one step's host_call values on the device (they may be views of weights the
    update is about to change); no host sync. ``read_now`` (a CPU device, where reading waits
    for nothing): dict values are read as floats instead."""
    if isinstance(host_call, dict):
        for name, value in host_call.items():
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise ModelFnError(f"host_call[{name!r}] must be a scalar tensor")
        if read_now:
            return tuple(host_call), [float(v.item()) for v in host_call.values()]
        return tuple(host_call), torch.stack([v.detach().float().reshape(()) for v in host_call.values()])
    if isinstance(host_call, tuple) and len(host_call) == 2 and callable(host_call[0]):
        fn, tensors = host_call
        if isinstance(tensors, dict):
            return fn, {k: v.detach().clone() for k, v in tensors.items()}
        seq = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        return fn, [t.detach().clone() for t in seq]
    raise ModelFnError("EstimatorSpec.host_call must be a dict of scalar tensors or a (fn, tensors) tuple")


def _read_host_calls(snapshots: list[Any], reduce: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, list[float]]:
    """Per-step host_call snapshots of one loop -> host values, with one device-to-host copy."""
    if not snapshots:
        return {}
    first, _ = snapshots[0]
    if callable(first):  # TPUEstimator form: fn sees every tensor stacked over the loop's steps
        tensors = [s[1] for s in snapshots]
        if isinstance(tensors[0], dict):
            out = first(**{k: torch.stack([t[k] for t in tensors]).cpu() for k in tensors[0]})
        else:
            out = first(*[torch.stack([t[i] for t in tensors]).cpu() for i in range(len(tensors[0]))])
        return {k: [float(v)] for k, v in (out or {}).items()}
    if isinstance(snapshots[0][1], list):  # read as floats already (a CPU device)
        stacked = torch.tensor([s[1] for s in snapshots], dtype=torch.float32)
    else:
        stacked = torch.stack([s[1] for s in snapshots])
    return dict(zip(first, reduce(stacked).T.tolist(), strict=True))
