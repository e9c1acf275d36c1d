"""``stoker.resolve``: each "auto" rule from made-up machine facts to a ``Choice`` (its value and
reason); the rules' users (the bench plan, the image sources) are tested beside them."""

from __future__ import annotations

from typing import Any

from helpers.machine import facts
from stoker import resolve as rules
from stoker.resolve import DECODER_MARGIN, Choice, image_decoder


def test_threads_given_input_bound_shared_busy_or_default() -> None:
    idle = Choice(False, "no JPEG data decoded for a CPU training step")
    bound = rules.input_bound(0.13)
    assert bound == Choice(True, "a training step per image lasts ~0.13 JPEG decodes")
    assert rules.intra_threads(given=3, input_bound=bound, facts=facts(8)) == Choice(3, "--num_intra_threads")
    one = rules.intra_threads(given=None, input_bound=bound, facts=facts(8))
    assert (one.value, one.reason) == (1, "a training step per image lasts ~0.13 JPEG decodes")
    assert one.note.startswith("Note: the input is the work here (a training step per image lasts ~0.13 JPEG")
    shared = rules.intra_threads(given=None, input_bound=idle, facts=facts(16, local=4))
    assert shared == Choice(4, "4 local replicas share 16 cores")
    busy = rules.intra_threads(given=None, input_bound=idle, facts=facts(8, busy=2.6))
    assert (busy.value, busy.reason) == (5, "2.6 of 8 cores were busy before the run")
    assert busy.note == (
        "Note: 2.6 of 8 cores were busy before the run: using 5 intra-op thread(s) instead of 8 "
        "(--num_intra_threads overrides)"
    )
    assert rules.intra_threads(given=None, input_bound=idle, facts=facts(8, busy=0.2)) == Choice(
        8, "torch's default: the cores were idle before the run"
    )
    assert rules.intra_threads(given=None, input_bound=idle, facts=facts(8, busy=None)).value == 8
    assert not rules.input_bound(1.5).value and not rules.input_bound(None).value


def test_workers_and_their_kind() -> None:
    never: Any = lambda n: False  # noqa: E731 - the training thread never decodes
    inline = rules.decode_inline(116.0)
    assert inline == Choice(True, "decoding in the input thread: a step lasts ~116 decodes")
    assert not rules.decode_inline(19.9).value and not rules.decode_inline(None).value
    kw: dict[str, Any] = {"use_datasets": True, "decode_on_device": False, "given": None, "on_cuda": False}
    workers = rules.data_workers(inline=inline, facts=facts(16), training_thread_helps=never, **kw)
    assert workers == Choice(0, inline.reason)
    no = rules.decode_inline(None)
    assert rules.data_workers(inline=no, facts=facts(16), training_thread_helps=never, **kw).value == 16
    cuda = {**kw, "on_cuda": True}
    assert rules.data_workers(inline=no, facts=facts(16), training_thread_helps=never, **cuda) == Choice(
        14, "2 cores kept for the training and infeed threads"
    )
    assert rules.data_workers(inline=no, facts=facts(16, local=8), training_thread_helps=never, **cuda).value == 2
    helped = rules.data_workers(inline=no, facts=facts(2), training_thread_helps=lambda n: True, **kw)
    assert helped == Choice(1, "one per core: the training thread decodes too")
    given = {**kw, "given": 3}
    assert rules.data_workers(inline=inline, facts=facts(), training_thread_helps=never, **given).value == 3
    off = {**kw, "use_datasets": False}
    assert rules.data_workers(inline=no, facts=facts(), training_thread_helps=never, **off).value == 0
    gil = rules.image_threads_suffice(releases_gil=True, decode_on_device=False, pin_memory=False)
    assert rules.worker_kind("auto", gil, 4) == Choice("thread", "the decoder releases the GIL for a whole decode")
    assert rules.worker_kind("auto", gil, 5).value == "process"
    pinned = rules.image_threads_suffice(releases_gil=True, decode_on_device=False, pin_memory=True)
    assert rules.worker_kind("auto", pinned, 2) == Choice(
        "process", "the batches feed a CUDA step (processes measured faster there)"
    )
    assert rules.worker_kind("thread", pinned, 8) == Choice("thread", "--data_worker_kind=thread")


def test_data_format() -> None:
    assert rules.data_format(image_model=True, model="resnet50", device_type="cpu") == Choice(
        "NHWC", "channels_last: faster for convolutions on the CPU"
    )
    assert rules.data_format(image_model=True, model="vgg16", device_type="cpu").value == "NCHW"
    assert rules.data_format(image_model=True, model="vgg16", device_type="cuda").value == "NHWC"
    assert rules.data_format(image_model=False, model="ncf", device_type="cpu") == Choice(
        "NCHW", "ncf does not take images"
    )
    assert rules.data_format(image_model=None, model="", device_type="cpu").value == "NCHW"


# ------------------------------------------------------------------------------ the image decoder
def test_the_rule_keeps_the_first_unless_another_is_clearly_faster() -> None:
    names = ["libjpeg-crop", "simplejpeg"]
    faster = image_decoder(names, {"libjpeg-crop": 2.0, "simplejpeg": 1.0}, 16)
    assert faster == Choice(
        "simplejpeg", "auto: libjpeg-crop 2.00, simplejpeg 1.00 ms per image, timed on 16 of this data's examples"
    )
    near = image_decoder(names, {"libjpeg-crop": 1.0, "simplejpeg": 1.0 - DECODER_MARGIN / 2}, 16)
    assert near.value == "libjpeg-crop" and near.reason.endswith("libjpeg-crop kept, the others within 5%")
    slower = image_decoder(names, {"libjpeg-crop": 1.0, "simplejpeg": 1.5}, 16)
    assert slower.value == "libjpeg-crop" and "kept" not in slower.reason


def test_the_rule_without_a_choice_to_make() -> None:
    assert image_decoder([], None, 0) == Choice("pillow", "auto: neither libjpeg-crop nor simplejpeg works here")
    assert image_decoder(["simplejpeg"], None, 0) == Choice("simplejpeg", "auto: the only fast-DCT decoder here")
    assert image_decoder(["libjpeg-crop", "simplejpeg"], {}, 0).reason.endswith("(nothing readable to time)")


def test_a_reason_reads_as_run_config_s_fields_and_is_said_in_a_front_end_s_names() -> None:
    import pickle

    from stoker.errors import ConfigError
    from stoker.resolve import Names, Reason, spelled

    class Flags(Names):
        def field(self, name: str) -> str:
            return f"--{name}"

        def value(self, value: object) -> str:
            return str(value).lower()

    reason = Reason(lambda n: f"{n('cuda_graph', True)} needs {n('device')}")
    assert reason == "RunConfig.cuda_graph=True needs RunConfig.device" and isinstance(reason, str)
    assert reason.spelled(Flags()) == spelled(reason, Flags()) == "--cuda_graph=true needs --device"
    assert spelled(ConfigError(reason), Flags()) == "--cuda_graph=true needs --device"
    assert spelled("plain text", Flags()) == "plain text" and spelled(ValueError("x"), Flags()) == "x"
    assert type(pickle.loads(pickle.dumps(reason))) is str  # crosses processes as its text
