"""The infeed decides where batches are fetched: the training thread or a prefetch thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from stoker.engine.infeed import PROBE_BATCHES, Infeed

CPU = torch.device("cpu")


def rows(n: int, delay: float = 0.0, fail_at: int | None = None):  # noqa: ANN201
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    for i in range(n):
        if delay:
            time.sleep(delay)  # releases the GIL, as decoding or file reads do
        if i == fail_at:
            raise ValueError(f"bad record {i}")
        yield x[i : i + 1], x[i : i + 1]


def infeed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stoker-infeed"]


def test_in_memory_batches_on_the_cpu_are_fetched_without_a_thread():
    with Infeed(rows(60), device=CPU, prefetch_depth=2) as infeed:
        assert infeed.prefetching is None  # measuring
        got = [int(b.features) for b in infeed]
        assert infeed.prefetching is False
        assert not infeed_threads()
    assert got == list(range(60))
    assert infeed.state_dict() == {"source": None, "skip": 60}


def test_slow_fetches_start_the_prefetch_thread_after_the_probe_with_the_same_batches_and_position():
    with Infeed(rows(40, delay=0.001), device=CPU, prefetch_depth=2) as infeed:
        got = [int(next(infeed).features) for _ in range(PROBE_BATCHES + 1)]
        assert infeed.prefetching is True and infeed_threads()
        got += [int(next(infeed).features) for _ in range(5)]
        assert infeed.state_dict() == {"source": None, "skip": PROBE_BATCHES + 6}  # consumed, not prefetched
        got += [int(b.features) for b in infeed]
    assert got == list(range(40))
    assert not infeed_threads()


class Counted:
    """A stateful source: row ``i`` is ``i``; its state is the next row to read."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay, self.pos = n, delay, 0
        self.x = torch.arange(n, dtype=torch.float32).reshape(n, 1)

    def __iter__(self):  # noqa: ANN204
        return self

    def __next__(self):  # noqa: ANN204
        if self.pos >= self.n:
            raise StopIteration
        time.sleep(self.delay)
        i, self.pos = self.pos, self.pos + 1
        return self.x[i : i + 1], self.x[i : i + 1]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


def test_the_position_of_a_stateful_source_is_exact_before_during_and_after_the_switch():
    # Inline, the position is the source's own state read at checkpoint time; once the thread
    # runs ahead, it is a snapshot the thread took plus the batches consumed since.
    n = PROBE_BATCHES + 20
    with Infeed(Counted(n, delay=0.001), device=CPU, prefetch_depth=3, snapshot_every=4) as infeed:
        got, states, modes = [], [infeed.state_dict()], []
        for batch in infeed:
            got.append(int(batch.features))
            states.append(infeed.state_dict())
            modes.append(infeed.prefetching)
    assert got == list(range(n))
    assert modes[PROBE_BATCHES - 1] is None and modes[PROBE_BATCHES] is True  # switched at batch PROBE_BATCHES + 1
    assert [s["source"]["pos"] + s["skip"] for s in states] == list(range(n + 1))
    assert any(s["skip"] for s in states)  # some positions really come from a snapshot plus a count
    for k in (0, PROBE_BATCHES, PROBE_BATCHES + 1, PROBE_BATCHES + 2, PROBE_BATCHES + 7, n):
        with Infeed(Counted(n), device=CPU, prefetch_depth=0, restore=dict(states[k])) as resumed:
            assert [int(b.features) for b in resumed] == list(range(k, n)), k


def test_an_input_error_after_the_switch_reaches_the_training_thread():
    with Infeed(rows(40, delay=0.001, fail_at=30), device=CPU, prefetch_depth=2) as infeed:
        with pytest.raises(ValueError, match="bad record 30"):
            for _ in infeed:
                pass
        assert infeed.prefetching is True


def test_prefetch_depth_0_and_inline_sources_never_measure_or_start_a_thread():
    class Inline:
        prefers_inline_fetch = True

        def __iter__(self):  # noqa: ANN204
            return rows(40, delay=0.001)

    for source, depth in ((rows(40, delay=0.001), 0), (Inline(), 2)):
        with Infeed(source, device=CPU, prefetch_depth=depth) as infeed:
            assert infeed.prefetching is False
            assert len(list(infeed)) == 40
            assert infeed.prefetching is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_thread_starts_at_once():
    with Infeed(rows(10), device=torch.device("cuda"), prefetch_depth=2) as infeed:
        assert infeed.prefetching is True
        assert [int(b.features) for b in infeed] == list(range(10))


def test_a_resharded_position_keeps_the_batches_counted_past_its_snapshot():
    # A state saved with a prefetch thread is a snapshot plus a count of batches after it; when
    # it is re-sharded (saved by another number of replicas), the count must still be applied.
    import stoker

    x = torch.arange(64, dtype=torch.float32).reshape(64, 1)
    saved = stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=4, shuffle=False))
    for _ in range(3):
        next(saved)
    restore = {"reshard": [{"source": saved.state_dict(), "skip": 2}]}
    with Infeed(
        stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=4, shuffle=False)), device=CPU, restore=restore
    ) as infeed:
        assert next(infeed).features[0].item() == 20.0  # batch 5: 3 in the snapshot, 2 counted past it


@pytest.mark.parametrize("delay", [0.0, 0.001], ids=["inline", "prefetch-thread"])
def test_batches_a_rollback_took_out_are_passed_over_and_every_position_resumes(delay):
    # Stream batches 3, PROBE_BATCHES + 4 and PROBE_BATCHES + 5 were taken out by rollbacks: the
    # second pair is fetched by the prefetch thread when fetching is slow (after the probe).
    n, out = PROBE_BATCHES + 20, [3, PROBE_BATCHES + 4, PROBE_BATCHES + 5]
    restore = {"source": {"pos": 0}, "skip": 0, "raw": 0, "rollbacks": [{"step": 4, "batches": out}]}
    with Infeed(Counted(n, delay=delay), device=CPU, prefetch_depth=3, snapshot_every=4, restore=restore) as infeed:
        got, states = [], [infeed.state_dict()]
        for batch in infeed:
            got.append(int(batch.features))
            states.append(infeed.state_dict())
        assert infeed.prefetching is (delay > 0)
    kept = [i for i in range(n) if i not in out]
    assert got == kept
    assert [s["raw"] for s in states][-1] == n and all(s["rollbacks"][0]["batches"] == out for s in states)
    for k in range(len(states)):  # a checkpoint taken after any batch resumes at the next kept one
        with Infeed(Counted(n), device=CPU, prefetch_depth=0, restore=dict(states[k])) as resumed:
            assert [int(b.features) for b in resumed] == kept[k:], k
