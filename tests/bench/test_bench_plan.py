"""The resolved plan of a `stoker bench` run: each "auto" choice and its reason, on made-up
machine facts (nothing here depends on this machine's cores, load or decoders)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import stoker.bench.plan as plan_module
from helpers.machine import facts
from stoker.bench.config import BenchConfig
from stoker.bench.plan import resolve_plan
from stoker.resolve import Choice

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def real(dataset: str = "imagenet", device: torch.device = CPU) -> Any:
    """A workload of real data (the plan reads these four attributes)."""
    return SimpleNamespace(synthetic=False, dataset=dataset, num_classes=2, device=device)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str, int | None, str], float | None]:
    """How many decodes a model's step lasts, injected instead of measured: trivial 0.13, resnet50 116."""
    table: dict[tuple[str, str, int | None, str], float | None] = {}
    for classes in (2, None):
        table[("trivial", "imagenet", classes, "fp32")] = 0.13
        table[("resnet50", "imagenet", classes, "fp32")] = 116.0
    monkeypatch.setattr(plan_module, "_decodes_per_step", table)
    return table


def cfg(**kw: Any) -> BenchConfig:
    return BenchConfig(**{"device": "cpu", "image_decoder": "pillow", **kw})


# ------------------------------------------------------------------------------ the plan
def test_the_plan_of_trivial_on_jpegs_with_two_idle_cores(decodes: dict[Any, Any]) -> None:
    plan = resolve_plan(cfg(model="trivial", data_dir="x", data_worker_kind="thread"), real(), facts(2))
    assert plan.lines() == [
        "threads: 1 (a training step per image lasts ~0.13 JPEG decodes)",
        "data workers: 1 (one per core: the training thread decodes too)",
        "worker kind: thread (--data_worker_kind=thread)",
        "decoder: pillow (--image_decoder=pillow)",
        "training thread decodes: yes (threads decode for a CPU step)",
        "decode inline: no (workers decode)",
        "fast linear: auto (per layer shape, oneDNN or the BLAS, whichever measured faster here; cached)",
        "sgd in backward: auto (in the fast linear layers that allow it, chosen at the first step)",
        "peak: measured (the fastest of three kernels in the compute dtype, measured once per machine)",
        "cuda graph: no (CUDA only)",
    ]


def test_the_plan_of_resnet50_on_a_16_core_machine(decodes: dict[Any, Any]) -> None:
    plan = resolve_plan(
        cfg(model="resnet50", data_dir="x", optimizer="momentum", peak_tflops=2.5), real(), facts(16, busy=4.2)
    )
    assert plan.threads == Choice(
        12, "4.2 of 16 cores were busy before the run", plan.threads.note
    ) and plan.threads.note.startswith("Note: 4.2 of 16 cores")
    assert plan.data_workers == Choice(0, "decoding in the input thread: a step lasts ~116 decodes")
    assert plan.decode_inline.value and not plan.training_thread_decodes.value
    assert plan.worker_kind == Choice("process", "the decoder holds the GIL")  # Pillow
    assert plan.sgd_in_backward == Choice("off", "it needs --optimizer=sgd (plain SGD; got momentum)")
    assert plan.peak == Choice("2.5 TFLOP/s", "--peak_tflops")


def test_the_plan_on_a_cuda_host_and_on_synthetic_data(decodes: dict[Any, Any]) -> None:
    gpu = cfg(model="trivial", data_dir="x", device="cuda", cuda_graph=True)
    plan = resolve_plan(gpu, real(device=CUDA), facts(16))
    assert plan.data_workers.value == 14 and plan.worker_kind.value == "process"
    assert plan.fast_linear == Choice("off", "CPU only") and plan.sgd_in_backward.value == "off"
    assert plan.cuda_graph == Choice(True, "--cuda_graph")
    assert plan.threads.value == 16  # no JPEG data decoded for a CPU step: the idle cores
    plain = resolve_plan(cfg(model="trivial", data_dir="x", device="cuda"), real(device=CUDA), facts(16))
    assert plain.cuda_graph == Choice(False, "not asked: --cuda_graph would capture this step")
    whole = resolve_plan(cfg(model="trivial", data_dir="x", device="cuda", compile="step"), real(device=CUDA), facts())
    assert whole.cuda_graph.reason.startswith("not asked, and it could not capture this step: --compile=step")
    synthetic = SimpleNamespace(synthetic=True, dataset="imagenet", num_classes=None, device=CPU)
    lines = resolve_plan(cfg(model="trivial", num_intra_threads=2), synthetic, facts(2)).lines()
    assert lines[:2] == ["threads: 2 (--num_intra_threads)", "input: none (synthetic data: nothing to decode)"]
    assert len(lines) == 6  # the input's five choices as one line


# ------------------------------------------------------------------------------ --image_decoder=auto
def test_auto_decoder_is_measured_once_on_the_data_and_named_to_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: dict[Any, Any]
) -> None:
    import stoker.data.images.auto_decoder as auto
    from helpers.images import make_image_tree
    from stoker.bench.workload import make_input_fn

    if len(auto.candidates()) < 2:
        pytest.skip("needs both libjpeg-crop and simplejpeg")
    timings: list[int] = []

    def timed(names: list[str], samples: list[Any], size: int) -> tuple[dict[str, float], int]:
        timings.append(len(samples))
        return {"libjpeg-crop": 2.0, "simplejpeg": 1.0}, len(samples)

    monkeypatch.setattr(auto, "time_decoders_one_thread", timed)
    monkeypatch.setattr(auto, "_chosen", {})
    plan_module._measured_decoder.cache_clear()
    root = make_image_tree(tmp_path / "jpegs", classes=2, per_class=10, size=40)
    workload = SimpleNamespace(
        synthetic=False,
        dataset="imagenet",
        num_classes=2,
        device=CPU,
        data_layout="image folder",
        image_size=32,
        model_info=None,
    )
    run = cfg(model="trivial", data_dir=str(root), image_decoder="auto", data_worker_kind="auto")
    plan = resolve_plan(run, workload, facts(2))
    assert plan.decoder == Choice(
        "simplejpeg", "auto: libjpeg-crop 2.00, simplejpeg 1.00 ms per image, timed on 16 of this data's examples"
    )
    # simplejpeg holds the GIL: processes, as for --image_decoder=simplejpeg
    assert (
        plan.worker_kind
        == resolve_plan(
            cfg(model="trivial", data_dir=str(root), image_decoder="simplejpeg"), workload, facts(2)
        ).worker_kind
    )
    assert plan.worker_kind.value == "process" and resolve_plan(run, workload, facts(2)) == plan
    assert timings == [16], "the header's plan and the sources' share one measurement"
    options = make_input_fn(run, workload, train=True).options  # type: ignore[union-attr]
    assert options.decoder == "simplejpeg" and timings == [16]
    source = make_input_fn(run, workload, train=True)({"batch_size": 4, "num_replicas": 1, "replica_index": 0})
    assert source.decoder_choice == Choice("simplejpeg", "decoder=simplejpeg") and timings == [16]  # type: ignore[attr-defined]
