"""What fp16 training costs on this CPU: forward+backward time against fp32's, measured once.

fp16 autocast on a CPU can be far slower than fp32, and the CPU's flags do not tell when: on an
Intel Xeon with ``avx512_fp16`` (torch 2.13) a resnet50 convolution's fp16 backward took 2.7 s
where fp32 took 25 ms (x100), so a 4-step run took 17 minutes; on CPUs without fast fp16
instructions every fp16 kernel converts to fp32 and back. So the cost is *measured*: a small
convolution (channels_last, 3x3) and a small linear layer, forward and backward under autocast,
in fp32, fp16 and bf16, rounds interleaved, fastest call of each counted, on one thread: a
busy machine's stalls distort a multi-threaded millisecond far more (on the 2-core development
EPYC, two threads gave 0.5x to 114x for the same kernel; one thread 26x to 46x), and a slow
fp16 path that does not use the other threads is slower still, against fp32, in the run. The
fp32 steps take about a millisecond; a kernel 100x slower is measured on the same small size
(under a second in all). The factors are kept per machine
(:func:`~stoker.kernels.machine.machine_key`: CPU model, flags, torch) in ``fp16_cost.json`` in
the cache directory, like the peaks.

:func:`fp16_note` turns them into the one line a run says when it trains in fp16 on a CPU
(``stoker.engine``, ``stoker bench``): the factor for the layer kinds the model has and the bf16
figure, a warning above :data:`SLOW_FACTOR`. The run goes on in fp16 as asked: an explicit
setting is honoured, never switched.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._cache import cache_dir
from .machine import cache_load, cache_store, machine_key

COST_FILE = "fp16_cost.json"
#: fp16 taking more than this many times fp32's time is said as a warning
SLOW_FACTOR = 5.0
KINDS: tuple[str, ...] = ("conv", "linear")
_WORDS = {"conv": "a convolution's", "linear": "a linear layer's"}
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_memo: dict[str, Fp16Cost] = {}
_said: set[str] = set()

#: ``measure(kind, precision) -> seconds`` of one forward+backward (the fastest of a few)
Measure = Callable[[str, str], float]


@dataclass(frozen=True)
class Fp16Cost:
    """fp16's and bf16's forward+backward time as a multiple of fp32's, per layer kind.

    Attributes:
        fp16, bf16: ``{"conv": factor, "linear": factor}``.
        measured: the date it was measured (``YYYY-MM-DD``).
        cached: whether it was read from the cache rather than measured in this process.
    """

    fp16: dict[str, float]
    bf16: dict[str, float]
    measured: str
    cached: bool = False

    def worst(self, precision: str, kinds: Iterable[str]) -> float:
        """The largest factor of ``precision`` over ``kinds``."""
        table = self.fp16 if precision == "fp16" else self.bf16
        return max(table[k] for k in kinds)


def _randn(*shape: int) -> torch.Tensor:
    # its own generator: measuring at the start of a run must not move the run's random stream
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _conv(dtype: torch.dtype) -> Callable[[], None]:
    x = _randn(8, 32, 16, 16).to(memory_format=torch.channels_last).requires_grad_()
    w = _randn(32, 32, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
    return _step(lambda: F.conv2d(x, w, padding=1), dtype, (x, w))


def _linear(dtype: torch.dtype) -> Callable[[], None]:
    x = _randn(128, 256).requires_grad_()
    w = _randn(256, 256).requires_grad_()
    return _step(lambda: F.linear(x, w), dtype, (x, w))


def _step(
    forward: Callable[[], torch.Tensor], dtype: torch.dtype, leaves: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    def call() -> None:
        for t in leaves:
            t.grad = None
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not torch.float32):
            y = forward()
        y.float().sum().backward()

    return call


def measure_all(budget_s: float = 0.5) -> dict[str, dict[str, float]]:
    """``{kind: {precision: seconds}}``: the fastest forward+backward of each kind in fp32, fp16
    and bf16. Rounds are interleaved (a load that comes and goes slows all alike), at least 3,
    more while within ``budget_s``; in a round a fast call runs several times (up to 10 ms of
    them), so a millisecond call has many chances to miss a busy machine's stalls."""
    calls = {(k, p): (_conv if k == "conv" else _linear)(_DTYPES[p]) for k in KINDS for p in _DTYPES}
    best = {key: math.inf for key in calls}
    for call in calls.values():
        call()  # warm-up: kernel selection, reorders
    start, rounds = time.perf_counter(), 0
    while rounds < 3 or (time.perf_counter() - start < budget_s and rounds < 20):
        for key, call in calls.items():
            repeats = 1 if best[key] == math.inf else max(1, min(10, int(0.01 / best[key])))
            for _ in range(repeats):
                t0 = time.perf_counter()
                call()
                best[key] = min(best[key], time.perf_counter() - t0)
        rounds += 1
    return {k: {p: best[(k, p)] for p in _DTYPES} for k in KINDS}


