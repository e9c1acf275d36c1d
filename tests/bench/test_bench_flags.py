"""Every flag of tf_cnn_benchmarks' benchmark_cnn.py is accounted for by ``stoker bench``:
implemented (a ``BenchConfig`` field that the harness reads) or accepted with a ``Note:``;
absl-style booleans; bad values exit 2 naming the flag; the published command lines run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.cli import run_main
from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env, run_process
from stoker.bench.cli import config_from_args
from stoker.bench.config import BenchConfig, FlagError
from stoker.bench.flags import BY_NAME, COMMAND_ONLY, NOTED, all_flags
from stoker.cli import build_parser

SEED_FLAGS = Path(__file__).with_name("data") / "tf_cnn_benchmarks_flags.txt"
# Seed flags implemented under another BenchConfig field.
ALIASES = {"use_fp16": "precision"}
TINY = [
    "bench",
    "--model=trivial",
    "--data_name=cifar10",
    "--batch_size=4",
    "--peak_tflops=1",
    "--device=cpu",
    "--num_warmup_batches=1",
    "--num_batches=2",
]


def seed_flags() -> list[str]:
    return [line.split()[1] for line in SEED_FLAGS.read_text().splitlines() if line and not line.startswith("#")]


def bench_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser("bench")._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["bench"]


def parse(*flags: str) -> BenchConfig:
    return config_from_args(bench_parser().parse_args(list(flags)))


# ---------------------------------------------------------------------------- coverage
def test_every_seed_flag_is_implemented_or_noted() -> None:
    names = seed_flags()
    assert len(names) == 134 and len(set(names)) == 134
    options = {o for a in bench_parser()._actions for o in a.option_strings}
    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    unaccounted = []
    for name in names:
        implemented = ALIASES.get(name, name) in fields
        noted = name in BY_NAME and BY_NAME[name].note is not None
        if f"--{name}" not in options or implemented == noted:  # neither, or both
            unaccounted.append(name)
    assert unaccounted == []
    assert {f.name for f in NOTED} <= set(names)  # the noted table holds nothing of its own


def test_the_parser_holds_exactly_the_declared_flags() -> None:
    declared = all_flags(BenchConfig)
    names = [f.name for f in declared]
    assert len(names) == len(set(names))
    options = {o for a in bench_parser()._actions for o in a.option_strings} - {"-h", "--help"}
    negations = {f"--no{f.name}" for f in declared if f.kind in ("bool", "compile")}
    assert options == {f"--{n}" for n in names} | negations
    # every field but the record of noted flags is a flag; every default is stated or explained
    assert {f.name for f in dataclasses.fields(BenchConfig)} - set(names) == {"noted_flags"}
    assert [f.name for f in declared if f.implemented and f.default is None and not f.default_text] == []
    assert [f.name for f in declared if "|" in f.help + (f.default_text or "") + (f.note or "")] == []


def test_a_new_field_appears_in_the_parser_the_help_and_the_docs_list() -> None:
    """The parser, --help and the docs' list are made from the declarations: a field declared
    with ``option`` is a flag everywhere, with its default and checks."""
    from stoker.bench.cli import add_parser
    from stoker.bench.flags import GROUPS, MORE, markdown_tables
    from stoker.flags import add_flags, option

    @dataclasses.dataclass(kw_only=True)
    class Extended(BenchConfig):
        frobnicate: int = option(3, "frobnicate N times", group=MORE, minimum=1)

    flags = all_flags(Extended)
    assert "| `--frobnicate` | 3 | frobnicate N times |" in markdown_tables(flags)
    parser = argparse.ArgumentParser(prog="x")
    add_flags(parser, flags, style="absl", groups=GROUPS)
    assert "frobnicate N times; default: 3" in " ".join(parser.format_help().split())
    assert vars(parser.parse_args(["--frobnicate=5"]))["frobnicate"] == 5
    assert "frobnicate" not in vars(parser.parse_args([]))  # not given: the dataclass default
    with pytest.raises(FlagError, match=r"--frobnicate must be an integer >= 1; got 0"):
        Extended(frobnicate=0)
    assert add_parser  # the real parser is built the same way (test above)


def test_the_docs_flag_lists_are_the_declarations() -> None:
    """docs/bench-reference.md's flag lists are ``markdown_tables`` of the declarations, between markers;
    regenerate them with ``python docs/_ext/bench_flags.py``."""
    from stoker.bench.flags import markdown_tables

    page = (ROOT / "docs" / "bench-reference.md").read_text()
    begin, end = "<!-- flags:begin (python docs/_ext/bench_flags.py) -->\n", "<!-- flags:end -->"
    assert (
        page[page.index(begin) + len(begin) : page.index(end)].strip()
        == markdown_tables(all_flags(BenchConfig)).strip()
    )


def test_a_usage_error_is_one_line_and_the_hint(capsys: pytest.CaptureFixture[str]) -> None:
    for bad, line in (
        ("--batch_size=x", "stoker bench: error: argument --batch_size: invalid int value: 'x'"),
        (
            "--optimizer=foo",
            "stoker bench: error: --optimizer='foo' is not allowed; allowed values: sgd, momentum, rmsprop, adam",
        ),
        ("--bogus", "stoker: error: unrecognized arguments: --bogus"),
    ):
        code, out, err = run_main(capsys, *TINY, bad)
        assert code == 2 and out == ""
        assert err.splitlines() == [line, "see stoker bench --help"]


def test_noted_flags_are_reported_once_each_in_the_header(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        capsys,
        *TINY,
        "--kmp_blocktime=0",
        "--nomkl",
        "--local_parameter_device=cpu",
        "--variable_consistency=relaxed",
        "--forward_only",
    )
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("Note: --")]
    assert [n.split(" has no effect")[0] for n in notes] == [
        "Note: --local_parameter_device=cpu",
        "Note: --variable_consistency=relaxed",
        "Note: --mkl=false",
        "Note: --kmp_blocktime=0",
    ]  # in the table's order
    assert all(n.endswith(BY_NAME[n.split("=")[0][8:]].note) for n in notes)  # type: ignore[arg-type]
    assert out.index(notes[-1]) < out.index("PyTorch:")  # part of the header, before the run


def test_no_note_when_no_noted_flag_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, *TINY, "--forward_only")
    assert code == 0 and "has no effect here" not in out


@pytest.mark.parametrize(
    ("flags", "value"),
    [
        ((), False),
        (("--distortions",), True),
        (("--nodistortions",), False),
        (("--distortions=false",), False),
        (("--distortions=true",), True),
        (("--nodistortions", "--distortions"), True),
    ],
)
def test_absl_booleans(flags: tuple[str, ...], value: bool) -> None:
    assert parse(*flags).distortions is value


def test_absl_negation_for_core_and_noted_switches() -> None:
    cfg = parse("--noforward_only", "--nouse_fp16", "--noprint_training_accuracy", "--nowinograd_nonfused")
    assert not cfg.forward_only and cfg.precision == "fp32" and not cfg.print_training_accuracy
    assert cfg.noted_flags == (("winograd_nonfused", "false"),)
    assert parse("--noxla").xla is False and parse("--xla_compile").compile_mode == "step"
    assert parse("--xla").compile_mode == "module"


def test_lists_and_values_reach_the_config() -> None:
    cfg = parse(
        "--eval_during_training_at_specified_steps=5,10",
        "--eval_during_training_at_specified_epochs=0.5",
        "--eval_batch_size=3",
        "--resize_method=round_robin",
        "--gradient_repacking=8",
        "--loss_type_to_report=base_loss",
        "--display_perf_ewma=0.1",
    )
    assert cfg.eval_during_training_at_specified_steps == (5, 10)
    assert cfg.eval_during_training_at_specified_epochs == (0.5,)
    assert cfg.benchmark_mode == "training + evaluation"
    assert (cfg.eval_batch_size, cfg.resize_method, cfg.gradient_repacking) == (3, "round_robin", 8)
    assert cfg.loss_type_to_report == "base_loss" and cfg.display_perf_ewma == 0.1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--resize_method=cubic"], ["--resize_method", "bilinear"]),
        (["--loss_type_to_report=l2"], ["--loss_type_to_report", "base_loss"]),
        (["--local_parameter_device=tpu"], ["--local_parameter_device", "cpu"]),
        (["--kmp_blocktime=soon"], ["--kmp_blocktime"]),
        (["--distortions=maybe"], ["--distortions"]),
        (["--display_perf_ewma=2"], ["--display_perf_ewma", "(0, 1]"]),
        (["--summary_verbosity=5"], ["--summary_verbosity", "0, 1, 2, 3"]),
        (["--xla", "--compile=step"], ["--xla", "--compile"]),
        (["--batch_group_size=0"], ["--batch_group_size"]),
        (["--gradient_repacking=-1"], ["--gradient_repacking"]),
        (["--eval_batch_size=-2"], ["--eval_batch_size"]),
        (["--num_eval_epochs=1"], ["--num_eval_epochs", "--eval"]),
        (["--eval_during_training_at_specified_steps=a,b"], ["--eval_during_training_at_specified_steps"]),
        (["--eval_during_training_every_n_epochs=0"], ["--eval_during_training_every_n_epochs"]),
        (
            ["--eval_during_training_every_n_epochs=1", "--forward_only"],
            ["--eval_during_training_every_n_epochs", "--forward_only"],
        ),
        (["--gpu_indices=0,x"], ["--gpu_indices"]),
        (["--gpu_memory_frac_for_testing=1.5"], ["--gpu_memory_frac_for_testing"]),
        (["--gpu_indices=0"], ["--gpu_indices", "CPU"]),
    ],
)
def test_bad_values_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], args: list[str], named: list[str]
) -> None:
    code, _, err = run_main(capsys, *TINY, *args)
    assert code == 2
    for name in named:
        assert name in err, err


def test_implemented_flags_this_run_cannot_use_get_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        capsys, *TINY, "--distortions", "--gradient_repacking=4", "--eval_batch_size=3", "--resize_method=area"
    )
    assert code == 0
    assert [line.split(":")[1] for line in out.splitlines() if line.startswith("Note: --")] == [
        " --distortions has no effect in this run",
        " --resize_method has no effect in this run",
        " --gradient_repacking has no effect in this run",
        " --eval_batch_size has no effect in this run",
    ]


def test_combinations_tf_cnn_benchmarks_ignores_run_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    # The issue's --summary_verbosity=1 alone, and others tf_cnn_benchmarks accepts without effect.
    code, out, _ = run_main(capsys, *TINY, "--summary_verbosity=1", "--fp16_vars", "--benchmark_test_id=t")
    assert code == 0 and "total images/sec" in out
    notes = [line for line in out.splitlines() if line.startswith("Note: --")]
    assert notes == [
        "Note: --fp16_vars has no effect in this run: it applies to fp16 (--use_fp16); the precision is fp32",
        "Note: --summary_verbosity has no effect in this run: summaries are written into --train_dir, which is "
        "not given",
        "Note: --benchmark_test_id has no effect in this run: it is recorded in --benchmark_log_dir's files or "
        "--results_file",
    ]


def test_noted_and_command_only_flags_are_not_fields() -> None:
    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    assert not {f.name for f in NOTED + COMMAND_ONLY} & fields


# ---------------------------------------------------------------------------- behaviour
def test_loss_type_and_ewma_on_the_progress_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_total, out_base = tmp_path / "t.json", tmp_path / "b.json"
    code, _, _ = run_main(capsys, *TINY, "--weight_decay=0.1", f"--results_file={out_total}")
    assert code == 0
    code, out, _ = run_main(
        capsys,
        *TINY,
        "--weight_decay=0.1",
        "--loss_type_to_report=base_loss",
        "--display_perf_ewma=1",
        "--display_every=1",
        f"--results_file={out_base}",
    )
    assert code == 0 and "Step\tImg/sec\tbase_loss" in out.splitlines()
    total, base = json.loads(out_total.read_text()), json.loads(out_base.read_text())
    # Same weights and updates; the reported loss differs by exactly the L2 term (positive).
    assert all(t > b for t, b in zip(total["losses"], base["losses"], strict=True))
    # With weight 1 the moving average is the last step's own speed.
    last = next(line for line in out.splitlines() if line.startswith("2\timages/sec: "))
    assert float(last.split()[2]) == pytest.approx(4 / base["step_times"][-1], abs=0.051)


def test_fp16_vars_keeps_fp16_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    code, out, _ = run_main(capsys, *TINY, "--use_fp16", "--fp16_vars", f"--train_dir={tmp_path}")
    assert code == 0 and "fp16 weights (--fp16_vars)" in out
    weights = load_file(str(next(tmp_path.glob("ckpt-*/model.safetensors"))))
    assert weights and all(str(t.dtype) == "torch.float16" for t in weights.values() if t.is_floating_point())


def test_summaries_mlperf_and_benchmark_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train_dir, logs = tmp_path / "train", tmp_path / "logs"
    code, out, _ = run_main(
        capsys,
        *TINY,
        "--num_batches=4",
        f"--train_dir={train_dir}",
        "--summary_verbosity=3",
        "--save_summaries_steps=2",
        "--ml_perf",
        f"--benchmark_log_dir={logs}",
        "--benchmark_test_id=tiny-1",
    )
    assert code == 0, out
    events = EventAccumulator(str(train_dir / "events"), size_guidance={"histograms": 0, "scalars": 0}).Reload()
    tags = events.Tags()
    assert {"total_loss", "learning_rate", "images_per_sec"} <= set(tags["scalars"])
    assert [e.step for e in events.Scalars("total_loss")] == [2, 4]  # global steps 2..5 (after 1 warm-up): every 2nd
    assert any(t.startswith("weights/") for t in tags["histograms"])
    assert any(t.startswith("gradients/") for t in tags["histograms"])
    mllog = [json.loads(line.split(" ", 1)[1]) for line in (train_dir / "mlperf.log").read_text().splitlines()]
    assert [r["key"] for r in mllog if r["key"] in ("run_start", "run_stop")] == ["run_start", "run_stop"]
    run = json.loads((logs / "benchmark_run.log").read_text())
    assert run["test_id"] == "tiny-1" and run["model_name"] == "trivial"
    metrics = [json.loads(line) for line in (logs / "metric.log").read_text().splitlines()]
    assert metrics[0]["name"] == "average_examples_per_sec" and metrics[0]["global_step"] == 5


def test_eval_during_training_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    # cifar10: 50000 examples / batch 4 = 12500 steps per epoch; 0.000161 epochs = int(2.01) = 2 steps.
    code, out, _ = run_main(
        capsys,
        *TINY,
        "--num_batches=6",
        "--eval_during_training_at_specified_steps=1,5",
        "--eval_during_training_every_n_epochs=0.000161",
        "--eval_batch_size=2",
        "--num_eval_batches=1",
    )
    assert code == 0
    evals = [line for line in out.splitlines() if line.startswith("Running evaluation at global_step")]
    # Timed steps 1 and 5 (listed), 2 and 4 (every 2; 6 is the end: the final evaluation); the
    # warm-up step makes them global steps 2, 3, 5, 6.
    assert evals == [f"Running evaluation at global_step {s}" for s in (2, 3, 5, 6)]
    assert "Accuracy @ 1 = " in out and "[2 examples]" in out  # --eval_batch_size=2, one batch
    assert "Eval batch:  2 global" in out.splitlines()


def _image_folder(root: Path, classes: int = 2, per_class: int = 4, size: int = 40) -> Path:
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.random.default_rng(10 * c + i).integers(0, 256, (size, size + 8 * i, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.png")  # noise: every crop and filter differs
    return root


def test_nodistortions_and_resize_method_reach_the_image_folder(tmp_path: Path) -> None:
    from stoker.bench.model import device_images
    from stoker.bench.plan import build_plan

    data = _image_folder(tmp_path / "data", size=232)  # crop needs at least trivial's 227 x 227
    batches = {}
    runs = {
        "default": ((), True),
        "distortions": (("--distortions",), True),
        "nodistortions": (("--nodistortions",), True),
        "eval": (("--nodistortions",), False),
        "nearest": (("--nodistortions", "--resize_method=nearest"), False),
        "crop": (("--nodistortions", "--resize_method=crop"), False),
    }
    for name, (flags, train) in runs.items():
        cfg = parse(
            "--model=trivial",
            f"--data_dir={data}",
            "--data_name=imagenet",
            "--batch_size=4",
            "--device=cpu",
            "--nouse_datasets",
            *flags,
        )
        source = build_plan(cfg).input_fn(train=train)({"batch_size": 4, "num_replicas": 1, "replica_index": 0})
        batches[name] = next(iter(source))[0]
    # --distortions: uint8 crops plus the colour parameters the step applies.
    assert set(batches["distortions"]) == {"images", "color"} and batches["distortions"]["color"].shape == (4, 5)
    # --nodistortions (the default, as in TF 2's tf_cnn): its training preprocessing, the same random crops
    # without colour.
    assert torch.equal(batches["default"], batches["nodistortions"])
    assert torch.equal(batches["distortions"]["images"], batches["nodistortions"])
    assert batches["nodistortions"].dtype == torch.uint8 and batches["nodistortions"].shape == (4, 227, 227, 3)
    # the evaluation transform is another (deterministic) box; nearest and crop resize differently
    assert not batches["eval"].equal(batches["nodistortions"])
    assert not batches["nearest"].equal(batches["eval"]) and not batches["crop"].equal(batches["eval"])
    # the step makes the float batch, with the colour distortions when they came along
    params = {"channels_last": False}
    plain = device_images(batches["nodistortions"], params)
    distorted = device_images(batches["distortions"], params)
    assert plain.dtype == torch.float32 and plain.shape == (4, 3, 227, 227) and -1 <= plain.min() <= plain.max() <= 1
    assert not torch.equal(plain, distorted)


# ---------------------------------------------------------------------------- published command lines
def _stoker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_process(
        [PYTHON, "-m", "stoker", *args], capture_output=True, text=True, cwd=ROOT, env=python_env(), timeout=timeout
    )


def test_readme_first_command_line(tmp_path: Path) -> None:
    # tf_cnn_benchmarks' README: --num_gpus=1 --batch_size=32 --model=resnet50 --variable_update=parameter_server,
    # scaled to a CPU test: batch 2, two timed steps.
    proc = _stoker(
        "bench",
        "--num_gpus=1",
        "--batch_size=2",
        "--model=resnet50",
        "--variable_update=parameter_server",
        "--num_batches=2",
        "--num_warmup_batches=1",
        "--device=cpu",
        "--peak_tflops=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Note: --variable_update=parameter_server runs as replicated" in proc.stdout
    assert "total images/sec:" in proc.stdout


RECIPE_BUCKET = {
    "resnet50": "all-reduced in 8 DDP buckets of 12.",  # 25.6M fp32 gradients / 8: 12.2 MiB
    "trivial": "all-reduced in 8 DDP buckets of 2.033",
}  # 4.26M fp32 gradients / 8: 2.03 MiB


@pytest.mark.parametrize("model", ["trivial", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_resnet50_recipe_scaled_down(tmp_path: Path, model: str) -> None:
    # README's real-data ResNet-50 recipe with --num_gpus=8 --batch_size=256 --num_epochs=90, scaled to
    # 2 CPU replicas of batch 2 and 2 timed steps on a tiny image folder (resnet50 in fp16 on a CPU
    # takes two minutes: the default run uses the trivial model, every other flag as published).
    data = _image_folder(tmp_path / "imagenet" / "train")
    results = tmp_path / "r.json"
    proc = _stoker(
        "bench",
        "--data_format=NCHW",
        "--batch_size=2",
        f"--model={model}",
        "--optimizer=momentum",
        "--variable_update=replicated",
        "--nodistortions",
        "--gradient_repacking=8",
        "--num_gpus=2",
        "--num_batches=2",
        "--weight_decay=1e-4",
        f"--data_dir={data.parent}",
        "--use_fp16",
        f"--train_dir={tmp_path / 'ckpt'}",
        "--num_warmup_batches=1",
        "--device=cpu",
        "--peak_tflops=1",
        f"--results_file={results}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "Batch size:  4 global" in lines and "Precision:   fp16 (loss scale: 128)" in lines
    gradients = next(line for line in lines if line.startswith("Gradients:"))
    assert RECIPE_BUCKET[model] in gradients
    assert any(line.startswith("Input:") and "distortions off" in line for line in lines)
    assert json.loads(results.read_text())["num_steps"] == 2 and (tmp_path / "ckpt" / "checkpoint.json").exists()


# ---------------------------------------------------------------------------- per-model defaults
def _workload(*flags: str):  # noqa: ANN202 - a Workload
    from stoker.bench.workload import resolve_workload

    return resolve_workload(parse("--device=cpu", *flags))


@pytest.mark.parametrize(
    ("model", "dataset", "batch"),
    [
        ("resnet50", "imagenet", 64),
        ("resnet101", "imagenet", 32),
        ("vgg16", "imagenet", 64),
        ("alexnet", "imagenet", 512),
        ("trivial", "imagenet", 32),
        ("official_resnet50", "imagenet", 128),
        ("resnet20", "cifar10", 128),
        ("densenet40_k12", "cifar10", 64),
        ("alexnet", "cifar10", 128),
    ],
)
def test_batch_size_0_is_the_models_default(model: str, dataset: str, batch: int) -> None:
    w = _workload(f"--model={model}", f"--data_name={dataset}")
    assert w.batch_size == batch and w.defaults_used[0] == f"batch size {batch} per device ({model}'s default)"
    assert _workload(f"--model={model}", f"--data_name={dataset}", "--batch_size=3").batch_size == 3


def test_resnet50_default_schedule() -> None:
    w = _workload("--model=resnet50")
    assert w.default_learning_rate is None and w.model_rate is not None
    rate, peak = w.model_rate, 0.128 * 64 / 256
    per_epoch = 1_281_167 / 64
    warmup = int(per_epoch * 5)
    assert rate(0) == 0.0 and rate(warmup // 2) == pytest.approx(peak * (warmup // 2) / warmup)
    assert rate(warmup) == pytest.approx(peak)
    b30 = int(per_epoch * 30)
    assert rate(b30) == pytest.approx(peak) and rate(b30 + 1) == pytest.approx(peak * 0.1)
    assert rate(int(per_epoch * 90) + 1) == pytest.approx(peak * 1e-4)
    assert "resnet50's learning rate: 0.128 x global batch / 256" in w.defaults_used[1]
    # --resnet_base_lr replaces 0.128 (the rate at batch 256).
    assert _workload("--model=resnet50", "--resnet_base_lr=0.256").model_rate(warmup) == pytest.approx(2 * peak)  # type: ignore[misc]


def test_cifar_schedules_and_constant_rates() -> None:
    w = _workload("--model=resnet20", "--data_name=cifar10")
    per_epoch = int(50_000 / 128)
    assert w.model_rate is not None
    assert [w.model_rate(s) for s in (0, per_epoch * 82, per_epoch * 82 + 1, per_epoch * 300 + 1)] == [
        0.1,
        0.1,
        0.01,
        0.0002,
    ]
    t = _workload("--model=trivial", "--data_name=cifar10")
    assert t.default_learning_rate == 0.005 and t.model_rate is None
    given = _workload("--model=resnet20", "--data_name=cifar10", "--init_learning_rate=0.3")
    assert given.model_rate is None and given.default_learning_rate is None
    assert all("learning rate" not in u for u in given.defaults_used)


def test_the_models_schedule_reaches_the_optimizer() -> None:
    import torch

    from stoker.bench.optim import optimizer_and_schedule

    w = _workload("--model=resnet20", "--data_name=cifar10")
    cfg = parse("--model=resnet20", "--data_name=cifar10", "--device=cpu")
    make_opt, make_sched = optimizer_and_schedule(
        cfg, 50_000 / 128, default_lr=w.default_learning_rate, model_rate=w.model_rate
    )
    assert make_sched is not None
    opt = make_opt({}, [torch.nn.Parameter(torch.zeros(1))])
    sched = make_sched({}, opt)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    opt.step()  # no gradient: nothing moves; the schedule steps after the update, as in training
    sched.last_epoch = 390 * 82  # jump to the first boundary (390 steps of 128 per epoch)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            ["--model=resnet50", "--resnet_base_lr=0.1", "--init_learning_rate=0.1"],
            ["--resnet_base_lr", "--init_learning_rate"],
        ),
        (["--model=trivial", "--resnet_base_lr=0.1"], ["--resnet_base_lr", "trivial"]),
        (["--batch_size=-1"], ["--batch_size", ">= 0"]),
    ],
)
def test_default_flags_refused_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], named: list[str]) -> None:
    code, _, err = run_main(capsys, "bench", "--device=cpu", "--num_batches=1", *args)
    assert code == 2
    for name in named:
        assert name in err, err


def test_header_says_which_defaults_were_used(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        capsys,
        "bench",
        "--model=trivial",
        "--data_name=cifar10",
        "--num_batches=1",
        "--num_warmup_batches=0",
        "--device=cpu",
        "--peak_tflops=1",
    )
    lines = out.splitlines()
    assert code == 0 and "Batch size:  32 global" in lines
    at = lines.index("Defaults:    batch size 32 per device (trivial's default)")
    assert lines[at + 1] == " " * 13 + "trivial's learning rate: 0.005"


def test_eval_epochs_and_input_pipeline_flags(tmp_path: Path) -> None:
    from stoker.bench.plan import build_plan
    from stoker.bench.workload import prefetch_depth

    # cifar10 has 10000 evaluation images: 0.01 epochs at an evaluation batch of 16 is ceil(100 / 16) = 7 batches.
    w = _workload(
        "--model=trivial",
        "--data_name=cifar10",
        "--batch_size=4",
        "--eval_batch_size=16",
        "--num_eval_epochs=0.01",
        "--eval_during_training_every_n_steps=5",
    )
    assert (w.eval_batches, w.eval_batch_size, w.batch_size) == (7, 16, 4)
    assert prefetch_depth(parse()) is None  # the engine's default
    assert prefetch_depth(parse("--datasets_prefetch_buffer_size=3", "--batch_group_size=2")) == 6
    assert prefetch_depth(parse("--nodatasets_use_prefetch")) == 0
    data = _image_folder(tmp_path / "data", size=232)
    cfg = parse(
        "--model=trivial",
        f"--data_dir={data}",
        "--data_name=imagenet",
        "--batch_size=2",
        "--device=cpu",
        "--nouse_datasets",
        "--datasets_repeat_cached_sample",
    )
    batches = iter(build_plan(cfg).input_fn(train=True)({"batch_size": 2, "num_replicas": 1, "replica_index": 0}))
    first, second = next(batches), next(batches)
    assert first[0].equal(second[0]) and first[1].equal(second[1])  # one batch read, repeated


def test_a_compute_bound_cpu_model_decodes_in_the_input_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """resnet50's step lasts many decodes on a CPU: no workers (they cost it ~20 %); trivial's is
    shorter than one: a worker per core (one less where threads decode and the training thread
    helps them). The header's Input line and Resolved lines say so."""
    from types import SimpleNamespace

    import stoker.kernels.peak as peak_module
    from stoker.bench.plan import build_plan
    from stoker.bench.report import header_lines

    monkeypatch.setattr(
        peak_module, "measured_peak", lambda device, precision="fp32", **kw: SimpleNamespace(gflops=100.0)
    )
    data = _image_folder(tmp_path / "data", size=232)
    flags = (f"--data_dir={data}", "--data_name=imagenet", "--batch_size=2")
    heavy = build_plan(parse("--model=resnet50", "--device=cpu", *flags))
    light = build_plan(parse("--model=trivial", "--device=cpu", *flags))
    assert heavy.input is not None and light.input is not None
    inline = heavy.input.decode_inline
    assert inline.value and inline.reason == "decoding in the input thread: a step lasts ~116 decodes"
    assert heavy.input.data_workers.value == 0  # 3 x 7.7 GFLOP at 100 GFLOP/s over 2 ms
    assert not light.input.decode_inline.value
    cores = len(os.sched_getaffinity(0))
    helped = light.input.training_thread_decodes.value
    assert light.input.data_workers.value == (cores - 1 if helped else cores)
    if helped:  # decoding threads, and the training thread decodes too: the header says so
        (line,) = [x for x in header_lines(light, None) if x.startswith("Input")]
        assert f"{cores - 1} decoding thread" in line and "the training thread decodes too" in line
    given = build_plan(parse("--model=resnet50", "--device=cpu", "--datasets_num_private_threads=2", *flags))
    assert given.input is not None and given.input.data_workers.value == 2
    lines = header_lines(heavy, None)
    (line,) = [x for x in lines if x.startswith("Input")]
    assert re.search(r"0 decoding (threads|processes) ", line)
    assert "decoding in the input thread: a step lasts ~116 decodes" in line
    assert " " * 13 + "data workers: 0 (decoding in the input thread: a step lasts ~116 decodes)" in lines


