"""``RunConfig(cuda_graph=True)``: the training step captured once as a CUDA graph and replayed.

On a GPU, an eager step of a small model is bound by the host launching kernels one by one; a
CUDA graph replays the whole step (forward, backward, unscale, clipping, the update, the loss
scale update) with a single launch. What a graph needs, and how this step provides it:

- **static inputs**: every batch is copied (device to device, on the compute stream, after the
  infeed's side-stream copy) into buffers allocated from the first batch. A batch with other
  shapes or dtypes cannot be replayed: the step falls back to eager, with a warning naming them.
- **no host syncs**: the LR of each param group is a device tensor (refilled when the schedule
  changes it), and fp16 dynamic loss scaling keeps the scale, its growth counter and the
  skipped-step count on the device (``torch._amp_update_scale_``, as ``GradScaler``); the
  update is skipped on the device through the fused optimizer's ``found_inf``. The host copy in
  ``LossScaler`` is refreshed once per loop (``end_loop``), before hooks and checkpoints read it.
  A host sync in ``model_fn`` (``.item()``, ``print``, ``if tensor:``) makes the capture fail:
  the step falls back to eager, with a warning naming the error.
- **capturable optimizer state**: the optimizer must be built with ``capturable=True`` (Adam,
  AdamW, ...) or ``fused=True`` (SGD, Adam, AdamW; a fused Adam or AdamW is switched to
  ``capturable=True`` too, which torch requires for capture and which changes no value); fp16
  with dynamic scaling needs ``fused=True`` (the fused kernels skip the update when ``found_inf`` is set).

The first ``WARMUP_STEPS`` steps run eagerly on a side stream (real steps on real batches:
they initialise the optimizer state and let autograd and cuDNN pick their kernels); the next
step is captured and then replayed, and every later step is a replay. Settings that cannot be
captured (gradient accumulation, a carried ``cache``, several replicas, an optimizer that is
neither fused nor capturable, a device that is not CUDA) are a :class:`~stoker.errors.ConfigError`
naming each cause and its fix (:func:`capture_refusals`, the one rule: ``stoker bench`` asks it
too): a run that asks for a graph never runs eagerly unannounced. :func:`cuda_graph_choice` is
what a run records about the graph when it is built (``Estimator.choices``).

Written against torch's documented whole-network capture; run on an H200 (torch 2.11) by
``make gpu-check``: ``tests/test_cuda.py`` passes there and resnet50 replays within 2 % of a
hand-written capture.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..config.slices import LoopConfig
from ..data._tree import batch_rows
from ..errors import ConfigError, ModelFnError
from ..resolve import Choice, Reason, spelled
from ..spec import ModeKeys
from .infeed import Infeed
from .loop import _NO_TRAIN_LOSS, TrainStep, _check_train_batch, _snapshot_host_call, check_spec

log = logging.getLogger("stoker")

WARMUP_STEPS = 3


def capture_refusals(
    *,
    optimizer: torch.optim.Optimizer | None = None,
    device_type: str = "cuda",
    compile_mode: str = "none",
    dynamic_scaling: bool = False,
    accumulation_steps: int = 1,
    world_size: int = 1,
    carries_cache: bool = False,
) -> list[str]:
    """Why a training step with these settings cannot be captured as a CUDA graph (empty: it can).

    Pure Python (nothing touches a device), so it is tested on CPU with CPU-built optimizers (an
    optimizer flags what it would do on CUDA); ``optimizer`` ``None``: not built yet, not
    checked. Each reason names the setting and the fix (a :class:`~stoker.resolve.Reason`)."""
    reasons: list[str] = []
    if device_type != "cuda":
        reasons.append(
            Reason(
                lambda n: f"a CUDA graph needs a CUDA device; this run's is {device_type!r} (use {n('device', 'cuda')})"
            )
        )
    if compile_mode == "step":
        reasons.append(
            Reason(
                lambda n: (
                    f"{n('compile', 'step')} is the other way to run the step whole; drop "
                    f"{n('compile', 'step')} or {n('cuda_graph')}"
                )
            )
        )
    if accumulation_steps > 1:
        reasons.append(
            Reason(
                lambda n: (
                    f"{n('gradient_accumulation_steps', accumulation_steps)} is not captured (one micro-batch "
                    "per step); set it to 1"
                )
            )
        )
    if world_size > 1:
        reasons.append(f"{world_size} replicas: gradient all-reduce is not captured by this loop; use one replica")
    if carries_cache:
        reasons.append("a carried cache (EstimatorSpec.cache) is not captured")
    if optimizer is None or compile_mode == "step":  # a compiled step builds its own update
        return reasons
    name = type(optimizer).__name__
    if not captures_update(optimizer):
        reasons.append(
            f"optimizer {name} is not capturable: build it with capturable=True (Adam, AdamW, ...) "
            "or fused=True (SGD, Adam, AdamW)"
        )
    elif dynamic_scaling and not skips_update_on_device(optimizer):
        reasons.append(
            Reason(
                lambda n: (
                    f"fp16 dynamic loss scaling skips updates on the device only with a fused optimizer; "
                    f"build {name} with fused=True, or use a static {n('loss_scale')}"
                )
            )
        )
    return reasons


def cuda_graph_choice(asked: bool, device_type: str, refusals: list[str]) -> Choice[bool]:
    """Whether a run's training step is a CUDA graph: as ``asked`` (``RunConfig.cuda_graph``;
    asked where it cannot capture is an error, not a choice); where not asked, what asking would
    do on this ``device_type`` with these :func:`capture_refusals`."""
    if asked:
        return Choice(True, Reason(lambda n: n("cuda_graph")))
    if device_type != "cuda":
        return Choice(False, "CUDA only")
    if refusals:
        first = refusals[0]
        return Choice(False, Reason(lambda n: f"not asked, and it could not capture this step: {spelled(first, n)}"))
    return Choice(False, Reason(lambda n: f"not asked: {n('cuda_graph')} would capture this step"))


def cannot_capture(refusals: list[str]) -> ConfigError:
    """The error of ``cuda_graph=True`` where the step cannot be captured (to ``raise``)."""
    return ConfigError(
        Reason(
            lambda n: (
                f"{n('cuda_graph', True)}, but this training step cannot be captured: "
                + "; ".join(spelled(r, n) for r in refusals)
                + f" (or drop {n('cuda_graph')} to run the step eagerly)"
            )
        )
    )


def captures_update(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a CUDA graph can capture ``optimizer.step()``: it was built ``capturable=True`` or
    ``fused=True`` (its flags only; nothing touches a device, so a CPU-built one answers for CUDA)."""
    return bool(optimizer.defaults.get("capturable") or optimizer.defaults.get("fused"))


