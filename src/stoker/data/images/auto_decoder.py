"""``decoder="auto"``: the JPEG decoder measured fastest on a source's own examples.

``libjpeg-crop`` and ``simplejpeg`` give the same pixels bit for bit (both are libjpeg-turbo with
the fast integer DCT and the fast chroma upsampling; ``tests/data/images/test_jpeg_crop.py`` checks it),
so ``auto`` times each installed one on :data:`SAMPLE_EXAMPLES` of the source's own examples,
with the source's own crop boxes, resize and flips, and takes the faster
(:func:`stoker.resolve.image_decoder`, which keeps the first of the fixed order unless another is
clearly faster). Which one wins never changes a batch, only how fast it is built, so a rerun, a
resume or another replica that measured differently still reads the same pixels. Pillow's pixels
differ; ``auto`` takes it only where neither of the two works.

The timing costs one untimed pass and :data:`ROUNDS` timed tries over the examples per decoder
(about 0.1-0.3 s for ImageNet-sized JPEGs, plus the decoders' first load). It is done once per
process for a given data set and setting (the training source and a later one over the same
data reuse it), and its figures are kept in stoker's cache folder (:data:`FIGURES_FILE`, see
:mod:`stoker._cache`) keyed by this CPU, the torch and decoder versions, the setting and a hash
of the sampled examples' bytes: a restart on the same machine reads them instead of timing
again (the examples are still read, to hash them), another machine times anew.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..._cache import cache_dir, cpu_fingerprint, load_figures, store_figure
from ...resolve import Choice, image_decoder
from .._workers.threads import one_kernel_thread
from .decoders import ImageDecodeError, available_decoders, decode_crop_resize, get_decoder

#: Examples timed, spread evenly over the data set (an image folder lists its classes in turn).
SAMPLE_EXAMPLES = 16
#: Timed tries of each example per decoder, after one untimed pass; each example's fastest counts.
ROUNDS = 3
#: The decoders whose pixels are the same bit for bit, in ``auto``'s fixed order.
SAME_PIXELS: tuple[str, ...] = ("libjpeg-crop", "simplejpeg")
#: The cache file of the timings, in stoker's cache folder.
FIGURES_FILE = "decoder_timings.json"

_chosen: dict[Any, Choice[str]] = {}


@dataclass(frozen=True)
class TimingSample:
    """One example as the source would decode it: its bytes, crop box, resize method, flip and
    the image's ``(width, height)`` from its header."""

    data: bytes
    box: tuple[float, float, float, float]
    method: str
    flip: bool
    image_wh: tuple[int, int]


def candidates() -> list[str]:
    """The installed decoders among :data:`SAME_PIXELS`, in order."""
    return [name for name in available_decoders() if name in SAME_PIXELS]