def fp16_cost(*, use_cache: bool = True, measure: Measure | None = None) -> Fp16Cost:
    """This CPU's :class:`Fp16Cost`: from the cache, or measured (``measure``, default the small
    layers above) and cached. ``use_cache=False`` measures again and replaces the entry."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # measured on one thread (the module docstring says why), and so keyed
    try:
        key = machine_key(torch.device("cpu"), "fp16-cost")
        if use_cache:
            if key in _memo:
                return _memo[key]
            cost = _from_entry(cache_load(COST_FILE).get(key))
            if cost is not None:
                _memo[key] = cost
                return cost
        if measure is None:
            seconds = measure_all()
            measure = lambda kind, precision: seconds[kind][precision]  # noqa: E731
    finally:
        torch.set_num_threads(threads)
    factors = {p: {k: measure(k, p) / measure(k, "fp32") for k in KINDS} for p in ("fp16", "bf16")}
    cost = Fp16Cost(factors["fp16"], factors["bf16"], time.strftime("%Y-%m-%d"))
    cache_store(COST_FILE, key, {"fp16": cost.fp16, "bf16": cost.bf16, "measured": cost.measured})
    _memo[key] = Fp16Cost(cost.fp16, cost.bf16, cost.measured, cached=True)
    return cost


def layer_kinds(model: nn.Module) -> tuple[str, ...]:
    """The kinds of :data:`KINDS` ``model`` has (all of them when it has neither)."""
    found = []
    if any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        found.append("conv")
    if any(isinstance(m, nn.Linear) for m in model.modules()):
        found.append("linear")
    return tuple(found) or KINDS


def fp16_note(cost: Fp16Cost, kinds: Iterable[str], option: Callable[[str], str]) -> tuple[int, str]:
    """``(logging level, line)`` saying what fp16 costs here for ``kinds``; ``option(name)``
    spells a precision setting the way the caller takes it (``precision='bf16'``,
    ``--precision=bf16``). A warning above :data:`SLOW_FACTOR`, naming the faster choice."""
    first, *rest = kinds = tuple(kinds)
    factors = f"{_WORDS[first]} forward+backward takes {_times(cost.fp16[first])} fp32's time" + "".join(
        f", {_WORDS[k]} {_times(cost.fp16[k])}" for k in rest
    )
    bf16 = ", ".join(_times(cost.bf16[k]) for k in kinds)
    cached = "cached" if cost.cached else "now cached"
    line = (
        f"fp16 on this CPU: {factors} (bf16: {bf16}; measured on one thread once per machine, {cached} in "
        f"{cache_dir() / COST_FILE})"
    )
    worst = cost.worst("fp16", kinds)
    if worst <= SLOW_FACTOR:
        return logging.INFO, line
    if cost.worst("bf16", kinds) <= SLOW_FACTOR:
        instead = f"{option('bf16')} (fp32's exponent range, no loss scaling)"
    else:
        instead = option("fp32")
    return logging.WARNING, f"{line}; {instead} trains faster here (this run stays in fp16, as asked)"


def _times(factor: float) -> str:
    return f"{factor:.0f}x" if factor >= 10 else f"{factor:.1f}x"


def say_once(key: str) -> bool:
    """Whether ``key`` is said for the first time in this process (a run's header and its
    Estimator say the fp16 line once between them)."""
    if key in _said:
        return False
    _said.add(key)
    return True


def _from_entry(entry: object) -> Fp16Cost | None:
    """A cached entry as an ``Fp16Cost`` (``None`` if it is not a well-formed one)."""
    if not isinstance(entry, dict):
        return None
    try:
        tables = [{k: float(entry[p][k]) for k in KINDS} for p in ("fp16", "bf16")]
        cost = Fp16Cost(tables[0], tables[1], str(entry["measured"]), cached=True)
    except (KeyError, TypeError, ValueError):
        return None
    ok = all(v > 0 and math.isfinite(v) for t in tables for v in t.values())
    return cost if ok else None


__all__ = [
    "COST_FILE",
    "KINDS",
    "SLOW_FACTOR",
    "Fp16Cost",
    "fp16_cost",
    "fp16_note",
    "layer_kinds",
    "measure_all",
    "say_once",
]