def skips_update_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` skips the update on the device when fp16 gradients overflowed
    (torch's fused kernels read ``found_inf``), as fp16 dynamic loss scaling needs inside a graph."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def cuda_graph_refusals(config: LoopConfig, strategy: Any, kwargs: dict[str, Any]) -> list[str]:
    """Why this run cannot use the CUDA-graph step (empty: it can); see :func:`capture_refusals`."""
    scaler = kwargs["precision"].scaler
    return capture_refusals(
        optimizer=kwargs["optimizer"],
        device_type=strategy.device.type,
        compile_mode=config.compile,
        dynamic_scaling=scaler is not None and scaler.dynamic,
        accumulation_steps=config.gradient_accumulation_steps,
        world_size=strategy.world_size,
        carries_cache=kwargs["params"].get("cache") is not None,
    )


def _flat(tree: Any) -> tuple[list[Any], Any]:
    return pytree.tree_flatten(tree)


def _make_capturable(opt: torch.optim.Optimizer) -> None:
    """A fused optimizer that also has a ``capturable`` flag (Adam, AdamW) is switched to
    ``capturable=True``: torch refuses to capture its ``step()`` otherwise (seen with torch 2.11
    on an H200), and with ``fused=True`` the flag changes no value, only where the step counter
    and the learning rate are read from (the device). Fused SGD has no such flag and captures as is."""
    if not opt.defaults.get("fused") or "capturable" not in opt.defaults or opt.defaults["capturable"]:
        return
    opt.defaults["capturable"] = True
    for group in opt.param_groups:
        group["capturable"] = True
    for param, state in opt.state.items():  # state made before this step existed: the counter on the device
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor) and isinstance(param, torch.Tensor) and step.device != param.device:
            state["step"] = step.to(param.device)
    log.info(
        "cuda_graph: %s built with fused=True is made capturable=True (same values; required to capture)",
        type(opt).__name__,
    )


def _meta(leaves: list[Any]) -> list[Any]:
    return [(tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in leaves]


class CudaGraphTrainStep(TrainStep):
    """A ``TrainStep`` that warms up eagerly, captures itself as a CUDA graph, then replays."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _make_capturable(self.optimizer)
        device = self.device
        self.steps_run = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_reason: str | None = None  # set when the step fell back to eager for good
        self._side = torch.cuda.Stream(device=device)
        self._static: tuple[Any, Any] | None = None  # (features, labels) buffers
        self._static_meta: Any = None
        self._out: tuple[torch.Tensor, Any] | None = None  # the captured loss and host_call snapshot
        self._lr = [torch.zeros((), dtype=torch.float32, device=device) for _ in self.optimizer.param_groups]
        self._lr_values: list[float | None] = [None] * len(self._lr)
        scaler = self.scaler
        self._dynamic = scaler is not None and scaler.dynamic
        if self._dynamic:
            assert scaler is not None
            self._scale = torch.full((), scaler.scale, dtype=torch.float32, device=device)
            self._growth = torch.full((), scaler.good_steps, dtype=torch.int32, device=device)
            self._skipped = torch.full((), scaler.skipped_steps, dtype=torch.int64, device=device)
            self._found_inf = torch.zeros((), dtype=torch.float32, device=device)

    # ------------------------------------------------------------------ the step's body
    def _body(self, features: Any, labels: Any) -> tuple[torch.Tensor, Any]:
        """Forward, backward, unscale, clip, update, scale update: no host sync anywhere."""
        with self.precision.forward_context(self.device):
            spec = self.model_fn(self.module, features, labels, ModeKeys.TRAIN, self.params)
        if not self._checked:
            check_spec(spec, ModeKeys.TRAIN)
            _check_train_batch(batch_rows(features) or 0, self.params["batch_size"])
            self._checked = True
        if spec.cache is not None:
            raise ModelFnError(
                "model_fn returned EstimatorSpec.cache, which the CUDA-graph step does not carry; "
                "set RunConfig(cuda_graph=False)"
            )
        loss = spec.loss
        if loss is None:  # check_spec ran at the first call only
            raise ModelFnError(_NO_TRAIN_LOSS)
        scaler = self.scaler
        if scaler is None:
            loss.backward()
        elif self._dynamic:
            (loss * self._scale).backward()
        else:
            scaler.scale_loss(loss).backward()
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if self._dynamic:
            self._found_inf.zero_()
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf, torch.reciprocal(self._scale))
        elif scaler is not None:
            torch._foreach_mul_(grads, 1.0 / scaler.scale)
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.clip_norm, foreach=True)
        if self._dynamic:
            self.optimizer.found_inf = self._found_inf  # type: ignore[attr-defined]  # read by fused steps, as GradScaler does
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # type: ignore[attr-defined]  # set just above
            assert scaler is not None
            torch._amp_update_scale_(
                self._scale,
                self._growth,
                self._found_inf,
                scaler.growth_factor,
                scaler.backoff_factor,
                scaler.growth_interval,
            )
            self._skipped += self._found_inf.to(torch.int64)
        else:
            self.optimizer.step()
        host_call = _snapshot_host_call(spec.host_call) if spec.host_call is not None else None
        return loss.detach().clone(), host_call

    # ------------------------------------------------------------------ stepping
    def __call__(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        batch = next(infeed)
        self._with_tensor_lr(True)
        try:
            out = self._run(batch.features, batch.labels)
        finally:
            self._with_tensor_lr(False)
        self.steps_run += 1
        if self.schedule is not None:
            with warnings.catch_warnings():  # a skipped fp16 step still steps the schedule
                warnings.simplefilter("ignore", UserWarning)
                self.schedule.step()
        return out

    def _run(self, features: Any, labels: Any) -> tuple[torch.Tensor, Any]:
        if self.eager_reason is not None:
            return self._eager(features, labels)
        leaves, spec = _flat((features, labels))
        if self._static is None:
            self._static = pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (features, labels)
            )
            self._static_meta = (spec, _meta(leaves))
        elif (spec, _meta(leaves)) != self._static_meta:
            self._fall_back(
                f"the batch's shapes changed ({_meta(leaves)} after {self._static_meta[1]}); a CUDA graph "
                "replays static shapes (batch with drop_remainder, pad sequences to one length)"
            )
            return self._eager(features, labels)
        static_leaves, _ = _flat(self._static)
        for dst, src in zip(static_leaves, leaves, strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src, non_blocking=True)
        if self.steps_run < WARMUP_STEPS:
            return self._warm_up()
        if self.graph is None:
            try:
                self._capture()
            except Exception as e:  # noqa: BLE001 - any capture failure: fall back with its message
                self.graph = None
                self._out = None
                torch.cuda.synchronize(self.device)
                self._fall_back(
                    f"the step cannot be captured ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                    "host syncs in model_fn (.item(), print, data-dependent if) prevent capture"
                )
                return self._eager(*self._static)
        assert self.graph is not None and self._out is not None
        self.graph.replay()
        loss, host_call = self._out
        return loss.clone(), _copy_snapshot(host_call)

    def _warm_up(self) -> tuple[torch.Tensor, Any]:
        assert self._static is not None
        current = torch.cuda.current_stream(self.device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            self.optimizer.zero_grad(set_to_none=True)
            out = self._body(*self._static)
        current.wait_stream(self._side)
        return out

    def _capture(self) -> None:
        assert self._static is not None
        self.optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients from its pool
        graph = torch.cuda.CUDAGraph()
        # thread_local: the infeed's thread keeps copying the next batches while we capture.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._out = self._body(*self._static)
        self.graph = graph
        log.info("cuda_graph: captured the training step at step %d; replaying it from now on", self.steps_run)

    def _eager(self, features: Any, labels: Any) -> tuple[torch.Tensor, Any]:
        self.optimizer.zero_grad(set_to_none=True)
        return self._body(features, labels)

    def _fall_back(self, reason: str) -> None:
        self.eager_reason = reason
        self.graph = None
        self._out = None
        self.optimizer.zero_grad(set_to_none=True)
        log.warning("cuda_graph: running the step eagerly from now on: %s", reason)

    def _with_tensor_lr(self, on: bool) -> None:
        """Hand the optimizer device-tensor LRs for the step (the graph reads them), floats otherwise."""
        for i, (group, t) in enumerate(zip(self.optimizer.param_groups, self._lr, strict=True)):
            if on:
                value = group["lr"]
                if isinstance(value, torch.Tensor):
                    continue
                if value != self._lr_values[i]:
                    t.fill_(value)
                    self._lr_values[i] = value
                group["lr"] = t
            elif group["lr"] is t:
                group["lr"] = self._lr_values[i]

    def end_loop(self) -> None:
        """Copy the device-side loss-scale state into ``LossScaler`` (one read per loop)."""
        if self._dynamic and self.scaler is not None:
            scale, good, skipped = torch.stack(
                [self._scale.double(), self._growth.double(), self._skipped.double()]
            ).tolist()
            self.scaler.scale, self.scaler.good_steps, self.scaler.skipped_steps = scale, int(good), int(skipped)


def _copy_snapshot(host_call: Any) -> Any:
    """Copies of the graph's static host_call outputs (the next replay overwrites them)."""
    if host_call is None:
        return None
    first, values = host_call
    if isinstance(values, torch.Tensor):
        return first, values.clone()
    if isinstance(values, dict):
        return first, {k: v.clone() for k, v in values.items()}
    return first, [v.clone() for v in values]


__all__ = [
    "WARMUP_STEPS",
    "CudaGraphTrainStep",
    "cannot_capture",
    "capture_refusals",
    "captures_update",
    "cuda_graph_choice",
    "cuda_graph_refusals",
    "skips_update_on_device",
]