def test_an_input_bound_cpu_model_trains_on_one_thread_and_leaves_the_cores_to_the_decoders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trivial's step per image is a small fraction of a decode: `stoker bench` gives it one
    intra-op thread (two spin between kernels on the decoders' cores) and says so; not for a
    compute-bound model, synthetic data, an evaluation, or a given --num_intra_threads."""
    from types import SimpleNamespace

    import stoker.bench.plan as plan_module
    import stoker.kernels.peak as peak_module
    from stoker.bench.cli import _set_threads
    from stoker.bench.plan import build_plan

    monkeypatch.setattr(
        peak_module, "measured_peak", lambda device, precision="fp32", **kw: SimpleNamespace(gflops=100.0)
    )
    monkeypatch.setattr(plan_module, "busy_cores", lambda: 0.0)
    data = _image_folder(tmp_path / "data", size=232)
    flags = (f"--data_dir={data}", "--data_name=imagenet", "--batch_size=2", "--device=cpu")
    light = build_plan(parse("--model=trivial", *flags), sample_busy=True)
    assert light.threads.value == 1 and light.threads.reason == "a training step per image lasts ~0.13 JPEG decodes"

    def bound(*given: str) -> bool:
        return build_plan(parse(*given)).threads.reason.startswith("a training step per image lasts ~0.13")

    assert not bound("--model=resnet50", *flags)
    assert not bound("--model=trivial", "--device=cpu")  # synthetic
    assert not bound("--model=trivial", "--forward_only", *flags)
    before = torch.get_num_threads()
    lines: list[str] = []
    try:
        _set_threads(light, bench_parser(), lines.append)
        assert torch.get_num_threads() == 1
        assert lines == [
            "Note: the input is the work here (a training step per image lasts ~0.13 JPEG decodes): using 1 "
            "intra-op thread and leaving the cores to the decoders (--num_intra_threads overrides)"
        ]
        lines.clear()
        _set_threads(
            build_plan(parse("--model=trivial", "--num_intra_threads=2", *flags)), bench_parser(), lines.append
        )
        assert torch.get_num_threads() == 2 and lines == []
    finally:
        torch.set_num_threads(before)


def test_xla_flags_choose_the_engines_compile_mode() -> None:
    from stoker.bench.plan import build_plan
    from stoker.bench.train import build_estimator

    for flags, mode in ((("--xla",), "module"), (("--xla_compile",), "step"), ((), False)):
        cfg = parse("--model=trivial", "--data_name=cifar10", "--batch_size=2", "--device=cpu", *flags)
        assert build_estimator(build_plan(cfg)).config.compile == mode


def test_data_worker_kind_takes_threads_only_for_a_cpu_step_with_libjpeg_crop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stoker.bench.plan as plan_module
    from stoker.bench.plan import build_plan
    from stoker.data.images.decoders import available_decoders
    from stoker.resolve import Choice

    data = _image_folder(tmp_path / "data", size=232)

    def kind(*flags: str, workers: int) -> str:
        cfg = parse("--model=trivial", f"--data_dir={data}", f"--datasets_num_private_threads={workers}", *flags)
        plan = build_plan(cfg)
        assert plan.input is not None
        return plan.input.worker_kind.value

    crop = "libjpeg-crop" in available_decoders()
    if crop:
        assert kind("--device=cpu", "--image_decoder=libjpeg-crop", workers=2) == "thread"
        assert kind("--device=cpu", "--image_decoder=libjpeg-crop", workers=5) == "process"
    assert kind("--device=cpu", "--image_decoder=pillow", workers=2) == "process"
    # on CUDA decoding threads measured slower than processes at every count (H200 host)
    monkeypatch.setattr(plan_module, "replica_device", lambda cfg: Choice(torch.device("cuda", 0), "made up"))
    if crop:
        assert kind("--device=cuda", "--image_decoder=libjpeg-crop", workers=2) == "process"
    assert kind("--device=cuda", "--data_worker_kind=thread", workers=8) == "thread"
