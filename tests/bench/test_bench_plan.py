"""The plan of a `stoker bench` run: worked out once, each "auto" with its reason, on made-up
machine facts (nothing here depends on this machine's cores, load or decoders); the engine's
choices come from the Estimator's record, in the flags' words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import stoker.bench.plan as plan_module
from helpers.images import make_image_tree
from helpers.machine import facts
from stoker.bench.config import BenchConfig
from stoker.bench.plan import BenchPlan, build_plan
from stoker.bench.train import build_estimator
from stoker.resolve import Choice


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """How many decodes a model's step lasts on a CPU, injected instead of measured: trivial 0.13, resnet50 116."""
    table = {"trivial": 0.13, "resnet50": 116.0}

    def step_in_decodes(cfg: BenchConfig, workload: Any) -> float | None:
        return table.get(cfg.model) if workload.device.type == "cpu" else None

    monkeypatch.setattr(plan_module, "step_in_decodes", step_in_decodes)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_image_tree(tmp_path_factory.mktemp("plan") / "jpegs", classes=2, per_class=10, size=40))


def cfg(**kw: Any) -> BenchConfig:
    return BenchConfig(**{"device": "cpu", "image_decoder": "pillow", **kw})


def lines(plan: BenchPlan) -> list[str]:
    return plan.resolved_lines(build_estimator(plan).choices)


# ------------------------------------------------------------------------------ the plan
def test_the_plan_of_trivial_on_jpegs_with_two_idle_cores(decodes: None, jpegs: str) -> None:
    plan = build_plan(cfg(model="trivial", data_dir=jpegs, data_worker_kind="thread"), facts=facts(2))
    assert lines(plan) == [
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
    assert plan.run_config.device == "cpu" and plan.cfg.data_format == "NHWC"  # left out: the model's default


def test_the_plan_of_resnet50_on_a_16_core_machine(decodes: None, jpegs: str) -> None:
    run = cfg(model="resnet50", data_dir=jpegs, optimizer="momentum", peak_tflops=2.5, fast_linear="off")
    plan = build_plan(run, facts=facts(16, busy=4.2))
    assert plan.threads == Choice(12, "4.2 of 16 cores were busy before the run", plan.threads.note)
    assert plan.threads.note.startswith("Note: 4.2 of 16 cores")
    assert plan.input is not None
    assert plan.input.data_workers == Choice(0, "decoding in the input thread: a step lasts ~116 decodes")
    assert plan.input.decode_inline.value and not plan.input.training_thread_decodes.value
    assert plan.input.worker_kind == Choice("process", "the decoder holds the GIL")  # Pillow
    assert plan.peak == Choice("2.5 TFLOP/s", "--peak_tflops")
    # the engine's record, said in flags: what the settings need (the optimizer is asked at the first step)
    assert "sgd in backward: off (it needs --fast_linear=auto or on (the update runs in those layers))" in lines(plan)


def test_the_plan_on_a_cuda_host_and_on_synthetic_data(
    decodes: None, jpegs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = Choice(torch.device("cuda", 0), "made up")
    monkeypatch.setattr(plan_module, "replica_device", lambda cfg: cuda)  # the plan's one call of the device rule
    plan = build_plan(cfg(model="trivial", data_dir=jpegs, device="cuda"), facts=facts(16))
    assert plan.input is not None
    assert plan.input.data_workers.value == 14 and plan.input.worker_kind.value == "process"
    assert plan.threads.value == 16  # no JPEG data decoded for a CPU step: the idle cores
    assert plan.run_config.device == "cuda" and plan.workload.device == cuda.value
    synthetic = build_plan(cfg(model="trivial", num_intra_threads=2), facts=facts(2))
    assert synthetic.input is None
    assert synthetic.resolved_lines(None) == [
        "threads: 2 (--num_intra_threads)",
        "input: none (synthetic data: nothing to decode)",  # the input's five choices as one line
        "peak: measured (the fastest of three kernels in the compute dtype, measured once per machine)",
    ]


def test_the_flags_become_one_run_config_and_the_engine_s_refusals_name_flags() -> None:
    from stoker.errors import FlagError

    plan = build_plan(cfg(model="trivial", data_name="cifar10", train_dir="/tmp/x", tf_random_seed=7), facts=facts())
    config = plan.run_config
    assert (config.model_dir, config.seed, config.device, config.strategy) == ("/tmp/x", 7, "cpu", "replicated")
    with pytest.raises(FlagError) as e:  # RunConfig's own rule, in the flags' words
        build_plan(cfg(model="trivial", data_name="cifar10", cuda_graph=True), facts=facts())
    assert str(e.value) == "--cuda_graph needs a CUDA device; --device=cpu (use --device=cuda or drop --cuda_graph)"
    assert e.value.flags == ("cuda_graph", "device")


# ------------------------------------------------------------------------------ --image_decoder=auto
def test_auto_decoder_is_measured_once_on_the_data_and_named_to_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: None
) -> None:
    import stoker.data.images.auto_decoder as auto

    if len(auto.candidates()) < 2:
        pytest.skip("needs both libjpeg-crop and simplejpeg")
    timings: list[int] = []

    def timed(names: list[str], samples: list[Any], size: int) -> tuple[dict[str, float], int]:
        timings.append(len(samples))
        return {"libjpeg-crop": 2.0, "simplejpeg": 1.0}, len(samples)

    monkeypatch.setattr(auto, "time_decoders_one_thread", timed)
    monkeypatch.setattr(auto, "_chosen", {})
    root = make_image_tree(tmp_path / "jpegs", classes=2, per_class=10, size=40)
    run = cfg(model="trivial", data_dir=str(root), image_decoder="auto", data_worker_kind="auto")
    plan = build_plan(run, facts=facts(2))
    assert plan.input is not None
    assert plan.input.decoder == Choice(
        "simplejpeg", "auto: libjpeg-crop 2.00, simplejpeg 1.00 ms per image, timed on 16 of this data's examples"
    )
    # simplejpeg holds the GIL: processes, as for --image_decoder=simplejpeg
    named = build_plan(cfg(model="trivial", data_dir=str(root), image_decoder="simplejpeg"), facts=facts(2))
    assert named.input is not None and plan.input.worker_kind == named.input.worker_kind
    assert plan.input.worker_kind.value == "process"
    assert timings == [16], "one measurement for the plan"
    assert plan.input_fn(train=True).options.decoder == "simplejpeg"  # type: ignore[attr-defined]
    source = plan.input_fn(train=True)({"batch_size": 4, "num_replicas": 1, "replica_index": 0})
    assert source.decoder_choice == Choice("simplejpeg", "decoder=simplejpeg") and timings == [16]  # type: ignore[attr-defined]
