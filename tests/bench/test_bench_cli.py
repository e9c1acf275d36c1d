"""``stoker bench`` end to end: flags, output format, checkpoints, eval, results files,
inference latency and the model list."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_main
from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env, run_process
from stoker.bench import BenchConfig, run_benchmark
from stoker.models import DATASETS, list_models
from stoker.run_spec import estimator_from_model_dir

STEP_RE = re.compile(r"(\d+)\timages/sec: ([\d.]+) \+/- ([\d.]+) \(jitter = ([\d.]+)\)\t([\d.]+)")
TOTAL_RE = re.compile(r"total images/sec: ([\d.]+)")
LATENCY_RE = re.compile(
    r"Latencies - avg: +([\d.]+), 99th percentile: +([\d.]+), 99.9th percentile: +([\d.]+), max: +([\d.]+)"
)
# Small and quick: a 52k-parameter model on 32x32 synthetic images, no peak measurement.
QUICK = ["bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--peak_tflops=1", "--device=cpu"]


def stoker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_process(
        [PYTHON, "-m", "stoker", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**python_env(), **(env or {})},
        timeout=120,
    )


def test_training_output_format_and_results_file(tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    trace = tmp_path / "trace.json"
    proc = stoker(
        *QUICK,
        "--num_batches=12",
        "--num_warmup_batches=2",
        "--display_every=5",
        "--data_format=NHWC",
        f"--results_file={results}",
        f"--trace_file={trace}",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for expected in (
        "Model:       trivial",
        "Dataset:     cifar10 (synthetic)",
        "Mode:        training",
        "Batch size:  8 global",
        "             8 per device",
        "Num batches: 12",
        "Data format: NHWC",
        "Optimizer:   sgd",
        "Variables:   replicated",
        "Host memory: kept for reuse (glibc: no mmap, no trim)",
        "==========",
        "Running warm up",
        "Done warm up",
        "Step\tImg/sec\ttotal_loss",
    ):
        assert expected in lines, (expected, proc.stdout)
    steps = [STEP_RE.fullmatch(line) for line in lines if STEP_RE.fullmatch(line)]
    assert [int(m.group(1)) for m in steps] == [1, 5, 10]  # step 1, then every --display_every
    assert all(float(m.group(2)) > 0 for m in steps)
    total_at = next(i for i, line in enumerate(lines) if TOTAL_RE.fullmatch(line))
    assert lines[total_at - 1] == lines[total_at + 1] == "-" * 64
    assert any(line.startswith("MFU: ") for line in lines)
    row = next(csv.DictReader(results.open()))
    assert row["model"] == "trivial" and int(row["num_steps"]) == 12 and int(row["global_step"]) == 14
    assert float(row["images_per_sec"]) == pytest.approx(float(TOTAL_RE.fullmatch(lines[total_at]).group(1)), abs=0.01)  # type: ignore[union-attr]
    assert float(row["peak_gflops"]) == 1000.0 and row["host_memory_kept"] == "True"
    assert f"Dumping trace to {trace}" in lines and json.loads(trace.read_text())["traceEvents"]


def test_keep_host_memory_false_leaves_the_c_library_alone() -> None:
    proc = stoker(*QUICK, "--num_batches=2", "--num_warmup_batches=1", "--keep_host_memory=false")
    assert proc.returncode == 0, proc.stderr
    assert "Host memory: C library defaults" in proc.stdout.splitlines()


def test_mobilenet_is_v1_with_a_note_for_tf_cnn_users(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        capsys,
        "bench",
        "--model=mobilenet",
        "--batch_size=2",
        "--num_batches=1",
        "--num_warmup_batches=0",
        "--peak_tflops=1",
        "--device=cpu",
        "--forward_only",
    )
    assert code == 0
    assert "tf_cnn_benchmarks' mobilenet (MobileNet v2 with two logits layers) is --model=mobilenet_v2_tf_cnn" in out


def test_device_loops_give_per_loop_lines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(
        capsys, *QUICK, "--num_batches=20", "--num_warmup_batches=0", "--display_every=5", "--iterations_per_loop=4"
    )
    assert code == 0, err
    assert "Loop:        4 step(s) per host round trip" in out
    # a line at the first loop boundary at or past step 1 and each multiple of 5
    assert [int(m.group(1)) for m in STEP_RE.finditer(out)] == [4, 8, 12, 16, 20]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--forward_only", "--eval", "--train_dir=x"], ["--forward_only", "--eval"]),
        (["--use_fp16", "--precision=bf16"], ["--use_fp16", "--precision=bf16"]),
        (
            ["--optimizer=adagrad"],
            ["--optimizer='adagrad' is not allowed; allowed values: sgd, momentum, rmsprop, adam"],
        ),
    ],
)
def test_contradictory_and_bad_flags_exit_2_via_subprocess(args: list[str], named: list[str]) -> None:
    proc = stoker(*QUICK, *args)
    assert proc.returncode == 2
    for name in named:
        assert name in proc.stderr, proc.stderr


def test_multi_process_is_for_training_only() -> None:
    proc = stoker(*QUICK, "--forward_only", env={"WORLD_SIZE": "2", "RANK": "0"})
    assert proc.returncode == 2 and "WORLD_SIZE=2" in proc.stderr and "only training" in proc.stderr


@pytest.mark.slow
def test_two_processes_report_the_global_batch(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc = run_process(
        [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "stoker",
            *QUICK,
            "--num_batches=4",
            "--num_warmup_batches=1",
            "--display_every=2",
            f"--results_file={results}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=python_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Batch size:  16 global" in proc.stdout and "             8 per device" in proc.stdout
    assert proc.stdout.count("total images/sec") == 1  # only the chief reports
    result = json.loads(results.read_text())
    assert result["batch_size"] == 16 and result["num_steps"] == 4 and result["variable_update"] == "replicated"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--variable_update=horovod"], ["--variable_update", "independent, replicated, sharded, parameter_server"]),
        (["--data_format=NCWH"], ["--data_format", "NCHW", "NHWC"]),
        (["--model=resnet50"], ["--model", "resnet20"]),  # resnet50 is an ImageNet model
        (["--num_warmup_batches=-1"], ["--num_warmup_batches"]),
        (["--fp16_loss_scale=64"], ["--fp16_loss_scale", "fp16"]),
        (["--num_batches=3", "--num_epochs=1"], ["--num_batches", "--num_epochs"]),
        (["--mode=inference", "--exported=exp", "--compile"], ["--compile", "--exported"]),
        (["--exported=exp"], ["--exported", "--mode=inference"]),
        (["--compile=graph"], ["--compile", "module", "step"]),
        (["--device=cpu", "--cuda_graph"], ["--cuda_graph", "--device=cpu"]),
        (["--mode=inference", "--eval_during_training_every_n_steps=2"], ["--eval_during_training_every_n_steps"]),
        (["--num_inference_threads=2"], ["--num_inference_threads", "--mode=inference"]),
        (["--save_model_steps=5"], ["--save_model_steps", "--train_dir"]),
        (["--device=tpu"], ["--device", "cpu"]),
        (["--nonsense=1"], ["unrecognized arguments: --nonsense=1"]),
        (["--mod=inference"], ["unrecognized arguments: --mod=inference"]),  # no prefix matching
    ],
)
def test_bad_flags_exit_2_naming_them(capsys: pytest.CaptureFixture[str], args: list[str], named: list[str]) -> None:
    code, _, err = run_main(capsys, *QUICK, *args)
    assert code == 2
    for name in named:
        assert name in err, err


def test_version_help_and_info_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(capsys, "--version")[1].startswith("stoker ")
    code, out, _ = run_main(capsys, "bench", "--help")
    assert code == 0 and "--num_warmup_batches" in out and "--variable_update" in out
    code, out, _ = run_main(capsys, "info")
    assert code == 0 and "torch" in out


@pytest.mark.parametrize("argv", [["bench"], ["train", "charlm"], ["train", "bert"]])
def test_help_states_each_default_once(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run_main(capsys, *argv, "--help")
    text = " ".join(out.split())
    assert code == 0 and "(default: None)" not in text and "==SUPPRESS==" not in text
    assert "default: (default" not in text and "(default: all of the held-out data) (default" not in text
    if argv == ["bench"]:  # one line of usage, and the defaults the issue named explained
        assert out.splitlines()[0] == "usage: stoker bench [--flag=value ...]"
        assert "batch size per device; default: 0: the model's default batch size" in text
        assert "initial learning rate; default: the model's rate or schedule" in text
        assert "TFRecord shards" in text and "cannot" not in text.split("--data_dir")[1][:300]
        assert "fastest of three kernels" in text and "2048" not in text


@pytest.mark.slow  # default run under 5 minutes on 2 cores; the fast tests of this area cover the same code
def test_list_models_prints_every_model_with_params_and_gflops(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "bench", "--list_models", "--data_name=cifar10")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert sorted(rows) == list_models("cifar10")
    assert rows["resnet20"][1:5] == ["cifar10", "32x32", "269,722", "0.0811"]


@pytest.mark.slow
def test_list_models_of_every_data_set(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "bench", "--list_models")
    assert code == 0
    names = [(line.split()[1], line.split()[0]) for line in out.splitlines()[2:]]
    assert sorted(names) == sorted((d, n) for d in DATASETS for n in list_models(d))


def test_forward_only_prints_accuracy_columns(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    code, out, err = run_main(
        capsys,
        *QUICK,
        "--forward_only",
        "--num_batches=4",
        "--num_warmup_batches=3",
        "--display_every=2",
        f"--trace_file={trace}",
    )
    assert code == 0, err
    assert "Mode:        forward-only" in out
    assert "Step\tImg/sec\ttotal_loss\ttop_1_accuracy\ttop_5_accuracy" in out
    lines = [line for line in out.splitlines() if STEP_RE.match(line)]
    assert [int(line.split("\t")[0]) for line in lines] == [1, 2, 4]
    assert all(len(line.split("\t")) == 5 and line.split("\t")[2] == "0.000" for line in lines)
    assert TOTAL_RE.search(out)
    assert json.loads(trace.read_text())["traceEvents"]  # a Chrome trace of the traced warm-up batch


def test_inference_mode_prints_latencies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_main(
        capsys,
        *QUICK,
        "--mode=inference",
        "--iterations=6",
        "--num_inference_threads=2",
        f"--results_file={tmp_path / 'r.json'}",
    )
    assert code == 0, err
    m = LATENCY_RE.search(out)
    assert m is not None, out
    avg, p99, p999, worst = map(float, m.groups())
    assert 0 < avg <= p99 <= p999 <= worst
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["num_steps"] == 12 and len(result["latencies_ms"]) == 12  # pooled over both threads
    assert result["latency_max_ms"] == pytest.approx(worst, abs=1e-4)
    assert float(TOTAL_RE.search(out).group(1)) == pytest.approx(result["images_per_sec"], abs=0.01)  # type: ignore[union-attr]


def write_black_and_white_cifar(root: Path, per_file: int = 16) -> Path:
    """CIFAR-10 binaries of all-black images (label 0) and all-white images (label 1)."""
    root.mkdir(parents=True, exist_ok=True)
    labels = np.arange(per_file) % 2
    records = np.zeros((per_file, 1 + 3 * 32 * 32), np.uint8)
    records[:, 0] = labels
    records[labels == 1, 1:] = 255
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (root / name).write_bytes(records.tobytes())
    return root


def test_black_and_white_train_checkpoint_eval_round_trip(tmp_path: Path) -> None:
    data = write_black_and_white_cifar(tmp_path / "data")
    train = BenchConfig(
        model="trivial",
        data_dir=str(data),
        batch_size=16,
        num_batches=30,
        num_warmup_batches=0,
        train_dir=str(tmp_path / "train"),
        init_learning_rate=0.001,
        distortions=True,  # CIFAR's pad-crop-flip, with which these 30 steps reach 1.0 (the seed's default)
        device="cpu",
        display_every=100,
    )
    lines: list[str] = []
    result = run_benchmark(train, log=lines.append)
    assert "Dataset:     cifar10" in lines and result["global_step"] == 30
    assert (tmp_path / "train" / "checkpoint.json").exists()
    # Rerunning the same command resumes: the run already reached its last step.
    again = run_benchmark(train, log=lines.append)
    assert again["num_steps"] == 0 and any(line.startswith("Resuming from global step 30") for line in lines)
    # A longer run in the same train_dir continues from step 30.
    longer = run_benchmark(train.replace(num_batches=33), log=lines.append)
    assert (longer["num_steps"], longer["global_step"]) == (3, 33)
    # --eval reads the newest checkpoint and makes one pass over test_batch.bin.
    evaluated = run_benchmark(train.replace(eval=True, num_batches=None), log=lines.append)
    assert lines[-1] == "Accuracy @ 1 = 1.0000 Accuracy @ 5 = 1.0000 [16 examples]"
    assert evaluated["top_1_accuracy"] == 1.0 and evaluated["global_step"] == 33


def test_eval_without_checkpoint_fails_cleanly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_main(capsys, *QUICK, "--eval", f"--train_dir={tmp_path}")
    assert code == 1 and "Checkpoint not found" in err


def test_train_and_eval_stops_at_target_accuracy(tmp_path: Path) -> None:
    data = write_black_and_white_cifar(tmp_path / "data")
    cfg = BenchConfig(
        model="trivial",
        data_dir=str(data),
        batch_size=16,
        num_batches=40,
        num_warmup_batches=0,
        init_learning_rate=0.001,
        eval_during_training_every_n_steps=10,
        stop_at_top_1_accuracy=1.0,
        distortions=True,  # as above
        device="cpu",
        display_every=100,
    )
    lines: list[str] = []
    result = run_benchmark(cfg, log=lines.append)
    assert "Mode:        training + evaluation" in lines
    assert "Running evaluation at global_step 10" in lines
    assert "Stopping, as eval accuracy at least 1.0 was reached" in lines
    assert result["top_1_accuracy"] == 1.0 and result["global_step"] < 40
    assert not any(TOTAL_RE.fullmatch(line) for line in lines)  # no single images/sec with eval mixed in


@pytest.mark.slow
def test_train_dir_exports_and_the_export_benchmarks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    export = pytest.importorskip("stoker.export")
    train_dir = tmp_path / "train"
    code, _, err = run_main(capsys, *QUICK, "--num_batches=2", "--num_warmup_batches=0", f"--train_dir={train_dir}")
    assert code == 0, err
    assert json.loads((train_dir / "run_spec.json").read_text())["model"] == "trivial"  # what stoker export reads
    est, example, _ = estimator_from_model_dir(train_dir)
    export.export(est, tmp_path / "exported", example)
    code, out, err = run_main(
        capsys, *QUICK, "--mode=inference", f"--exported={tmp_path / 'exported'}", "--iterations=5"
    )
    assert code == 0, err
    assert "Model:       exported program" in out and LATENCY_RE.search(out)


def test_warm_up_and_timed_steps_run_as_one_train_call(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One train call, so one input pipeline: the timed steps start with its workers running and
    # its queue full (a second call would start them again inside the timed steps).
    from stoker.estimator import Estimator

    calls: list[dict[str, object]] = []
    train = Estimator.train

    def counting_train(self: Estimator, *args: object, **kwargs: object) -> None:
        calls.append(kwargs)
        train(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Estimator, "train", counting_train)
    code, out, err = run_main(
        capsys, *QUICK, "--num_batches=5", "--num_warmup_batches=3", "--iterations_per_loop=2", "--display_every=1"
    )
    assert code == 0, err
    assert [c.get("max_steps") for c in calls] == [9]  # the rounding adds a warm-up step, takes no timed one
    lines = out.splitlines()
    note = "Note: warm-up of 3 step(s) rounded up to 4, whole loops of --iterations_per_loop=2; 5 step(s) timed"
    assert note in lines
    done = lines.index("Done warm up")
    assert lines.index("Running warm up") < done < lines.index("Step\tImg/sec\ttotal_loss")
    assert not any(STEP_RE.fullmatch(line) for line in lines[:done])
    # the timed steps are global steps 5-9: loops of two and a last one, numbered from the first timed step
    assert [int(m.group(1)) for m in STEP_RE.finditer(out)] == [2, 4, 5]


@pytest.mark.parametrize(
    ("num_batches", "warmup", "loop", "warm_run"),
    [
        (10, 5, 10, 10),  # the case: it timed 5 steps
        (10, 5, 1, 5),
        (7, 3, 4, 4),
        (5, 0, 3, 0),
        (3, 4, 4, 4),
        (4, 1, 3, 3),
    ],
)
def test_num_batches_is_the_number_of_timed_steps(num_batches: int, warmup: int, loop: int, warm_run: int) -> None:
    """As tf_cnn_benchmarks: --num_batches steps are timed, whatever --iterations_per_loop; the
    warm-up rounded up to a loop boundary runs more warm-up steps (``warm_run``)."""
    cfg = BenchConfig(
        model="trivial",
        data_name="cifar10",
        batch_size=4,
        device="cpu",
        num_batches=num_batches,
        num_warmup_batches=warmup,
        iterations_per_loop=loop,
        display_every=1000,
    )
    result = run_benchmark(cfg, log=lambda line: None)
    assert result["num_steps"] == num_batches
    assert result["global_step"] == warm_run + num_batches


def test_no_warm_up_traces_the_first_timed_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    code, out, err = run_main(capsys, *QUICK, "--num_batches=2", "--num_warmup_batches=0", f"--trace_file={trace}")
    assert code == 0, err
    lines = out.splitlines()
    note = lines.index("Note: no warm-up steps, so the traced step is the first timed one")
    assert lines.index("Done warm up") < note < lines.index("Step\tImg/sec\ttotal_loss")
    first_step = next(i for i, line in enumerate(lines) if STEP_RE.fullmatch(line))
    assert lines.index(f"Dumping trace to {trace}") > first_step and json.loads(trace.read_text())["traceEvents"]