def sample_indices(num_examples: int, count: int = SAMPLE_EXAMPLES) -> list[int]:
    """``count`` example indices spread evenly over ``num_examples`` (all of them when fewer)."""
    if num_examples <= count:
        return list(range(num_examples))
    return [(k * num_examples) // count for k in range(count)]


def time_decoders(
    names: Sequence[str], samples: Sequence[TimingSample], image_size: int
) -> tuple[dict[str, float], int]:
    """Milliseconds per example of each decoder in ``names`` building ``samples``' crops (the mean
    over the examples of each one's fastest of :data:`ROUNDS` tries, after an untimed pass), and
    how many examples were timed: samples some
    decoder cannot read are left out of every decoder's time (an empty dict when none is left)."""
    decoders = {name: get_decoder(name) for name in names}
    out = torch.empty((image_size, image_size, 3), dtype=torch.uint8)

    def build(name: str, sample: TimingSample) -> None:
        decode_crop_resize(
            sample.data,
            sample.box,
            image_size,
            sample.method,
            sample.flip,
            decoder=decoders[name],
            out=out,
            image_wh=sample.image_wh,
        )

    readable = []
    for sample in samples:  # the untimed pass: loads the libraries, warms the caches, finds bad files
        try:
            for name in names:
                build(name, sample)
        except ImageDecodeError:
            continue
        readable.append(sample)
    if not readable:
        return {}, 0
    # Each example's time is its fastest of ROUNDS, decoders taking turns example by example: a
    # burst of load from elsewhere lands on one try of one example, not on one decoder's total.
    best = {name: [float("inf")] * len(readable) for name in names}
    for round_ in range(ROUNDS):
        for k, sample in enumerate(readable):
            for name in names if (round_ + k) % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                build(name, sample)
                best[name][k] = min(best[name][k], time.perf_counter() - start)
    return {name: 1000.0 * sum(times) / len(times) for name, times in best.items()}, len(readable)


def time_decoders_one_thread(
    names: Sequence[str], samples: Sequence[TimingSample], image_size: int
) -> tuple[dict[str, float], int]:
    """:func:`time_decoders` on a thread of its own whose torch kernels (the resize) run on that
    thread alone, as in a decoding worker: with torch's default one thread per core the resize's
    OpenMP team spins on cores other processes use, which made the same examples take 0.8 ms or
    10 ms from one run to the next (2 cores, 2026-11-28); on one thread they took 0.76-0.79 ms."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stoker-decoder-timing") as pool:
        pool.submit(one_kernel_thread).result()
        return pool.submit(time_decoders, names, samples, image_size).result()


def choose_decoder(key: Any, samples: Sequence[TimingSample], image_size: int) -> Choice[str]:
    """``auto``'s decoder for the examples ``samples`` (``key``: what identifies the data set and
    the setting, for reuse within this process)."""
    names = candidates()
    if len(names) < 2:
        return image_decoder(names, None, 0)
    key = (key, tuple(names))
    if key not in _chosen:
        _chosen[key] = _cached_or_timed(figures_key(key, names, samples), names, samples, image_size)
    return _chosen[key]


def figures_key(key: Any, names: Sequence[str], samples: Sequence[TimingSample]) -> str:
    """The key of the timings in the cache file: what they hold for (this CPU, the torch build
    whose resize is timed, the decoders' versions) and what was timed (the setting ``key`` and
    the sampled examples: their bytes and crops)."""
    what = hashlib.sha256(repr(key).encode())
    for sample in samples:
        what.update(hashlib.sha256(sample.data).digest())
        what.update(repr((sample.box, sample.method, sample.flip, sample.image_wh)).encode())
    return f"{cpu_fingerprint()}|torch {torch.__version__}|{decoder_versions(names)}|{what.hexdigest()[:24]}"


def decoder_versions(names: Sequence[str]) -> str:
    """The installed versions of the decoders ``names``: simplejpeg's release, libjpeg-crop's
    build (named by the hash of its source and flags)."""
    parts = []
    for name in names:
        if name == "simplejpeg":
            import simplejpeg

            parts.append(f"simplejpeg {getattr(simplejpeg, '__version__', '?')}")
        elif name == "libjpeg-crop":
            from . import jpeg_crop

            parts.append(jpeg_crop.library_path().stem)
        else:
            parts.append(name)
    return " ".join(parts)


def _cached_or_timed(
    figures: str, names: Sequence[str], samples: Sequence[TimingSample], image_size: int
) -> Choice[str]:
    """The choice from the cached timings under ``figures``, else from timings taken now (and
    cached when something was timed)."""
    entry = load_figures(FIGURES_FILE).get(figures)
    if isinstance(entry, dict):
        try:
            ms = {name: float(entry["ms"][name]) for name in names}
            examples, measured = int(entry["examples"]), str(entry["measured"])
        except (KeyError, TypeError, ValueError):
            pass  # an entry of another shape: timed again and replaced
        else:
            choice = image_decoder(names, ms, examples)
            return Choice(choice.value, f"{choice.reason} (on {measured}, cached in {cache_dir() / FIGURES_FILE})")
    ms, examples = time_decoders_one_thread(names, samples, image_size)
    if ms:
        store_figure(FIGURES_FILE, figures, {"ms": ms, "examples": examples, "measured": time.strftime("%Y-%m-%d")})
    return image_decoder(names, ms, examples)


__all__ = [
    "FIGURES_FILE",
    "ROUNDS",
    "SAME_PIXELS",
    "SAMPLE_EXAMPLES",
    "TimingSample",
    "candidates",
    "choose_decoder",
    "decoder_versions",
    "figures_key",
    "sample_indices",
    "time_decoders",
    "time_decoders_one_thread",
]
