"""Built-in sources: interrupted + resumed == uninterrupted (bitwise), reshuffling, sharding."""

from __future__ import annotations

import concurrent.futures
import gc
import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import stoker
from helpers.images import make_image_tree, make_index_tree, write_cifar
from stoker.data import ImageOptions, ReadOptions, cifar_binary, image_folder, text_chars
from stoker.data._workers import _SlotRun, one_kernel_thread
from stoker.data.cifar import CIFAR10_MEAN, CIFAR10_STD
from stoker.data.images import IMAGENET_MEAN, IMAGENET_STD
from stoker.data.images.decoders import available_decoders
from stoker.resolve import auto_worker_kind

Source = Callable[[], object]


def _leaves(batch: object) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for k in sorted(batch) for t in _leaves(batch[k])]
    return [t for item in batch for t in _leaves(item)]  # type: ignore[union-attr]


def same(a: list[object], b: list[object]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        lx, ly = _leaves(x), _leaves(y)
        if len(lx) != len(ly) or not all(s.dtype == t.dtype and torch.equal(s, t) for s, t in zip(lx, ly, strict=True)):
            return False
    return True


def draw(src: object, n: int) -> list[object]:
    it = iter(src)  # type: ignore[call-overload]
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def close(src: object) -> None:
    getattr(src, "close", lambda: None)()


def check_resume(make: Source, total: int, cut_points: list[int]) -> None:
    """For each cut k: draw k batches, save the state (through JSON, as a checkpoint does),
    build a fresh source, load it, draw the rest; the whole sequence equals one run's."""
    whole_src = make()
    whole = draw(whole_src, total)
    close(whole_src)
    for k in cut_points:
        first_src = make()
        first = draw(first_src, k)
        state = json.loads(json.dumps(first_src.state_dict()))  # type: ignore[attr-defined]
        close(first_src)
        second_src = make()
        second_src.load_state_dict(state)  # type: ignore[attr-defined]
        rest = draw(second_src, total - k)
        close(second_src)
        assert same(first + rest, whole), f"resume after {k} of {total} batches differs"


def cut_points(per_epoch: int, total: int, rng: random.Random) -> list[int]:
    # mid-epoch, right at and right after an epoch boundary, and a random step
    return sorted({1, per_epoch // 2, per_epoch, per_epoch + 1, rng.randrange(1, total)})


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def image_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("images"), classes=3, per_class=12, size=20)


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar(tmp_path_factory.mktemp("cifar"))


# ---------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("workers", [0, 2])
def test_arrays_resume_is_exact(workers: int) -> None:
    x = torch.randn(50, 3)
    y = torch.arange(50)

    def make():
        return stoker.data.arrays({"x": x}, y, read=stoker.data.ReadOptions(batch_size=8, seed=5, num_workers=workers))

    rng = random.Random()
    check_resume(make, 20, cut_points(6, 20, rng))


@pytest.mark.parametrize(("workers", "kind"), [(0, "auto"), (2, "thread"), (2, "process")])
def test_image_folder_train_resume_is_exact(image_tree: Path, workers: int, kind: str) -> None:
    def make():
        return image_folder(
            image_tree,
            read=ReadOptions(batch_size=5, seed=1, num_workers=workers, worker_kind=kind),
            image=ImageOptions(image_size=12),
        )

    per_epoch = len(make())
    assert per_epoch == 7  # 36 images, batches of 5
    total = 2 * per_epoch + 3
    check_resume(make, total, cut_points(per_epoch, total, random.Random()))


def test_image_folder_workers_give_the_same_batches_as_the_main_process(image_tree: Path) -> None:
    batches = {}
    for workers, kind in ((0, "auto"), (1, "process"), (2, "process"), (1, "thread"), (3, "thread")):
        src = image_folder(
            image_tree,
            read=ReadOptions(batch_size=5, seed=1, num_workers=workers, worker_kind=kind),
            image=ImageOptions(image_size=12),
        )
        batches[workers, kind] = draw(src, 16)  # 16 batches of 7 an epoch: through two epoch boundaries
        src.close()
    assert all(same(batches[0, "auto"], b) for b in batches.values())


@pytest.mark.parametrize("workers", [0, 2])
def test_image_folder_eval_pass_resume_is_exact_and_ends(image_tree: Path, workers: int) -> None:
    def make():
        return image_folder(
            image_tree,
            read=ReadOptions(batch_size=5, num_workers=workers),
            image=ImageOptions(image_size=12),
            train=False,
        )

    whole = draw(make(), 100)
    assert len(whole) == 8 and whole[-1][0].shape[0] == 1  # 36 = 7 x 5 + 1: the partial batch is kept
    check_resume(make, 8, [3, 7, 8])


@pytest.mark.parametrize("workers", [0, 2])
def test_cifar_resume_is_exact(cifar_dir: Path, workers: int) -> None:
    make = lambda: cifar_binary(cifar_dir, read=ReadOptions(batch_size=16, seed=2, num_workers=workers))  # noqa: E731
    per_epoch = len(make())
    assert per_epoch == 6  # 100 records, batches of 16
    total = 2 * per_epoch + 2
    check_resume(make, total, cut_points(per_epoch, total, random.Random()))


def test_text_resume_is_exact() -> None:
    files = stoker.data.stdlib_corpus(max_bytes=200_000)
    make = lambda: text_chars(files, seq_len=32, read=ReadOptions(batch_size=64, num_shards=2, shard_index=1))  # noqa: E731
    per_epoch = len(make())
    total = per_epoch + 5
    check_resume(make, total, cut_points(per_epoch, total, random.Random()))


def test_synthetic_images_state() -> None:
    src = stoker.data.synthetic_images((3, 8, 8), 10, batch_size=4, seed=3, channels_last=True)
    a = draw(src, 3)
    assert all(x[0] is a[0][0] for x in a)  # the same tensors: no work per step
    assert a[0][0].is_contiguous(memory_format=torch.channels_last) and a[0][1].max() < 10
    state = json.loads(json.dumps(src.state_dict()))
    other = stoker.data.synthetic_images((3, 8, 8), 10, batch_size=4, seed=3, channels_last=True)
    other.load_state_dict(state)
    assert same(draw(other, 1), a[:1]) and other.state_dict()["batch"] == 4
    with pytest.raises(ValueError, match="seed=3.*seed=4"):
        stoker.data.synthetic_images((3, 8, 8), 10, batch_size=4, seed=4).load_state_dict(state)


def test_state_is_tiny_json_and_refuses_other_data(image_tree: Path) -> None:
    src = image_folder(image_tree, read=ReadOptions(batch_size=5), image=ImageOptions(image_size=12))
    draw(src, 9)
    state = src.state_dict()
    assert state["epoch"] == 1 and state["batch"] == 2
    assert len(json.dumps(state)) < 200
    same_data = image_folder(image_tree, read=ReadOptions(batch_size=5), image=ImageOptions(image_size=12))
    same_data.load_state_dict(state)  # same data: fine
    other_seed = image_folder(image_tree, read=ReadOptions(batch_size=5, seed=9), image=ImageOptions(image_size=12))
    with pytest.raises(ValueError, match="seed=0 but this source has seed=9"):
        other_seed.load_state_dict(state)
    two = image_folder(image_tree, read=ReadOptions(batch_size=5, num_shards=2), image=ImageOptions(image_size=12))
    with pytest.raises(ValueError, match="num_shards=1 but this source has num_shards=2"):
        two.load_state_dict(state)
    x = torch.zeros(30, 2)
    with pytest.raises(ValueError, match="num_examples=36 but this source has num_examples=30"):
        stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=5)).load_state_dict(state)


