"""``nn.Linear`` on oneDNN's inner product where that is faster than the BLAS on this CPU.

``nn.Linear`` calls the BLAS (MKL's sgemm in torch's CPU wheels). On some CPUs oneDNN's inner
product is much faster (AVX-512 EPYC: 472 GFLOP/s against MKL's 206, which takes its generic
path on AMD); on others the BLAS wins (AVX2 EPYC: ~140 against ~125). So the choice is made by
measurement, per layer shape:

- :func:`use_fast_linear` turns each plain ``nn.Linear`` of a model into a
  :class:`OneDNNLinear` (the same module, parameters and ``state_dict``; only ``forward``
  differs) and :func:`use_plain_linear` turns them back.
- ``OneDNNLinear`` runs :class:`OneDNNLinearFunction`: forward ``x @ W.T + b`` and both backward
  products (``grad_x = grad_y @ W``, ``grad_W = grad_y.T @ x``) each as one
  ``torch.ops.mkldnn._linear_pointwise`` call on the dense tensors, transposes passed as views
  (oneDNN reads strided operands; copying them first measured ~2x slower on the weight gradient).
- mode ``"on"`` always takes oneDNN (where oneDNN has the dtype; else the BLAS); ``"auto"``
  measures both kernels on each new ``(rows, in, out, dtype, training)`` a layer meets, once per
  machine (:func:`choose`, cached in ``linear.json``), and takes oneDNN where it is at least 5 %
  faster. A cached decision makes a resumed run take the same kernels as the run it resumes.

Under ``torch.compile``/``torch.export`` tracing, on other devices, on tensor subclasses and on
mixed dtypes the layer is a plain ``F.linear``: inductor picks its own GEMMs and an exported
program stays portable. Under CPU autocast the operands are cast to the autocast dtype as
``F.linear`` would be. Results agree with ``F.linear`` to fp32 rounding (the summation order of
the two libraries differs); each kernel is deterministic, so a run and its resumption on the
same path are bitwise equal.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, StateError
from ..resolve import Choice, Reason
from .machine import cache_load, cache_store, machine_key

FAST_LINEAR_MODES: tuple[str, ...] = ("auto", "on", "off")
LINEAR_FILE = "linear.json"
SPEEDUP_NEEDED = 1.05  # oneDNN must beat the BLAS by this much: a near tie is not worth a different kernel
MEASURE_BUDGET_S = 0.3  # per shape
_SMALL = 64**3  # rows * in * out below this: not measured, the BLAS (the call overhead decides there)
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's linear operator."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _lp(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T + b`` by oneDNN's inner product (``x`` may have leading dimensions)."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class OneDNNLinearFunction(torch.autograd.Function):
    """``F.linear`` whose forward and backward products all run on oneDNN's inner product."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _lp(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[0]:
            grad_x = _lp(grad, weight.t(), None)  # grad_y @ W: W.T viewed as the [in, out] "weight"
        if ctx.needs_input_grad[1]:
            grad_w = _lp(g2.t(), x.reshape(-1, x.shape[-1]).t(), None)  # grad_y.T @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def plain_sgd_refusal(group: dict[str, Any], name: str = "the param group") -> str | None:
    """Why an SGD param group's update is not plain SGD (which an in-backward update can apply), or
    ``None``; ``name`` names the group in the reason."""
    for key in ("momentum", "nesterov", "maximize", "differentiable"):
        if group.get(key):
            return f"it is plain SGD only; {name} has {key}={group[key]!r}"
    return None


