"""``decoder="auto"``: timed on the source's own examples, the faster of the decoders whose
pixels are the same, so the choice changes how fast a batch is built, never the batch."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image

import stoker.data.images.auto_decoder as auto
from helpers.images import noisy_jpeg
from stoker.data import ImageOptions, ReadOptions, image_folder
from stoker.data.images import jpeg_crop
from stoker.resolve import Choice

both = pytest.mark.skipif(
    not jpeg_crop.available() or "simplejpeg" not in auto.candidates(),
    reason="needs both libjpeg-crop and simplejpeg",
)


def jpeg_tree(root: Path, classes: int = 2, per_class: int = 10, size: tuple[int, int] = (120, 90)) -> Path:
    """Detailed JPEGs (odd iMCU edges), one folder per class."""
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            (root / f"c{c}" / f"{i:02d}.jpg").write_bytes(noisy_jpeg(*size, seed=100 * c + i))
    return root


# ------------------------------------------------------------------------------ the timing
@both
def test_timing_covers_every_readable_example_and_leaves_out_a_bad_one(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "d")
    source = image_folder(root, read=ReadOptions(batch_size=4), image=ImageOptions(decoder="pillow"))
    samples = []
    for index in range(5):
        example, plan = source._plan_example(index, None)
        samples.append(auto.TimingSample(example.data, plan.box, "bilinear", plan.flip, plan.image_wh))
    ms, timed = auto.time_decoders(auto.SAME_PIXELS, samples, 32)
    assert timed == 5 and set(ms) == set(auto.SAME_PIXELS) and all(0.0 < t < 1000.0 for t in ms.values())
    cut = auto.TimingSample(
        samples[0].data[:200],
        *[getattr(samples[0], f) for f in ("box", "method", "flip")],
        image_wh=samples[0].image_wh,
    )
    assert auto.time_decoders(auto.SAME_PIXELS, [cut, *samples[1:]], 32)[1] == 4
    assert auto.time_decoders(auto.SAME_PIXELS, [cut], 32) == ({}, 0)


def test_sample_indices_spread_over_the_classes() -> None:
    assert auto.sample_indices(5) == [0, 1, 2, 3, 4]
    assert auto.sample_indices(160, 4) == [0, 40, 80, 120]
    assert len(set(auto.sample_indices(1000))) == auto.SAMPLE_EXAMPLES


# ------------------------------------------------------------------------------ the source
@both
@pytest.mark.parametrize("fastest", ["libjpeg-crop", "simplejpeg"])
def test_auto_takes_the_measured_faster_and_its_batches_are_the_same_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fastest: str
) -> None:
    root = jpeg_tree(tmp_path / "d")
    seen: list[int] = []

    def timed(names: list[str], samples: list[auto.TimingSample], size: int) -> tuple[dict[str, float], int]:
        seen.append(len(samples))
        return {name: (1.0 if name == fastest else 3.0) for name in names}, len(samples)

    monkeypatch.setattr(auto, "time_decoders_one_thread", timed)
    monkeypatch.setattr(auto, "_chosen", {})
    source = image_folder(
        root, read=ReadOptions(batch_size=4, seed=3), image=ImageOptions(image_size=32, decoder="auto")
    )
    assert source.decoder_choice.value == fastest == source.decoder_name
    assert source.decoder_choice.reason.startswith("auto: libjpeg-crop ") and seen == [16]
    image_folder(root, read=ReadOptions(batch_size=4, seed=3), image=ImageOptions(image_size=32, decoder="auto"))
    assert seen == [16], "the same data and setting are timed once per process"
    image_folder(
        root, read=ReadOptions(batch_size=4, seed=3), image=ImageOptions(image_size=32, decoder="auto"), train=False
    )
    assert seen == [16, 16], "another setting (evaluation crops) is timed again"
    # whichever wins, the batches are the ones each named decoder builds
    first = next(iter(source))[0]
    for name in auto.SAME_PIXELS:
        named = image_folder(
            root, read=ReadOptions(batch_size=4, seed=3), image=ImageOptions(image_size=32, decoder=name)
        )
        torch.testing.assert_close(next(iter(named))[0], first, rtol=0, atol=0)


def test_auto_with_a_single_fast_decoder_times_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = jpeg_tree(tmp_path / "d", per_class=3)

    def refuse(*args: object) -> None:
        raise AssertionError("nothing to choose between: nothing is timed")

    monkeypatch.setattr(auto, "time_decoders_one_thread", refuse)
    monkeypatch.setattr(auto, "candidates", lambda: [])
    source = image_folder(root, read=ReadOptions(batch_size=2), image=ImageOptions(decoder="auto"))
    assert source.decoder_choice == Choice("pillow", "auto: neither libjpeg-crop nor simplejpeg works here")
    assert source.decoder_name == "pillow"


@both
def test_auto_on_unreadable_examples_still_builds_the_source(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "d", per_class=2)
    for path in sorted(root.rglob("*.jpg")):
        path.write_bytes(path.read_bytes()[:100])  # headers survive, the scans do not
    source = image_folder(
        root, read=ReadOptions(batch_size=2, skip_bad_examples=True), image=ImageOptions(decoder="auto")
    )
    assert source.decoder_choice.value == "libjpeg-crop"
    assert source.decoder_choice.reason.endswith("(nothing readable to time)")


@both
def test_a_real_timing_of_this_machine_names_both_decoders(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "d", size=(500, 375), per_class=8)
    choice = image_folder(
        root, read=ReadOptions(batch_size=2), image=ImageOptions(image_size=224, decoder="auto")
    ).decoder_choice
    assert choice.value in auto.SAME_PIXELS
    assert "libjpeg-crop " in choice.reason and "simplejpeg " in choice.reason and "timed on 16 " in choice.reason


def test_a_png_tree_is_not_a_problem(tmp_path: Path) -> None:
    root = tmp_path / "p"
    (root / "a").mkdir(parents=True)
    for i in range(3):
        buf = io.BytesIO()
        Image.new("RGB", (20, 20), (i, 2, 3)).save(buf, format="PNG")
        (root / "a" / f"{i}.png").write_bytes(buf.getvalue())
    source = image_folder(root, read=ReadOptions(batch_size=3), image=ImageOptions(image_size=8, decoder="auto"))
    assert source.decoder_choice.value in ("pillow", *auto.SAME_PIXELS)
    assert next(iter(source))[0].shape == (3, 3, 8, 8)


# ------------------------------------------------------------------------------ across restarts
@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """Stubbed timings (simplejpeg faster), counted; a cache folder of this test's own; and no
    choice kept in this process, as after a restart."""
    seen: list[int] = []

    def timed(names: list[str], samples: list[auto.TimingSample], size: int) -> tuple[dict[str, float], int]:
        seen.append(len(samples))
        return {"libjpeg-crop": 2.0, "simplejpeg": 1.0}, len(samples)

    monkeypatch.setattr(auto, "time_decoders_one_thread", timed)
    monkeypatch.setattr(auto, "_chosen", {})
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    return seen


def restart_and_choose(root: Path, monkeypatch: pytest.MonkeyPatch) -> Choice[str]:
    monkeypatch.setattr(auto, "_chosen", {})  # a new process: only the cache folder remains
    source = image_folder(root, read=ReadOptions(batch_size=4), image=ImageOptions(image_size=32, decoder="auto"))
    return source.decoder_choice


@both
def test_a_restart_on_the_same_machine_reads_the_timings_instead_of_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timings: list[int]
) -> None:
    root = jpeg_tree(tmp_path / "d", per_class=3)
    first = restart_and_choose(root, monkeypatch)
    assert first == Choice(
        "simplejpeg", "auto: libjpeg-crop 2.00, simplejpeg 1.00 ms per image, timed on 6 of this data's examples"
    )
    again = restart_and_choose(root, monkeypatch)
    assert timings == [6], "the restart timed nothing"
    assert again.value == "simplejpeg"
    assert again.reason.startswith(first.reason + " (on 20") and again.reason.endswith(
        f"cached in {tmp_path / 'cache' / auto.FIGURES_FILE})"
    )


@both
@pytest.mark.parametrize("change", ["cpu", "decoder version", "torch", "the examples' bytes"])
def test_a_changed_key_times_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timings: list[int], change: str
) -> None:
    root = jpeg_tree(tmp_path / "d", per_class=3)
    restart_and_choose(root, monkeypatch)
    if change == "cpu":
        monkeypatch.setattr(auto, "cpu_fingerprint", lambda: "cpu|Another CPU|flags 0123456789ab")
    elif change == "decoder version":
        monkeypatch.setattr(auto, "decoder_versions", lambda names: "simplejpeg 99.0 jpeg_crop-0000")
    elif change == "torch":
        monkeypatch.setattr(auto.torch, "__version__", "9.9.9")
    else:
        (root / "c0" / "00.jpg").write_bytes(noisy_jpeg(120, 90, seed=999))
    restart_and_choose(root, monkeypatch)
    assert timings == [6, 6]
    restart_and_choose(root, monkeypatch)
    assert timings == [6, 6], "the new key's timings are cached beside the old"


@both
@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_a_corrupt_timings_file_is_said_once_and_timed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timings: list[int], caplog: pytest.LogCaptureFixture, content: str
) -> None:
    root = jpeg_tree(tmp_path / "d", per_class=3)
    path = tmp_path / "cache" / auto.FIGURES_FILE
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert restart_and_choose(root, monkeypatch).value == "simplejpeg"
    assert timings == [6]
    (line,) = [r.getMessage() for r in caplog.records if "stoker cache" in r.getMessage()]
    assert line.startswith(f"stoker cache {path} ") and "measured again" in line
    restart_and_choose(root, monkeypatch)
    assert timings == [6], "the file was rewritten whole"