def test_arrays_state_keys() -> None:
    src = stoker.data.arrays(torch.zeros(10, 2), read=stoker.data.ReadOptions(batch_size=3))
    assert set(src.state_dict()) == {
        "epoch",
        "batch",
        "seed",
        "num_examples",
        "num_shards",
        "shard_index",
        "batch_size",
        "samples",
    }


# ---------------------------------------------------------------------------------- order
def test_epochs_reshuffle_and_runs_repeat() -> None:
    x = torch.arange(40)

    def epochs(seed: int) -> list[torch.Tensor]:
        src = stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=40, seed=seed))
        return [next(src) for _ in range(3)]

    a, b, c = epochs(0), epochs(0), epochs(1)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))  # same seed: same orders
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])  # each epoch reshuffled
    assert not torch.equal(a[0], c[0])  # another seed: another order
    assert all(torch.equal(e.sort().values, x) for e in a)  # each epoch is a permutation


def test_image_augmentation_differs_between_epochs_and_repeats_across_runs(image_tree: Path) -> None:
    def images_by_file(seed: int) -> list[dict[int, torch.Tensor]]:
        src = image_folder(image_tree, read=ReadOptions(batch_size=36, seed=seed), image=ImageOptions(image_size=12))
        out = []
        for epoch in range(2):
            images, _ = next(src)
            order = src.epoch_order(epoch)
            out.append({int(i): images[j] for j, i in enumerate(order)})
        return out

    a, b = images_by_file(4), images_by_file(4)
    for e in range(2):
        assert all(torch.equal(a[e][i], b[e][i]) for i in a[e])
    differs = sum(not torch.equal(a[0][i], a[1][i]) for i in a[0])
    assert differs > 30  # a new crop/flip of (almost) every image in the next epoch