class SGDUpdate:
    """Where a layer's in-backward SGD update reads its rate and decay: param group ``index`` of an
    optimizer, looked up at each backward (so a learning-rate schedule applies as it does to
    ``optimizer.step``, and a ``load_state_dict``, which replaces the group dicts, is followed).

    Holds the optimizer weakly: once it is gone the layer produces ordinary gradients again. A
    copy of the model (``copy.deepcopy``, pickling) does not carry it either. Attached by
    :func:`stoker.kernels.sgd_in_backward.update_in_backward`.
    """

    __slots__ = ("index", "optimizer", "ran")

    def __init__(self, optimizer: torch.optim.Optimizer, index: int) -> None:
        self.optimizer = weakref.ref(optimizer)
        self.index = index
        self.ran = False  # set by the first backward that updated the weight

    def active(self) -> bool:
        return self.optimizer() is not None

    def factors(self) -> tuple[float, float]:
        """``(beta, alpha)`` of ``W = beta * W + alpha * grad_W``: plain SGD with weight decay,
        ``W - lr * (grad_W + wd * W)``."""
        optimizer = self.optimizer()
        if optimizer is None:
            raise StateError("sgd_in_backward: the optimizer this layer updates with no longer exists")
        group = optimizer.param_groups[self.index]
        why = plain_sgd_refusal(group)
        if why is not None:
            raise StateError(f"sgd_in_backward: the optimizer changed: {why} (turn sgd_in_backward off for this run)")
        lr = float(group["lr"])
        return 1.0 - lr * float(group.get("weight_decay", 0.0)), -lr

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[type[None], tuple[()]]:
        return (type(None), ())


class LinearSGDInBackwardFunction(torch.autograd.Function):
    """``F.linear`` whose backward applies plain SGD to the weight inside the weight-gradient product.

    The product ``grad_y.T @ x`` is accumulated straight into the weight,
    ``W.addmm_(grad_y.T, x, beta=1 - lr * wd, alpha=-lr)``, which is the update
    ``W - lr * (grad_W + wd * W)`` without ever writing ``grad_W``: the weight gradient's memory
    pass and the optimizer's pass over the weight and its gradient become part of one GEMM. The
    weight gets no ``.grad`` (the optimizer skips it); ``grad_x`` is computed first, from the
    weight before its update. The forward and ``grad_x`` run on oneDNN when ``onednn``, else on
    the BLAS; the update always on the BLAS (its ``addmm_`` writes in place).
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, update: SGDUpdate, onednn: bool
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.update = update
        ctx.onednn = onednn
        return _lp(x, weight, bias) if onednn else F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _lp(grad, weight.t(), None) if ctx.onednn else grad.matmul(weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        beta, alpha = ctx.update.factors()
        ctx.update.ran = True
        with torch.no_grad():  # after grad_x, which needs the weight before the update
            if beta != 1.0 and weight.device.type == "cpu":
                # MKL applies beta != 1 in a pass of its own over the weight, slower than mul_
                # (4096x1001, 32 rows, one core: 5.07 ms against 4.47 for mul_ + addmm_ with beta 1,
                # 2026-11-26) and bitwise the same there. A GPU BLAS fuses beta into its epilogue.
                weight.mul_(beta)
                beta = 1.0
            weight.addmm_(g2.t(), x.reshape(-1, x.shape[-1]), beta=beta, alpha=alpha)
        return grad_x, None, grad_b, None, None


@dataclass(frozen=True)
class LinearChoice:
    """Which kernel a linear shape runs on, and why.

    Attributes:
        onednn: ``True``: oneDNN's inner product; ``False``: the BLAS (``F.linear``).
        speedup: BLAS time / oneDNN time as measured (``None`` when not measured).
        reason: the why in words: ``"measured 1.82x BLAS"``, ``"forced on"``, ``"oneDNN has no bf16 here"``.
        cached: read from the cache (measured by an earlier process).
    """

    onednn: bool
    speedup: float | None
    reason: str
    cached: bool = False


_choices: dict[tuple[int, int, int, str, bool], LinearChoice] = {}
_forced: dict[tuple[int, int, int, str, bool], LinearChoice] = {}
_lock = threading.Lock()


def _best_time(calls: list[Callable[[], object]], budget_s: float) -> list[float]:
    """The fastest time of each call, calls interleaved (load drifts hit them alike), within the budget."""
    for call in calls:
        call()  # warm-up
    best = [float("inf")] * len(calls)
    start, rounds = time.perf_counter(), 0
    while rounds < 3 or (time.perf_counter() - start < budget_s and rounds < 30):
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - t0)
        rounds += 1
    return best


def measure_linear(
    rows: int,
    in_features: int,
    out_features: int,
    dtype: torch.dtype,
    training: bool,
    budget_s: float = MEASURE_BUDGET_S,
) -> float:
    """BLAS time / oneDNN time for one linear layer's products (forward, and both backward ones
    when ``training``); raises ``RuntimeError`` where oneDNN has no such inner product."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    w = torch.randn(out_features, in_features, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype)
    g = torch.randn(rows, out_features, generator=gen).to(dtype)

    def blas() -> None:
        F.linear(x, w, b)
        if training:
            torch.mm(g, w)
            torch.mm(g.t(), x)

    def onednn() -> None:
        _lp(x, w, b)
        if training:
            _lp(g, w.t(), None)
            _lp(g.t(), x.t(), None)

    with torch.no_grad():
        t_blas, t_onednn = _best_time([blas, onednn], budget_s)
    return t_blas / t_onednn


