"""Dynamic batching for ``stoker serve``: requests that arrive together run as one model call.

Requests are admitted first (:meth:`DynamicBatcher.slot`): at most ``max_pending`` may be
admitted at once (being decoded, queued or running), and one more is refused with
:class:`Saturated`, which the server answers with 503. A request is admitted once its body has
arrived and before it is decoded: a client that sends its body slowly holds no slot, and a
flood costs the server a counter, not JSON parsing.

One worker task takes the first queued request, then adds what is already queued, and waits
up to ``window_ms`` for more only while other admitted requests are still on their way (being
decoded). So a lone client never waits for a window, and under load the requests
that queued while the model ran go into the next call together, up to ``max_batch`` rows.
The group's inputs are concatenated along the batch dimension, the model runs once on the
single model thread (PyTorch's own threads parallelise inside the call), and the outputs are
split back by rows. With batching off every request is its own call, through the same queue
and the same bound.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import torch

from ..errors import ConfigError, StateError, StokerError

Tensors = dict[str, torch.Tensor]


class Saturated(StokerError, RuntimeError):
    """More requests than ``max_pending`` are in the server; the client should retry later."""


@dataclass(kw_only=True)
class BatchingConfig:
    """How requests are grouped and how many may be in the server at once."""

    enabled: bool = True  # group concurrent requests into one model call
    max_batch: int = 256  # rows of one model call (and of one request)
    window_ms: float = 2.0  # longest wait for more requests while others are on their way
    max_pending: int = 64  # requests admitted at once (body arrived: decoding, queued, running); more get 503

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_pending"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.window_ms < 0:
            raise ConfigError(f"window_ms must be >= 0; got {self.window_ms}")


@dataclass
class _Item:
    inputs: Tensors
    rows: int
    future: asyncio.Future[Tensors]


BatchObserver = Callable[[int, int, float], None]  # (rows, requests, seconds) of each model call

# Per request (each request is its own asyncio task, with its own context): whether it has
# reached the queue yet. Set by slot(), flipped by infer().
_QUEUED: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("stoker_serve_queued")


class DynamicBatcher:
    """Runs ``model`` (dict of batched inputs -> dict of batched outputs) for concurrent requests."""

    def __init__(
        self,
        model: Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]],
        config: BatchingConfig,
        *,
        can_batch: bool = True,
        observe: BatchObserver | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.batching = config.enabled and can_batch  # a model whose outputs lack a batch dimension cannot be split
        self.observe = observe
        self.admitted = 0
        self.arriving = 0  # admitted and not yet queued: being decoded
        self._queue: asyncio.Queue[_Item] | None = None
        self._carry: _Item | None = None  # a request that did not fit the last group: first of the next
        self._running: list[_Item] = []  # the group of the model call in progress
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Start the worker (call inside the server's event loop)."""
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="stoker-model")
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the worker; requests still queued or running get ``Saturated`` (the server answers 503)."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        left = self._running + ([self._carry] if self._carry is not None else [])
        while self._queue is not None and not self._queue.empty():
            left.append(self._queue.get_nowait())
        for item in left:
            if not item.future.done():
                item.future.set_exception(Saturated("the server is shutting down; retry on another"))
        if self._executor is not None:  # waits for a call still running, off the event loop
            await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Admit one request for the block, or raise ``Saturated`` when ``max_pending`` are in."""
        if self.admitted >= self.config.max_pending:
            raise Saturated(f"the server holds {self.admitted} requests, its limit (--max_pending); retry later")
        queued = [False]
        token = _QUEUED.set(queued)
        self.admitted += 1
        self.arriving += 1
        try:
            yield
        finally:
            self.admitted -= 1
            if not queued[0]:  # refused while decoding: it never reached the queue
                self.arriving -= 1
            _QUEUED.reset(token)

    async def infer(self, inputs: Tensors, rows: int) -> Tensors:
        """The model's outputs for one request's ``inputs`` (``rows`` of them); call inside :meth:`slot`."""
        if self._queue is None:
            raise StateError("DynamicBatcher.infer before start()")
        future: asyncio.Future[Tensors] = asyncio.get_running_loop().create_future()
        queued = _QUEUED.get(None)
        if queued is not None and not queued[0]:
            queued[0] = True
            self.arriving -= 1
        await self._queue.put(_Item(inputs, rows, future))
        return await future

    # ---------------------------------------------------------------- the worker
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            group = self._running = await self._collect()
            start = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self._call, group)
            except Exception as e:  # noqa: BLE001 - the model's failure belongs to every request of the group
                for item in group:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            if self.observe is not None:
                self.observe(sum(i.rows for i in group), len(group), time.perf_counter() - start)
            for item, result in zip(group, results, strict=True):
                if not item.future.done():  # a client that went away leaves a cancelled future
                    item.future.set_result(result)
            self._running = []

    async def _collect(self) -> list[_Item]:
        assert self._queue is not None
        first, self._carry = self._carry or await self._queue.get(), None
        group, rows = [first], first.rows
        if not self.batching:
            return group
        deadline = time.monotonic() + self.config.window_ms / 1000
        while rows < self.config.max_batch:
            if self._queue.empty():
                # wait only while admitted requests are still being decoded
                remaining = deadline - time.monotonic()
                if self.arriving <= 0 or remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:  # noqa: UP041 - a distinct class before Python 3.11
                    break
            else:
                item = self._queue.get_nowait()
            if rows + item.rows > self.config.max_batch:
                self._carry = item
                break
            group.append(item)
            rows += item.rows
        return group

    def _call(self, group: list[_Item]) -> list[Tensors]:
        if len(group) == 1:
            return [dict(self.model(group[0].inputs))]
        names = list(group[0].inputs)
        outputs = self.model({n: torch.cat([item.inputs[n] for item in group]) for n in names})
        results, start = [], 0
        for item in group:
            results.append({k: v[start : start + item.rows] for k, v in outputs.items()})
            start += item.rows
        return results


__all__ = ["BatchingConfig", "DynamicBatcher", "Saturated"]