# ---------------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharding_is_disjoint_and_complete(tmp_path: Path, cifar_dir: Path, shards: int) -> None:
    index_tree = make_index_tree(tmp_path / "idx", classes=3, per_class=7)  # 21 images
    seen: dict[str, list[int]] = {"arrays": [], "image_folder": [], "cifar": []}
    for r in range(shards):
        arr = stoker.data.arrays(
            torch.arange(23),
            read=stoker.data.ReadOptions(batch_size=4, num_epochs=1, num_shards=shards, shard_index=r, seed=7),
        )
        seen["arrays"] += torch.cat(list(arr)).tolist()
        img = image_folder(
            index_tree,
            read=ReadOptions(batch_size=4, num_shards=shards, shard_index=r, num_workers=2 if r == 0 else 0),
            image=ImageOptions(image_size=8),
            train=False,
        )
        for images, _ in img:
            # flat-colour PNGs: red channel = example index, green = 7 everywhere
            raw = (
                images * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
            ) * 255
            assert torch.allclose(raw[:, 1], torch.full_like(raw[:, 1], 7.0), atol=0.01)
            seen["image_folder"] += raw[:, 0, 0, 0].round().long().tolist()
        cif = cifar_binary(
            cifar_dir,
            read=ReadOptions(batch_size=7, num_shards=shards, shard_index=r, shuffle=True, seed=3),
            train=False,
        )
        for images, _ in cif:
            # the eval images are not augmented: channel 0 pixels 0, 1 hold the record number
            raw = (
                (images * torch.tensor(CIFAR10_STD).view(1, 3, 1, 1) + torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1))
                .mul(255)
                .round()
                .long()
            )
            seen["cifar"] += (raw[:, 0, 0, 0] + 256 * raw[:, 0, 0, 1]).tolist()
    assert sorted(seen["arrays"]) == list(range(23))
    assert sorted(seen["image_folder"]) == list(range(21))
    assert sorted(seen["cifar"]) == list(range(100, 120))  # test_batch.bin holds records 100..119


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_training_shards_step_in_lockstep_and_are_disjoint(shards: int) -> None:
    per_replica = []
    for r in range(shards):
        src = stoker.data.arrays(
            torch.arange(50), read=stoker.data.ReadOptions(batch_size=4, num_shards=shards, shard_index=r, seed=1)
        )
        per_replica.append((len(src), torch.cat(draw(src, len(src))).tolist()))
    assert len({n for n, _ in per_replica}) == 1  # same number of batches on every replica
    ids = [i for _, got in per_replica for i in got]
    assert len(ids) == len(set(ids))  # no example twice in an epoch


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_text_streams_are_contiguous_and_shard_the_corpus(tmp_path: Path, shards: int) -> None:
    corpus = bytes(range(256)) * 7 + b"tail"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_bytes(corpus[1000:])
    (tmp_path / "a.txt").write_bytes(corpus[:1000])
    batch, seq = 3, 10
    streams: list[bytes] = []
    for r in range(shards):
        src = text_chars(
            tmp_path, seq_len=seq, read=ReadOptions(batch_size=batch, num_shards=shards, shard_index=r, num_epochs=1)
        )
        batches = list(src)
        assert len(batches) == len(src) > 0
        inputs = torch.cat([x for x, _ in batches], dim=1)
        targets = torch.cat([y for _, y in batches], dim=1)
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next byte
        assert inputs.dtype == torch.int64 and batches[0][0].shape == (batch, seq)
        streams += [bytes(row.tolist()) for row in inputs]
    stream_len = len(corpus) // (batch * shards)
    covered = ((stream_len - 1) // seq) * seq
    assert streams == [corpus[s * stream_len : s * stream_len + covered] for s in range(batch * shards)]


def test_stdlib_corpus_is_deterministic() -> None:
    a, b = stoker.data.stdlib_corpus(100_000), stoker.data.stdlib_corpus(100_000)
    assert a == b == sorted(a) and all(p.suffix == ".py" for p in a)
    assert sum(p.stat().st_size for p in a) <= 100_000 or len(a) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_advance_jumps_like_next(workers: int) -> None:
    x = torch.arange(30)
    for n in (0, 1, 4, 5, 7, 12):
        walked = stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=6, seed=3, num_workers=workers))
        draw(walked, n)
        jumped = stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=6, seed=3, num_workers=workers))
        jumped.advance(n)
        assert jumped.state_dict() == walked.state_dict()
        assert same(draw(jumped, 3), draw(walked, 3))
        walked.close()
        jumped.close()
    one_pass = stoker.data.arrays(x, read=stoker.data.ReadOptions(batch_size=6, num_epochs=1))
    one_pass.advance(5)
    assert draw(one_pass, 1) == []
    with pytest.raises(ValueError, match="ends 0 batches from here"):
        one_pass.advance(1)