def choose(rows: int, in_features: int, out_features: int, dtype: torch.dtype, training: bool) -> LinearChoice:
    """The kernel for this shape in mode ``auto``: cached in this process, else on disk, else measured."""
    name = _DTYPE_NAMES.get(dtype)
    key = (rows, in_features, out_features, name or str(dtype), training)
    found = _choices.get(key)
    if found is not None:
        return found
    with _lock:
        if key in _choices:
            return _choices[key]
        _choices[key] = choice = _decide(key, dtype)
    return choice


def _decide(key: tuple[int, int, int, str, bool], dtype: torch.dtype) -> LinearChoice:
    rows, fin, fout, name, training = key
    if dtype not in _DTYPE_NAMES or not onednn_available():
        return LinearChoice(False, None, "no oneDNN linear for this dtype")
    if rows * fin * fout < _SMALL:
        return LinearChoice(False, None, "too small to measure")
    cache_key = f"{machine_key(torch.device('cpu'), name)}|{rows}x{fin}->{fout}|{'train' if training else 'infer'}"
    entry = cache_load(LINEAR_FILE).get(cache_key)
    if isinstance(entry, (int, float)) and not isinstance(entry, bool) and entry > 0:
        return _by_speedup(float(entry), cached=True)
    if entry == "unsupported":
        return LinearChoice(False, None, f"oneDNN has no {name} inner product here", cached=True)
    try:
        speedup = measure_linear(rows, fin, fout, dtype, training)
    except RuntimeError:
        cache_store(LINEAR_FILE, cache_key, "unsupported")
        return LinearChoice(False, None, f"oneDNN has no {name} inner product here")
    cache_store(LINEAR_FILE, cache_key, speedup)
    return _by_speedup(speedup, cached=False)


def _by_speedup(speedup: float, *, cached: bool) -> LinearChoice:
    return LinearChoice(speedup >= SPEEDUP_NEEDED, speedup, f"measured {speedup:.2f}x BLAS", cached)


