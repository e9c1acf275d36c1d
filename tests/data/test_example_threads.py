"""Decoding threads that build a batch one example at a time, helped by the thread that asks for it
(``stoker.data._workers._ExampleThreads``): the batches are the inline ones whoever decodes what,
the asking thread decodes while its batch is not ready, bad examples are reported in slot order,
and a bug in a decoding thread reaches the caller."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers.images import make_image_tree
from stoker.data import ImageOptions, ReadOptions, image_folder
from stoker.data._workers import _ExampleThreads
from stoker.data.images import EncodedImageSource
from stoker.data.images.decoders import available_decoders

pytestmark = pytest.mark.skipif(
    "libjpeg-crop" not in available_decoders(), reason="threads decode by default only with libjpeg-crop"
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("images"), classes=3, per_class=10, size=24)


def _draw(src: EncodedImageSource, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    it = iter(src)
    batches = [next(it) for _ in range(n)]
    src.close()
    return batches


def _same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(a, b, strict=True)
    )


def test_a_uint8_thread_source_builds_by_example_and_is_fetched_on_the_training_thread(tree: Path) -> None:
    src = image_folder(
        tree,
        read=ReadOptions(batch_size=4, num_workers=1, worker_kind="thread"),
        image=ImageOptions(image_size=12, output="uint8"),
    )
    assert isinstance(src._workers, _ExampleThreads) and src.prefers_inline_fetch
    floats = image_folder(
        tree, read=ReadOptions(batch_size=4, num_workers=1, worker_kind="thread"), image=ImageOptions(image_size=12)
    )
    assert not isinstance(floats._workers, _ExampleThreads) and not floats.prefers_inline_fetch  # normalised off it
    processes = image_folder(
        tree, read=ReadOptions(batch_size=4, num_workers=1, worker_kind="process"), image=ImageOptions(image_size=12)
    )
    assert not processes.prefers_inline_fetch  # the infeed may fetch them on its own thread
    pinned_kind = image_folder(
        tree,
        read=ReadOptions(batch_size=4, num_workers=1),
        image=ImageOptions(image_size=12, decoder="pillow", output="uint8"),
    )
    assert pinned_kind.worker_kind == "process" and not pinned_kind.prefers_inline_fetch


def test_the_asking_thread_decodes_while_its_batch_is_not_ready(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fill = EncodedImageSource.fill_slot
    decoded_by: list[str] = []

    def slow_in_workers(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        name = threading.current_thread().name
        decoded_by.append(name)
        if name != threading.main_thread().name:
            time.sleep(0.02)  # the decoding thread falls behind: the caller must help
        return fill(self, *args, **kwargs)

    monkeypatch.setattr(EncodedImageSource, "fill_slot", slow_in_workers)
    read, image = ReadOptions(batch_size=4, seed=3), ImageOptions(image_size=12, output="uint8")
    threads = dataclasses.replace(read, num_workers=1, worker_kind="thread")
    helped = _draw(image_folder(tree, read=threads, image=image), 12)  # 7.5 batches an epoch
    main = threading.main_thread().name
    assert decoded_by.count(main) > len(decoded_by) // 3  # the caller did a good share
    assert any(n != main for n in decoded_by)  # and so did the decoding thread
    monkeypatch.setattr(EncodedImageSource, "fill_slot", fill)
    assert _same(helped, _draw(image_folder(tree, read=read, image=image), 12))  # bitwise the batches built inline


def test_bad_examples_are_reported_in_slot_order_as_inline(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_image_tree(tmp_path, classes=1, per_class=8, size=16)
    for name in ("img_001.jpg", "img_002.jpg"):  # slots 1 and 2 of the first batch
        (root / "class_0" / name).write_bytes(b"not a jpeg" * 20)
    reports = []
    for workers in (0, 2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stoker"):
            src = image_folder(
                root,
                read=ReadOptions(batch_size=4, skip_bad_examples=True, num_workers=workers),
                image=ImageOptions(image_size=8),
                train=False,
            )
            batch = next(iter(src))
            src.close()
        messages = [r.getMessage() for r in caplog.records if "skipped a bad example" in r.getMessage()]
        reports.append(([re.sub(r" at 0x[0-9a-f]+", "", m) for m in messages], batch))  # Pillow names a BytesIO
    (inline_log, inline_batch), (thread_log, thread_batch) = reports
    assert len(inline_log) == 2 and thread_log == inline_log
    assert "img_001" in inline_log[0] and "img_002" in inline_log[1]
    assert torch.equal(inline_batch[0], thread_batch[0]) and torch.equal(inline_batch[1], thread_batch[1])


def test_a_bug_in_a_decoding_thread_reaches_the_caller(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise ZeroDivisionError("a bug, not bad data")

    monkeypatch.setattr(EncodedImageSource, "fill_slot", broken)
    src = image_folder(
        tree,
        read=ReadOptions(batch_size=4, num_workers=2, worker_kind="thread"),
        image=ImageOptions(image_size=12, output="uint8"),
    )
    with pytest.raises(ZeroDivisionError, match="a bug, not bad data"):
        next(iter(src))
    src.close()