def test_workers_stop_at_once_when_a_source_in_a_reference_cycle_is_collected(image_tree: Path) -> None:
    src = image_folder(
        image_tree,
        read=ReadOptions(batch_size=5, num_workers=2, worker_kind="process"),
        image=ImageOptions(image_size=12),
    )
    next(iter(src))
    workers = list(src._loader_it._workers)  # the worker processes
    assert all(w.is_alive() for w in workers)
    holder: dict[str, object] = {"source": src}
    holder["self"] = holder  # as the Estimator's run state holds the Infeed that holds a source
    del src, holder
    start = time.perf_counter()
    gc.collect()
    assert time.perf_counter() - start < 2.5  # not torch's 5 s join timeout per worker
    assert not any(w.is_alive() for w in workers)


def test_thread_workers_stop_when_a_source_in_a_reference_cycle_is_collected(image_tree: Path) -> None:
    src = image_folder(
        image_tree,
        read=ReadOptions(batch_size=5, num_workers=2, worker_kind="thread"),
        image=ImageOptions(image_size=12),
    )
    next(iter(src))
    pool = src._loader_it  # float32 batches: whole batches per thread, normalised there
    assert isinstance(pool, concurrent.futures.ThreadPoolExecutor) and pool._threads
    holder: dict[str, object] = {"source": src}
    holder["self"] = holder
    del src, holder
    gc.collect()  # the queued batches hold a copy of the source, not the source: it is freed
    assert pool._shutdown
    for thread in list(pool._threads):
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_slot_threads_stop_when_a_source_in_a_reference_cycle_is_collected(image_tree: Path) -> None:
    src = image_folder(
        image_tree,
        read=ReadOptions(batch_size=5, num_workers=2, worker_kind="thread"),
        image=ImageOptions(image_size=12, output="uint8"),
    )
    next(iter(src))
    run = src._loader_it
    assert isinstance(run, _SlotRun) and len(run.threads) == 2
    holder: dict[str, object] = {"source": src}
    holder["self"] = holder
    del src, holder
    gc.collect()  # the threads hold a copy of the source, not the source: it is freed
    assert run.stopped
    for thread in run.threads:
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_worker_kind_auto_takes_threads_only_where_the_decoder_releases_the_gil(image_tree: Path) -> None:
    assert (
        image_folder(
            image_tree, read=ReadOptions(batch_size=5), image=ImageOptions(image_size=12, decoder="pillow")
        ).worker_kind
        == "process"
    )
    assert stoker.data.arrays(torch.zeros(4), read=stoker.data.ReadOptions(batch_size=2)).worker_kind == "process"
    if "libjpeg-crop" in available_decoders():
        for workers, kind in ((0, "thread"), (4, "thread"), (5, "process")):  # beyond 4 the GIL would bound threads
            src = image_folder(
                image_tree,
                read=ReadOptions(batch_size=5, num_workers=workers),
                image=ImageOptions(image_size=12, decoder="libjpeg-crop"),
            )
            assert src.worker_kind == kind, workers
        # a CUDA infeed (pinned batches) keeps processes: threads measured slower there (H200 host)
        pinned = image_folder(
            image_tree,
            read=ReadOptions(batch_size=5, num_workers=2),
            image=ImageOptions(image_size=12, decoder="libjpeg-crop", output="uint8", pin_memory=True),
        )
        assert pinned.worker_kind == "process"
    assert auto_worker_kind(True, 4).value == "thread" and auto_worker_kind(True, 16).value == "process"
    assert auto_worker_kind(False, 1).value == "process"
    forced = image_folder(
        image_tree,
        read=ReadOptions(batch_size=5, worker_kind="thread"),
        image=ImageOptions(image_size=12, decoder="pillow"),
    )
    assert forced.worker_kind == "thread"
    with pytest.raises(ValueError, match=r"ReadOptions: worker_kind must be one of auto, thread, process; got 'fib'"):
        image_folder(image_tree, read=ReadOptions(batch_size=5, worker_kind="fib"), image=ImageOptions(image_size=12))