def _forced_choice(key: tuple[int, int, int, str, bool], dtype: torch.dtype) -> LinearChoice:
    """Mode ``on``: oneDNN wherever it has the dtype (probed once per dtype on a tiny problem)."""
    found = _forced.get(key)
    if found is not None:
        return found
    ok = dtype in _DTYPE_NAMES and onednn_available()
    if ok:
        try:
            _lp(torch.ones(2, 2, dtype=dtype), torch.ones(2, 2, dtype=dtype), None)
        except RuntimeError:
            ok = False
    choice = LinearChoice(ok, None, "forced on" if ok else f"oneDNN has no {key[3]} inner product here")
    _forced[key] = choice
    return choice


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` whose products run on oneDNN where :attr:`mode` says so (see the module
    docstring). Made from an ``nn.Linear`` by :func:`use_fast_linear`; never built directly.

    With an :class:`SGDUpdate` in ``sgd_update`` (set by
    :func:`stoker.kernels.sgd_in_backward.update_in_backward`) a training forward runs
    :class:`LinearSGDInBackwardFunction`: the backward updates the weight itself.
    """

    mode: str = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if torch.is_autocast_enabled("cpu") and x.device.type == "cpu":
            dtype = torch.get_autocast_dtype("cpu")
            x, w = x.to(dtype), w.to(dtype)  # as autocast casts F.linear's operands (grads flow back in fp32)
            b = None if b is None else b.to(dtype)
        if (
            torch.compiler.is_compiling()
            or type(x) is not torch.Tensor  # fake, functional and other tensor subclasses: traced, not run
            or type(w) not in (torch.Tensor, nn.Parameter)  # e.g. a sharded DTensor weight
            or x.device.type != "cpu"
            or x.dtype != w.dtype
            or (b is not None and b.dtype != w.dtype)
            or x.dim() == 0
        ):
            return F.linear(x, w, b)
        with torch.autocast("cpu", enabled=False):
            training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
            key = (
                x.numel() // x.shape[-1],
                self.in_features,
                self.out_features,
                _DTYPE_NAMES.get(x.dtype, ""),
                training,
            )
            choice = _forced_choice(key, x.dtype) if self.mode == "on" else choose(*key[:3], x.dtype, training)
            update = self.__dict__.get("sgd_update")
            if update is not None and training and w is self.weight and w.requires_grad and update.active():
                return LinearSGDInBackwardFunction.apply(x, w, b, update, choice.onednn)
            if not choice.onednn:
                return F.linear(x, w, b)
            return OneDNNLinearFunction.apply(x, w, b)


def use_fast_linear(model: nn.Module, mode: str = "auto") -> list[str]:
    """Make each plain ``nn.Linear`` of ``model`` a :class:`OneDNNLinear` in ``mode``
    (``"auto"`` or ``"on"``; ``"off"`` changes nothing); return their names.

    Subclasses of ``nn.Linear`` are left alone (their ``forward`` may be their own, and
    ``nn.MultiheadAttention`` reads its ``out_proj`` weights without calling it).
    """
    if mode not in FAST_LINEAR_MODES:
        raise ConfigError(f"fast_linear must be one of {', '.join(FAST_LINEAR_MODES)}; got {mode!r}")
    if mode == "off" or not onednn_available():
        return []
    names = []
    for name, module in model.named_modules():
        if type(module) is nn.Linear or type(module) is OneDNNLinear:
            module.__class__ = OneDNNLinear
            cast(OneDNNLinear, module).mode = mode
            names.append(name)
    return names


def fast_linear_choice(mode: str, device_type: str) -> Choice[str]:
    """What ``RunConfig.fast_linear`` (``mode``) does on a ``device_type`` device: nothing but on
    the CPU; ``auto`` measures each layer shape at its first step (:func:`choose`)."""
    if device_type != "cpu":
        return Choice("off", "CPU only")
    if mode == "auto":
        return Choice("auto", "per layer shape, oneDNN or the BLAS, whichever measured faster here; cached")
    return Choice(mode, Reason(lambda n: n("fast_linear", mode)))


def use_plain_linear(model: nn.Module) -> int:
    """Turn every :class:`OneDNNLinear` of ``model`` back into an ``nn.Linear``; return how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, OneDNNLinear):
            cast(nn.Module, module).__class__ = nn.Linear
            module.__dict__.pop("mode", None)
            module.__dict__.pop("sgd_update", None)
            count += 1
    return count


def choices_made() -> dict[tuple[int, int, int, str, bool], LinearChoice]:
    """The ``auto`` and ``on`` decisions this process has made: ``(rows, in, out, dtype, training) -> choice``."""
    return {**_choices, **_forced}


def describe_choices() -> list[str]:
    """One line per shape this process has decided, e.g.
    ``"4096x512->1536 fp32 train: oneDNN (measured 1.82x BLAS)"``, largest first."""
    lines = []
    for (rows, fin, fout, name, training), c in sorted(
        choices_made().items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2]
    ):
        kernel = "oneDNN" if c.onednn else "BLAS"
        lines.append(
            f"{rows}x{fin}->{fout} {name} {'train' if training else 'infer'}: {kernel} ({c.reason}"
            + (", cached" if c.cached else "")
            + ")"
        )
    return lines


def reset_choices() -> None:
    """Forget this process's decisions (the disk cache stays): for tests and benchmarks."""
    with _lock:
        _choices.clear()
        _forced.clear()


__all__ = [
    "FAST_LINEAR_MODES",
    "LINEAR_FILE",
    "LinearChoice",
    "LinearSGDInBackwardFunction",
    "OneDNNLinear",
    "OneDNNLinearFunction",
    "SGDUpdate",
    "choices_made",
    "plain_sgd_refusal",
    "choose",
    "describe_choices",
    "fast_linear_choice",
    "measure_linear",
    "onednn_available",
    "reset_choices",
    "use_fast_linear",
    "use_plain_linear",
]
