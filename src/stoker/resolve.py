"""Every "auto" decision about the machine, each made once, with the reason for it.

A choice that depends on the machine (how many threads, what decodes the input and in what
kind of worker, ...) is a pure function here from explicit facts (core counts, what the
decoder can do, where the step runs) to a :class:`Choice`: the value and a short reason a run
header can print. Nothing here measures or reads the machine: callers gather the facts
(``stoker.kernels.machine``, ``stoker.data.images.decoders``) and pass them in, so each rule can be
tested on made-up facts.

This module is a leaf (it imports no other part of stoker), so every layer may ask it: the
data sources resolve ``worker_kind="auto"`` with it, and ``stoker bench`` builds its plan from
the same rules. The thresholds are measured values; where they were measured is in the docs
page each constant cites.

A rule elsewhere (the device, the kernels, the CUDA graph: each owner keeps its own) says its
reason as a :class:`Reason` when the reason names a setting: it reads as ``RunConfig``'s
fields, and a front end with other names for them (``stoker bench``'s flags) says it in its
own (:meth:`Reason.spelled`), so a choice and its error read the same wherever they are shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_NO_VALUE: Any = object()


class Names:
    """How a reason names a setting: this class as ``RunConfig``'s fields
    (``RunConfig.device='cpu'``); a front end subclasses it with its own names for them."""

    def __call__(self, field: str, value: object = _NO_VALUE) -> str:
        """``field`` alone, or set to ``value``."""
        return self.field(field) if value is _NO_VALUE else f"{self.field(field)}={self.value(value)}"

    def field(self, name: str) -> str:
        return f"RunConfig.{name}"

    def value(self, value: object) -> str:
        return repr(value)


#: ``RunConfig``'s names, what a :class:`Reason` reads as
RUN_CONFIG_NAMES = Names()


class Reason(str):
    """A reason (or an error message) naming settings, made by ``say(names)``: it reads as
    ``say(RUN_CONFIG_NAMES)``, and :meth:`spelled` says it with another front end's names. A
    ``ConfigError`` whose message is a ``Reason`` is re-spelled the same way (:func:`spelled`)."""

    say: Callable[[Names], str]

    def __new__(cls, say: Callable[[Names], str]) -> Reason:
        reason = super().__new__(cls, say(RUN_CONFIG_NAMES))
        reason.say = say
        return reason

    def spelled(self, names: Names) -> str:
        return self.say(names)

    def __reduce__(self) -> tuple[Any, ...]:  # a plain string crosses processes (say may be a closure)
        return (str, (str(self),))


def spelled(text: object, names: Names) -> str:
    """``text`` said with ``names``: a :class:`Reason` (or an exception whose message is one) is
    re-spelled, anything else is its ``str``."""
    if isinstance(text, BaseException) and len(text.args) == 1:
        text = text.args[0]
    return text.spelled(names) if isinstance(text, Reason) else str(text)


@dataclass(frozen=True)
class Choice(Generic[T]):
    """One resolved "auto": the ``value`` chosen and the ``reason`` (a short clause, no full
    stop). ``note`` is the line a run prints when the choice departs from what the user would
    expect (fewer threads than cores, ...); empty otherwise."""

    value: T
    reason: str
    note: str = ""


@dataclass(frozen=True)
class MachineFacts:
    """What the rules need to know about the machine and the launch; gathered by the caller
    (``stoker.kernels.machine``: :func:`~stoker.kernels.machine.usable_cores`,
    :func:`~stoker.kernels.machine.busy_cores`), or made up in a test."""

    #: cores this process may run on (its CPU affinity)
    usable_cores: int
    #: cores of the machine (``os.cpu_count()``)
    cpu_count: int
    #: torch's intra-op threads before any choice (its default: one per core)
    default_threads: int
    #: cores other processes kept busy just before the run; ``None``: unknown
    busy_cores: float | None
    #: replicas started on this machine (torchrun's ``LOCAL_WORLD_SIZE``)
    local_world_size: int = 1


#: A CPU run whose training step per image lasts at least this many JPEG decodes decodes in the
#: infeed's thread: worker processes cost it more than they win (resnet50 on a CPU).
#: Measured: docs/results/cnn.md#auto-thresholds.
INLINE_DECODE_RATIO = 20.0
#: One core decodes a 224 training crop of a ~500x375 JPEG in about this long.
#: Measured: docs/results/cnn.md#auto-thresholds.
DECODE_MS_PER_IMAGE = 2.0
#: On a CUDA host each replica keeps this many cores from decoding (its training and infeed
#: threads). Measured: docs/results/cnn.md#auto-thresholds.
CUDA_CORES_KEPT = 2
#: Zoo image models that train faster NCHW than NHWC (channels_last) on a CPU with torch's
#: oneDNN kernels; every other image model trains NHWC there. Measured: docs/results/cnn.md#data-format.
CPU_NCHW_MODELS: frozenset[str] = frozenset({"vgg11", "vgg16", "vgg19"})


def intra_threads(*, given: int | None, input_bound: Choice[bool], facts: MachineFacts) -> Choice[int]:
    """torch's intra-op threads: ``given`` (``--num_intra_threads``); 1 where the input is the
    work (``input_bound``); the machine's cores shared by the local replicas; else the cores
    that were idle just before the run (an OpenMP pool with more threads than idle cores waits
    for its slowest thread; measured: docs/results/cnn.md#auto-thresholds)."""
    if given is not None:
        return Choice(given, "--num_intra_threads")
    if input_bound.value:
        return Choice(
            1,
            input_bound.reason,
            f"Note: the input is the work here ({input_bound.reason}): using 1 intra-op thread and leaving the "
            "cores to the decoders (--num_intra_threads overrides)",
        )
    if facts.local_world_size > 1:  # the other replicas are starting too: sampling would count them
        share = max(1, facts.cpu_count // facts.local_world_size)
        return Choice(share, f"{facts.local_world_size} local replicas share {facts.cpu_count} cores")
    default, busy = facts.default_threads, facts.busy_cores
    if busy is None:
        return Choice(default, "torch's default (busy cores unknown)")
    idle = max(1, min(default, round(default - busy)))
    if idle < default:
        return Choice(
            idle,
            f"{busy:.1f} of {facts.cpu_count} cores were busy before the run",
            f"Note: {busy:.1f} of {facts.cpu_count} cores were busy before the run: using {idle} intra-op "
            f"thread(s) instead of {default} (--num_intra_threads overrides)",
        )
    return Choice(default, "torch's default: the cores were idle before the run")


def input_bound(step_decodes: float | None) -> Choice[bool]:
    """Whether a CPU training step on real JPEG data is shorter than one decode (``step_decodes``:
    how many decodes one image's step lasts; ``None`` where it does not apply): then the decoding
    is the work and the step gets one thread."""
    if step_decodes is None:
        return Choice(False, "no JPEG data decoded for a CPU training step")
    if step_decodes < 1.0:
        return Choice(True, f"a training step per image lasts ~{step_decodes:.2f} JPEG decodes")
    return Choice(False, f"a training step per image lasts ~{step_decodes:.2f} JPEG decodes")


def decode_inline(step_decodes: float | None) -> Choice[bool]:
    """Whether real JPEG data is decoded in the infeed's thread instead of by workers: a CPU step
    per image of at least :data:`INLINE_DECODE_RATIO` decodes (``step_decodes``)."""
    if step_decodes is not None and step_decodes >= INLINE_DECODE_RATIO:
        return Choice(True, f"decoding in the input thread: a step lasts ~{step_decodes:.0f} decodes")
    return Choice(False, "workers decode")


def data_workers(
    *,
    use_datasets: bool,
    decode_on_device: bool,
    given: int | None,
    inline: Choice[bool],
    on_cuda: bool,
    facts: MachineFacts,
    training_thread_helps: Callable[[int], bool],
) -> Choice[int]:
    """How many workers decode real data: none without workers (``--nouse_datasets``) or where
    the GPU decodes; ``given`` (``--datasets_num_private_threads``); none where decoding stays
    in the input thread (``inline``); else one per usable core shared by the local replicas,
    less :data:`CUDA_CORES_KEPT` on a CUDA host, less one where the training thread decodes too
    (``training_thread_helps(workers)``: threads decoding for a CPU step)."""
    if not use_datasets:
        return Choice(0, "--nouse_datasets: the training process decodes")
    if decode_on_device:
        return Choice(0, "the GPU decodes (--decode_on_device)")
    if given is not None:
        return Choice(given, "--datasets_num_private_threads")
    if inline.value:
        return Choice(0, inline.reason)
    per_replica = max(1, facts.usable_cores // max(1, facts.local_world_size))
    if per_replica > CUDA_CORES_KEPT and on_cuda:
        return Choice(
            per_replica - CUDA_CORES_KEPT, f"{CUDA_CORES_KEPT} cores kept for the training and infeed threads"
        )
    if per_replica > 1 and training_thread_helps(per_replica - 1):
        return Choice(per_replica - 1, "one per core: the training thread decodes too")
    return Choice(per_replica, "one per usable core")


def worker_kind(given: str, threads_suffice: Choice[bool], workers: int) -> Choice[str]:
    """``thread`` or ``process``: ``given`` unless ``auto``, else :func:`auto_worker_kind`."""
    if given != "auto":
        return Choice(given, f"--data_worker_kind={given}")
    kind = auto_worker_kind(threads_suffice.value, workers)
    return Choice(
        kind.value, threads_suffice.reason if kind.value == "thread" or not threads_suffice.value else kind.reason
    )


def data_format(*, image_model: bool | None, model: str, device_type: str) -> Choice[str]:
    """The data format of a run without ``--data_format``: ``NHWC`` (channels_last) for image
    classifiers on CUDA and, but for :data:`CPU_NCHW_MODELS`, on the CPU; ``NCHW`` (PyTorch's
    default layout) for a caller's own model (``image_model=None``) and models not taking images."""
    if image_model is None:
        return Choice("NCHW", "a caller's own model: PyTorch's default layout")
    if not image_model:
        return Choice("NCHW", f"{model} does not take images")
    if device_type == "cpu" and model in CPU_NCHW_MODELS:
        return Choice("NCHW", f"faster for {model} on the CPU")
    where = "the CPU" if device_type == "cpu" else device_type
    return Choice("NHWC", f"channels_last: faster for convolutions on {where}")


#: ``worker_kind="auto"`` takes threads for at most this many workers: a decoding thread still
#: holds the GIL for ~0.15 ms an image, so beyond a few threads the GIL bounds the rate.
#: Measured: docs/data.md#workers.
AUTO_THREAD_WORKERS_MAX = 4


def image_threads_suffice(*, releases_gil: bool, decode_on_device: bool, pin_memory: bool) -> Choice[bool]:
    """Whether decoding threads build an image source's batches well enough: the CPU decoder
    releases the GIL for a whole decode (``releases_gil``: libjpeg-crop) and the batches feed a
    CPU step (not ``pin_memory`` for a CUDA infeed, not decoded on the device). On a CUDA host
    processes measured faster at every worker count tried (docs/data.md#workers)."""
    if decode_on_device:
        return Choice(False, "the GPU decodes")
    if pin_memory:
        return Choice(False, "the batches feed a CUDA step (processes measured faster there)")
    if not releases_gil:
        return Choice(False, "the decoder holds the GIL")
    return Choice(True, "the decoder releases the GIL for a whole decode")


def auto_worker_kind(threads_suffice: bool, num_workers: int) -> Choice[str]:
    """What ``worker_kind="auto"`` gives: ``"thread"`` when building a batch releases the GIL
    (``threads_suffice``) and there are at most :data:`AUTO_THREAD_WORKERS_MAX` workers, else
    ``"process"``."""
    if not threads_suffice:
        return Choice("process", "building a batch holds the GIL")
    if num_workers > AUTO_THREAD_WORKERS_MAX:
        return Choice("process", f"more than {AUTO_THREAD_WORKERS_MAX} workers would be bound by the GIL")
    return Choice("thread", "the decoder releases the GIL")


#: ``decoder="auto"`` leaves the first decoder of its order (libjpeg-crop) only for one measured at
#: least this much faster per image: a smaller gap is within the measurement's noise, and the
#: fixed order keeps reruns naming the same decoder.
DECODER_MARGIN = 0.05


def image_decoder(candidates: Sequence[str], ms_per_image: Mapping[str, float] | None, examples: int) -> Choice[str]:
    """What ``decoder="auto"`` decodes JPEGs with: of ``candidates`` (the installed decoders whose
    pixels are libjpeg-turbo's fast-DCT pixels bit for bit, in their fixed order), the one measured
    fastest (``ms_per_image``: milliseconds per training crop, timed on ``examples`` of the run's
    own examples), keeping the first unless another is :data:`DECODER_MARGIN` faster. No candidate:
    Pillow (its pixels differ; never chosen over a candidate). One candidate or no timings: the first."""
    if not candidates:
        return Choice("pillow", "auto: neither libjpeg-crop nor simplejpeg works here")
    first = candidates[0]
    if len(candidates) == 1:
        return Choice(first, "auto: the only fast-DCT decoder here")
    if not ms_per_image:
        return Choice(first, "auto: the first of " + ", ".join(candidates) + " (nothing readable to time)")
    timed = ", ".join(f"{name} {ms_per_image[name]:.2f}" for name in candidates)
    reason = f"auto: {timed} ms per image, timed on {examples} of this data's examples"
    fastest = min(candidates, key=lambda name: ms_per_image[name])
    if ms_per_image[fastest] < (1.0 - DECODER_MARGIN) * ms_per_image[first]:
        return Choice(fastest, reason)
    if fastest != first:
        reason += f"; {first} kept, the others within {DECODER_MARGIN:.0%}"
    return Choice(first, reason)


def attention_form(given: str, device_type: str) -> Choice[str]:
    """The attention of the Transformer recipes (``--attention``): ``sdpa`` or ``math`` as given;
    ``auto``: ``sdpa`` on CUDA (its flash and memory-efficient kernels), ``math`` elsewhere. On a
    CPU torch's ``scaled_dot_product_attention`` was never faster than the written-out form
    (fp32: 0.95-1.01x; bf16: 0.62-0.81x, its CPU kernel slower in bf16 and without dropout
    support), and ``math`` trains bitwise as the recipes did before the option.
    Measured: docs/results/transformer.md."""
    if given != "auto":
        return Choice(given, f"--attention={given}")
    if device_type == "cuda":
        return Choice("sdpa", "auto: on CUDA, scaled_dot_product_attention (flash / memory-efficient kernels)")
    return Choice("math", "auto: on the CPU the written-out attention measured as fast in fp32, faster in bf16")


__all__ = [
    "RUN_CONFIG_NAMES",
    "AUTO_THREAD_WORKERS_MAX",
    "CPU_NCHW_MODELS",
    "CUDA_CORES_KEPT",
    "DECODER_MARGIN",
    "DECODE_MS_PER_IMAGE",
    "INLINE_DECODE_RATIO",
    "Choice",
    "MachineFacts",
    "Names",
    "Reason",
    "attention_form",
    "auto_worker_kind",
    "data_format",
    "data_workers",
    "decode_inline",
    "image_decoder",
    "image_threads_suffice",
    "input_bound",
    "intra_threads",
    "spelled",
    "worker_kind",
]