def test_a_decoding_thread_runs_torch_kernels_on_one_thread_and_leaves_the_others_alone() -> None:
    before = torch.get_num_threads()
    seen: list[tuple[bool, int]] = []

    def decoding_thread() -> None:
        seen.append((one_kernel_thread(), torch.get_num_threads()))

    thread = threading.Thread(target=decoding_thread)
    thread.start()
    thread.join()
    assert seen == [(True, 1)]
    assert torch.get_num_threads() == before  # the training thread keeps its pool


def test_resharding_keeps_the_examples_consumed():
    """Two replicas' saved positions become one replica's position with the same global batch."""
    import torch as _torch

    from stoker.data import arrays as _arrays

    x = _torch.arange(40.0).reshape(40, 1)
    two = [_arrays(x, read=ReadOptions(batch_size=4, seed=3, num_shards=2, shard_index=r)) for r in range(2)]
    seen = [next(two[r])[:, 0].tolist() for r in range(2) for _ in range(1)]
    seen += [next(two[r])[:, 0].tolist() for r in range(2)]
    one = _arrays(x, read=ReadOptions(batch_size=8, seed=3))
    one.load_state_dict(one.reshard_state_dict([s.state_dict() for s in two]))
    rest = [v for _ in range(3) for v in next(one)[:, 0].tolist()]
    consumed = sorted(v for batch in seen for v in batch)
    assert sorted(consumed + rest) == sorted(set(consumed + rest))  # nothing seen twice
    whole = _arrays(x, read=ReadOptions(batch_size=8, seed=3))
    first_two = sorted(v for _ in range(2) for v in next(whole)[:, 0].tolist())
    assert consumed == first_two  # 2 replica steps = the same examples as 2 global steps
    assert rest == [v for _ in range(3) for v in next(whole)[:, 0].tolist()]
    import pytest as _pytest

    with _pytest.raises(ValueError, match="global batch changed"):
        _arrays(x, read=ReadOptions(batch_size=4, seed=3)).reshard_state_dict([s.state_dict() for s in two])
