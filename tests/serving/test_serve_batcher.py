"""DynamicBatcher alone: grouping up to max_batch rows, each request's own rows back, admission, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from stoker.serving.batcher import BatchingConfig, DynamicBatcher, Saturated


def doubling(calls: list[int], gate: threading.Event | None = None):
    def model(inputs):
        if gate is not None:
            gate.wait(10)
        calls.append(int(inputs["x"].shape[0]))
        return {"y": inputs["x"] * 2, "rowsum": inputs["x"].sum(1)}

    return model


async def _request(batcher: DynamicBatcher, x: torch.Tensor):
    async with batcher.slot():
        return await batcher.infer({"x": x}, int(x.shape[0]))


def test_queued_requests_run_together_up_to_max_batch_and_get_their_own_rows():
    async def main():
        calls: list[int] = []
        gate = threading.Event()
        batcher = DynamicBatcher(doubling(calls, gate), BatchingConfig(max_batch=4, window_ms=50))
        await batcher.start()
        xs = [torch.full((rows, 2), float(i)) for i, rows in enumerate([1, 3, 1, 2, 2])]
        tasks = [asyncio.create_task(_request(batcher, x)) for x in xs]
        await asyncio.sleep(0.05)  # all five queue behind the first call, held at the gate
        gate.set()
        results = await asyncio.gather(*tasks)
        await batcher.stop()
        return calls, xs, results

    calls, xs, results = asyncio.run(main())
    for x, out in zip(xs, results, strict=True):
        assert torch.equal(out["y"], x * 2) and torch.equal(out["rowsum"], x.sum(1))
    # in arrival order, at most 4 rows a call: [1 + 3], [1 + 2] (the next 2 would make 5), [2]
    assert calls == [4, 3, 2]


def test_batching_off_runs_each_request_alone():
    async def main():
        calls: list[int] = []
        batcher = DynamicBatcher(doubling(calls), BatchingConfig(enabled=False))
        await batcher.start()
        await asyncio.gather(*[_request(batcher, torch.ones(2, 2)) for _ in range(4)])
        await batcher.stop()
        return calls

    assert asyncio.run(main()) == [2, 2, 2, 2]


def test_admission_past_max_pending_and_shutdown_with_queued_requests_raise_saturated():
    async def main():
        gate = threading.Event()
        batcher = DynamicBatcher(doubling([], gate), BatchingConfig(max_pending=2, enabled=False))
        await batcher.start()
        first = asyncio.create_task(_request(batcher, torch.ones(1, 2)))
        second = asyncio.create_task(_request(batcher, torch.ones(1, 2)))
        await asyncio.sleep(0.05)
        with pytest.raises(Saturated, match="limit"):
            await _request(batcher, torch.ones(1, 2))
        stopping = asyncio.create_task(batcher.stop())
        await asyncio.sleep(0.05)
        gate.set()  # let the running call finish so the executor can shut down
        await stopping
        return await asyncio.gather(first, second, return_exceptions=True)

    outcomes = asyncio.run(main())
    # the running request and the queued one are both told the server is going away
    assert all(isinstance(o, Saturated) and "shutting down" in str(o) for o in outcomes), outcomes


def test_config_refuses_nonsense():
    with pytest.raises(ValueError, match="max_pending must be >= 1"):
        BatchingConfig(max_pending=0)
    with pytest.raises(ValueError, match="window_ms must be >= 0"):
        BatchingConfig(window_ms=-1)


def test_no_window_is_waited_for_when_no_other_request_is_on_its_way():
    # request A got its answer and is still being answered (inside its slot); request B alone
    # must run at once, not after the 1 s window: only requests not yet queued are waited for
    async def main():
        calls: list[int] = []
        batcher = DynamicBatcher(doubling(calls), BatchingConfig(window_ms=1000))
        await batcher.start()
        async with batcher.slot():
            await batcher.infer({"x": torch.ones(1, 2)}, 1)
            start = time.perf_counter()
            await _request(batcher, torch.ones(1, 2))
            elapsed = time.perf_counter() - start
        arriving = batcher.arriving
        await batcher.stop()
        return elapsed, arriving

    elapsed, arriving = asyncio.run(main())
    assert elapsed < 0.5 and arriving == 0
