"""``make gpu-check`` (benchmarks/gpu_check.py) on a machine without a GPU: its plan (the dry run),
the clean exit without CUDA, the peak table, parsing real ``stoker bench`` output, and the
runner's handling of rows that succeed, fail, time out or cannot run here."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env, run_process

_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # dataclasses look their module up by name
_spec.loader.exec_module(gc)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")


def run_gpu_check(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_process(
        [PYTHON, "benchmarks/gpu_check.py", *args],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def dry_run() -> str:
    proc = run_gpu_check("--dry-run", "--plan=full")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; a collection of the whole suite
def test_dry_run_lists_the_cuda_marked_tests(dry_run: str) -> None:
    assert f"tests: PYTHONPATH=src {shlex.join([PYTHON, *gc.PYTEST_ARGS])}" in dry_run
    listed = [line.strip() for line in dry_run.splitlines() if line.startswith("    tests/")]
    for case in (
        "test_cuda_resume_is_bitwise_equal[fp32]",
        "test_cuda_resume_is_bitwise_equal[bf16]",
        "test_cuda_resume_is_bitwise_equal[fp16]",
        "test_cuda_infeed_copies_on_a_side_stream_and_eval_is_exact",
    ):
        assert f"tests/test_cuda.py::{case}" in listed
    for case in (
        "test_default_data_format_on_cuda_is_nhwc",
        "test_channels_last_and_compiled_train_what_nchw_eager_trains",
    ):
        assert f"tests/bench/test_bench_cuda_paths.py::{case}" in listed
    # Only cuda-marked tests: every listed file marks tests cuda, and this (unmarked) file is absent.
    assert all("pytest.mark.cuda" in (ROOT / t.split("::")[0]).read_text() for t in listed)
    assert not any("test_gpu_check.py" in t for t in listed)
    assert f"selects {len(listed)} test(s):" in dry_run


def _row(rows: list, **want: object):
    found = [r for r in rows if all(getattr(r, k) == v for k, v in want.items())]
    assert len(found) == 1, (want, [r.name for r in found])
    return found[0]


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; it shares the dry run above
def test_dry_run_plans_every_required_row(dry_run: str) -> None:
    rows = gc.plan(PYTHON)
    for row in rows:  # the dry run prints each row's name and exact command
        assert row.name in dry_run and row.command in dry_run
    flag = {"eager": "--compile=false", "compiled": "--compile=module", "cuda_graph": "--cuda_graph=true"}
    for precision in ("fp16", "bf16"):
        for variant in ("eager", "compiled", "cuda_graph"):
            plain = _row(rows, model="resnet50", batch_size=256, precision=precision, impl="plain", variant=variant)
            assert plain.argv[1:3] == ["benchmarks/gpu_check.py", "plain"]
            assert {"--model=resnet50", "--batch_size=256", f"--precision={precision}", f"--variant={variant}"} <= set(
                plain.argv
            )
            st = _row(
                rows,
                model="resnet50",
                batch_size=256,
                precision=precision,
                impl="stoker",
                variant=variant,
                data_format="NHWC",
            )
            assert st.argv[1:4] == ["-m", "stoker", "bench"]
            assert {
                "--device=cuda",
                "--model=resnet50",
                "--batch_size=256",
                "--data_format=NHWC",
                f"--precision={precision}",
                flag[variant],
            } <= set(st.argv)
            assert ("--cuda_graph=true" in st.argv) == (variant == "cuda_graph")
    for impl in ("plain", "stoker"):
        _row(rows, model="resnet20", dataset="cifar10", batch_size=128, impl=impl, variant="eager")
        _row(rows, model="resnet20", dataset="cifar10", batch_size=128, impl=impl, variant="cuda_graph")
    for batch in (1, 64):
        inf = _row(rows, variant="inference", batch_size=batch)
        assert {"--mode=inference", f"--batch_size={batch}", "--device=cuda"} <= set(inf.argv) and not inf.training
    multi = [r for r in rows if r.nproc > 1]
    assert {r.variant for r in multi} == {"replicated", "sharded"}
    for r in multi:
        assert r.argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        assert f"{r.name}   [needs 2 CUDA devices, else: skipped: 1 device]" in dry_run
    assert len({r.slug for r in rows}) == len(rows)  # distinct logs and results files


def test_quick_plans_fewer_batches() -> None:
    full, quick = gc.plan(PYTHON), gc.plan(PYTHON, quick=True)
    assert [r.name for r in full] == [r.name for r in quick]
    assert (
        f"--num_batches={gc.FULL.num_batches}" in full[0].argv
        and f"--num_batches={gc.QUICK.num_batches}" in quick[0].argv
    )
    assert gc.QUICK.num_batches < gc.FULL.num_batches


def test_planned_commands_are_valid_flags() -> None:
    """Every stoker row parses with the real `stoker bench` parser into a valid BenchConfig, and every
    plain row with the plain loop's parser. Until `--compile=module|step` and `--cuda_graph` land,
    those two flags are mapped to today's `--compile=true` / dropped."""
    from stoker.bench.cli import add_parser, config_from_args

    sub = argparse.ArgumentParser(exit_on_error=False).add_subparsers()
    parser = add_parser(sub)
    new_flags = "--cuda_graph" in parser._option_string_actions
    for row in gc.plan(PYTHON):
        if row.impl == "restart":  # benchmarks/restart.py, not stoker bench
            assert gc.ROOT.joinpath(row.argv[1]).is_file() and "--device=cuda" in row.argv
            continue
        if row.impl == "plain":
            args = gc.plain_parser().parse_args(row.argv[3:])
            assert (args.model, args.batch_size, args.precision, args.variant) == (
                row.model,
                row.batch_size,
                row.precision,
                row.variant,
            )
            continue
        argv = row.argv[row.argv.index("bench") + 1 :]
        if not new_flags:
            argv = [
                {"--compile=module": "--compile=true", "--compile=step": "--compile=true"}.get(a, a)
                for a in argv
                if a != "--cuda_graph=true"
            ]
        cfg = config_from_args(parser.parse_args(argv))
        assert (cfg.model, cfg.batch_size, cfg.precision, cfg.device) == (
            row.model,
            row.batch_size,
            row.precision,
            "cuda",
        )


@no_cuda
def test_without_cuda_it_exits_at_once_with_its_message(tmp_path: Path) -> None:
    out = tmp_path / "gc.json"
    start = time.perf_counter()
    proc = run_gpu_check(f"--out={out}", timeout=60)
    assert time.perf_counter() - start < 30
    assert proc.returncode == gc.EXIT_NO_CUDA == 3, proc.stdout + proc.stderr
    assert proc.stdout.strip() == gc.no_cuda_message(torch)
    assert proc.stdout.startswith(
        f"gpu-check: no CUDA device visible to this Python (torch {torch.__version__}, built "
    )
    assert proc.stdout.strip().endswith("run it on a machine with an NVIDIA GPU: make gpu-check PY=python3")
    assert list(tmp_path.iterdir()) == []  # ran nothing, wrote nothing


@no_cuda
def test_make_gpu_check_exits_0_with_the_message_without_cuda() -> None:
    proc = subprocess.run(
        ["make", "-s", "gpu-check", f"PY={PYTHON}"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == gc.no_cuda_message(torch)
    assert not (ROOT / "gpu-check.json").exists()


def test_peak_lookup() -> None:
    assert gc.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == (989.0, "H100 SXM")
    assert gc.peak_bf16_tflops("NVIDIA H100 PCIe")[0] == 756.0
    assert gc.peak_bf16_tflops("NVIDIA H100 NVL")[0] == 835.0
    assert gc.peak_bf16_tflops("NVIDIA H200")[0] == 989.0
    assert gc.peak_bf16_tflops("NVIDIA A100-SXM4-80GB")[0] == 312.0
    assert gc.peak_bf16_tflops("NVIDIA A10")[0] == 125.0
    assert gc.peak_bf16_tflops("NVIDIA L4")[0] == 121.0
    assert gc.peak_bf16_tflops("NVIDIA L40S")[0] == 362.0
    assert gc.peak_bf16_tflops("NVIDIA GeForce RTX 4090")[0] == 165.2
    assert gc.peak_bf16_tflops("Tesla V100-SXM2-16GB")[0] == 125.0
    assert gc.peak_bf16_tflops("Tesla T4")[0] == 65.0
    assert gc.peak_bf16_tflops("NVIDIA GeForce GTX 1080") == (None, "unknown peak")
    row = gc.Row("r", "stoker", "eager", "m", "d", 1, "bf16", [])
    row.result = {"status": "ok", "images_per_sec": 10.0}
    assert gc._mfu_text(row) == "n/a (unknown peak)"
    row.result["mfu"] = 0.4567
    assert gc._mfu_text(row) == "45.7 %"


def _stoker_cpu(*args: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [
            PYTHON,
            "-m",
            "stoker",
            "bench",
            "--device=cpu",
            "--model=trivial",
            "--data_name=cifar10",
            "--batch_size=8",
            "--peak_tflops=1",
            *args,
        ],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_parses_real_stoker_bench_training_output(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc = _stoker_cpu("--num_batches=2", "--num_warmup_batches=1", f"--results_file={results}")
    assert proc.returncode == 0, proc.stderr
    parsed = gc.parse_stoker_output(proc.stdout)
    full = json.loads(results.read_text())
    assert parsed["images_per_sec"] == pytest.approx(full["images_per_sec"], abs=0.006)  # printed with 2 decimals
    assert parsed["stoker_mfu_measured_peak"] == pytest.approx(full["mfu"], abs=0.0006)
    assert "latency_avg_ms" not in parsed
    assert gc.parse_stoker_output("stoker bench: error: boom\n") == {}


def test_parses_real_stoker_bench_inference_output(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc = _stoker_cpu("--mode=inference", "--iterations=5", f"--results_file={results}")
    assert proc.returncode == 0, proc.stderr
    parsed = gc.parse_stoker_output(proc.stdout)
    full = json.loads(results.read_text())
    assert parsed["images_per_sec"] == pytest.approx(full["images_per_sec"], abs=0.006)
    assert parsed["latency_avg_ms"] == pytest.approx(full["latency_avg_ms"], abs=0.00006)
    assert parsed["latency_p99_ms"] == pytest.approx(full["latency_p99_ms"], abs=0.00006)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_plain_loop_runs_eagerly_on_cpu(precision: str) -> None:
    """The hand-written loop's eager path (its compiled and CUDA-graph paths need a GPU)."""
    res = gc.plain_loop("trivial", "cifar10", 4, precision, "eager", num_batches=2, num_warmup=1, device="cpu")
    assert res["images_per_sec"] > 0 and res["loss"] == res["loss"]
    if precision == "fp16":
        return  # the command line once is enough
    out = run_process(
        [
            PYTHON,
            "benchmarks/gpu_check.py",
            "plain",
            "--device=cpu",
            "--model=trivial",
            "--data_name=cifar10",
            "--batch_size=4",
            f"--precision={precision}",
            "--num_batches=2",
            "--num_warmup_batches=1",
        ],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert gc.parse_plain_output(out.stdout)["images_per_sec"] > 0


def _fake_torch(name: str = "NVIDIA H100 80GB HBM3", count: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        __version__="9.9.9+cu999",
        version=SimpleNamespace(cuda="99.9"),
        backends=SimpleNamespace(cudnn=SimpleNamespace(version=lambda: 99999)),
        cuda=SimpleNamespace(
            get_device_name=lambda i: name, device_count=lambda: count, get_device_capability=lambda i: (9, 0)
        ),
    )


def _args(**kw: object) -> argparse.Namespace:
    base = dict(quick=True, budget=600.0, step_timeout=120.0, peak_tflops=None, skip_tests=True, python=PYTHON)
    return argparse.Namespace(**{**base, **kw})


def test_runner_records_ok_failed_and_skipped_rows(tmp_path: Path) -> None:
    """The orchestration on CPU commands: a real stoker row (images/sec, MFU against the table's
    peak), a failing row, a two-device row; the run goes on after each."""
    rows_dir = tmp_path / "gc.rows"
    res_file = str(rows_dir / "ok.json")
    ok = gc.Row(
        "ok row",
        "stoker",
        "eager",
        "trivial",
        "cifar10",
        8,
        "fp32",
        [
            PYTHON,
            "-m",
            "stoker",
            "bench",
            "--device=cpu",
            "--model=trivial",
            "--data_name=cifar10",
            "--batch_size=8",
            "--num_batches=2",
            "--num_warmup_batches=1",
            "--peak_tflops=1",
            f"--results_file={res_file}",
        ],
        results_file=res_file,
    )
    bad = gc.Row(
        "bad row", "plain", "eager", "trivial", "cifar10", 8, "fp32", [PYTHON, "-c", "import sys; sys.exit(5)"]
    )
    multi = gc.Row(
        "multi row",
        "stoker",
        "replicated",
        "trivial",
        "cifar10",
        8,
        "fp32",
        [PYTHON, "-c", "raise SystemExit(9)"],
        nproc=2,
    )
    out = tmp_path / "gc.json"
    rc = gc.run_all(_args(), [ok, bad, multi], out, rows_dir, _fake_torch(), "0.0.0", lambda model, dataset: 0.5)
    assert rc == gc.EXIT_FAILED
    report = json.loads(out.read_text())
    assert (report["device"], report["device_count"], report["torch_version"], report["cuda_version"]) == (
        "NVIDIA H100 80GB HBM3",
        1,
        "9.9.9+cu999",
        "99.9",
    )
    assert report["peak_bf16_tflops"] == 989.0 and report["status"] == "failed" and report["date"]
    assert report["tests"]["status"] == "skipped: --skip-tests"
    by_name = {r["name"]: r for r in report["rows"]}
    assert list(by_name) == ["ok row", "bad row", "multi row"]
    good = by_name["ok row"]
    assert good["status"] == "ok" and good["command"] == ok.command
    assert good["images_per_sec"] == json.loads(Path(res_file).read_text())["images_per_sec"]
    assert good["gflop_per_image"] == 1.5  # 3 x forward for training
    assert good["mfu"] == pytest.approx(good["images_per_sec"] * 1.5 / 989_000)
    assert by_name["bad row"]["status"] == "failed: exit 5"
    assert by_name["multi row"]["status"] == "skipped: 1 device"
    table = out.with_suffix(".md").read_text()
    assert "| multi row | - | - | skipped: 1 device |" in table
    assert f"| ok row | {good['images_per_sec']:.1f} | {100 * good['mfu']:.1f} % | ok |" in table


def test_a_row_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    spawn = (
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); p.wait()"
    )
    row = gc.Row("slow row", "plain", "eager", "trivial", "cifar10", 8, "fp32", [PYTHON, "-c", spawn])
    start = time.perf_counter()
    res = gc.measure_row(row, 3.0, tmp_path / "slow.log", 1.0, 989.0)
    assert res["status"] == "timeout after 3 s" and time.perf_counter() - start < 20
    grandchild = Path(f"/proc/{pid_file.read_text()}/status")
    time.sleep(0.5)
    assert not grandchild.exists() or "State:\tZ" in grandchild.read_text()  # gone (or a zombie awaiting init)


def test_runner_skips_rows_past_the_budget_and_marks_unknown_peaks(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    row = gc.Row(
        "late row", "plain", "eager", "trivial", "cifar10", 8, "fp32", [PYTHON, "-c", f"open({str(ran)!r}, 'w')"]
    )
    out = tmp_path / "gc.json"
    rc = gc.run_all(
        _args(budget=gc.MIN_ROW_S - 1), [row], out, tmp_path / "rows", _fake_torch("Some GPU"), "0", lambda m, d: 1.0
    )
    report = json.loads(out.read_text())
    assert rc == gc.EXIT_OK and not ran.exists()
    assert report["rows"][0]["status"].startswith("skipped: time budget")
    assert report["peak_bf16_tflops"] is None
    assert "MFU against n/a (unknown peak)" in out.with_suffix(".md").read_text()


def test_plan_runs_the_default_data_format_and_a_compiled_resnet20() -> None:
    rows = gc.plan(PYTHON)
    default = _row(rows, model="resnet50", impl="stoker", variant="eager", data_format=None)
    assert not any(a.startswith("--data_format") for a in default.argv) and "default-format" in default.name
    assert all("--data_format=NHWC" in r.argv for r in rows if r.impl == "stoker" and r.data_format)
    compiled = _row(rows, model="resnet20", impl="stoker", variant="compiled")
    assert {"--compile=module", "--data_format=NHWC", "--data_name=cifar10"} <= set(compiled.argv)


def test_a_stoker_row_that_ran_nchw_fails(tmp_path: Path) -> None:
    res_file = str(tmp_path / "nchw.json")
    argv = [PYTHON, "-m", "stoker", "bench", "--device=cpu", "--model=trivial", "--data_name=cifar10"]
    argv += ["--batch_size=8", "--num_batches=2", "--num_warmup_batches=1", "--peak_tflops=1"]
    row = gc.Row(
        "nchw row",
        "stoker",
        "eager",
        "trivial",
        "cifar10",
        8,
        "fp32",
        [*argv, "--data_format=NCHW", f"--results_file={res_file}"],
        results_file=res_file,
        data_format="NCHW",
    )
    res = gc.measure_row(row, 120.0, tmp_path / "nchw.log", 0.5, 989.0)
    assert res["status"] == "failed: ran NCHW with --data_format=NCHW, expected NHWC"
    assert res["images_per_sec"] > 0 and res["data_format"] == "NCHW"


def test_plan_reads_real_jpegs_on_cpu_workers_threads_and_nvjpeg() -> None:
    rows = [r for r in gc.plan(PYTHON, images_dir="some/images") if r.real_images]
    assert {(r.model, r.variant) for r in rows} == {
        (m, v) for m in ("trivial", "resnet50") for v in ("real-cpu-decode", "real-cpu-threads", "real-nvjpeg")
    }
    assert all("--data_dir=some/images" in r.argv for r in rows)
    assert [("--decode_on_device" in r.argv) for r in rows] == [r.variant == "real-nvjpeg" for r in rows]
    assert [("--data_worker_kind=thread" in r.argv) for r in rows] == [r.variant == "real-cpu-threads" for r in rows]


def test_select_keeps_the_matching_rows_and_refuses_what_matches_none() -> None:
    proc = run_gpu_check("--dry-run", "--no-collect", "--plan=full", "--select", "real-nvjpeg")
    assert proc.returncode == 0, proc.stderr
    listed = [line for line in proc.stdout.splitlines() if line[:5].strip().rstrip(".").isdigit()]
    assert len(listed) == 2 and all(line.endswith("real-nvjpeg") for line in listed)
    for bad in ("no-such-row", "(unclosed"):
        proc = run_gpu_check("--dry-run", "--no-collect", "--select", bad)
        assert proc.returncode == 2 and "--select" in proc.stderr


def test_generated_jpegs_are_made_once_and_decode(tmp_path: Path) -> None:
    from stoker.data.images.decoders import get_decoder

    assert gc.make_images(tmp_path, count=6, classes=3, workers=2) > 0
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 6 and len({f.parent.name for f in files}) == 3
    assert get_decoder("pillow").decode(files[0].read_bytes()).shape == (375, 500, 3)
    assert gc.make_images(tmp_path, count=6, classes=3, workers=2) == 0.0  # complete: kept


# ----------------------------------------------------------------------------- the targets plan (issue 41)
def test_the_targets_plan_answers_every_target_within_9_minutes() -> None:
    """``make gpu-check`` runs the targets plan: every target's rows are in it, and the plan's
    estimate (tests and the JPEG folder included) fits the 540 s budget, quick or not."""
    for quick in (False, True):
        rows = gc.targets_plan(PYTHON, quick=quick)
        names = {r.name for r in rows}
        for _what, num, den, _threshold in gc.TARGETS:
            assert num in names and (den is None or den in names), (num, den)
        assert gc.plan_estimate(rows) <= gc.TARGETS_BUDGET_S <= 9 * 60
        assert len({r.slug for r in rows}) == len(rows)
    rows = {r.name: r for r in gc.targets_plan(PYTHON, rows_dir="rd", images_dir="imgs")}
    stoker_graph = rows[gc.R20_STOKER]
    assert "--cuda_graph=true" in stoker_graph.argv and not any(a.startswith("--optimizer") for a in stoker_graph.argv)
    assert "--optimizer=sgd" in rows[gc.R20_PLAIN].argv  # the bench's default update, written by hand
    recipe = rows[gc.BERT_COMPILED]
    assert recipe.argv[1:5] == ["-m", "stoker", "train", "bert"] and recipe.scratch == recipe.argv[6]
    shape = dict(zip(recipe.argv[7::2], recipe.argv[8::2], strict=True))
    assert (shape["--hidden_size"], shape["--num_layers"], shape["--num_heads"]) == ("1024", "24", "16")
    assert (shape["--intermediate_size"], shape["--seq_len"], shape["--batch_size"]) == ("4096", "512", "32")
    assert (
        shape["--compile"] == "module"
        and rows[gc.BERT_EAGER].argv[rows[gc.BERT_EAGER].argv.index("--compile") + 1] == "none"
    )
    real = rows[f"{gc.R50} stoker compiled real JPEGs"]
    assert {"--compile=module", "--data_dir=imgs", "--precision=bf16", "--batch_size=256"} <= set(real.argv)
    assert real.real_images and real.steady_from_step == gc.STEADY_FROM
    assert f"--num_batches={gc.REAL_TIMED_STEPS}" in real.argv and gc.REAL_TIMED_STEPS >= 2 * gc.STEADY_FROM
    assert "--compile=module" in rows[f"{gc.R50} stoker compiled"].argv


def test_the_targets_dry_run_prints_estimates_and_every_threshold() -> None:
    proc = run_gpu_check("--dry-run", "--no-collect", "--quick")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "overall budget 540 s" in out and "within the budget of 540 s" in out
    assert f"-m cuda {' '.join(gc.TARGET_TESTS)}" in out
    for threshold in (">= 0.95x", ">= 1.00x", ">= 40 % MFU", ">= 0.98x"):
        assert threshold in out
    assert out.count("     estimate ") == len(gc.targets_plan(PYTHON))


def test_planned_recipe_and_plain_bert_commands_parse() -> None:
    from stoker.recipes.bert import RECIPE, BertConfig, training_flops_per_example

    for row in gc.targets_plan(PYTHON):
        if row.model != "bert":
            continue
        if row.impl == "plain":
            args = gc.plain_parser().parse_args(row.argv[3:])
            assert (args.model, args.precision, args.variant) == ("bert_large", "bf16", "eager")
            continue
        parser = argparse.ArgumentParser()
        RECIPE.add_arguments(parser)
        config = RECIPE.config_from_args(parser.parse_args(row.argv[5:]))
        assert RECIPE.config_error(config) is None and config.device == "cuda" and config.precision == "bf16"
        assert row.flops_per_example == training_flops_per_example(config)  # the plan's count is the recipe's
    shape = BertConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096, seq_len=512)
    assert gc.bert_flops() == training_flops_per_example(shape)


def test_plain_bert_loop_runs_on_cpu() -> None:
    proc = run_process(
        [PYTHON, "benchmarks/gpu_check.py", "plain", "--model=bert_large", "--precision=fp32", "--variant=eager"]
        + ["--num_batches=2", "--num_warmup_batches=1", "--device=cpu", "--bert_shape=32,2,2,64,16,4"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = gc.parse_plain_output(proc.stdout)
    assert result["images_per_sec"] > 0 and result["loss"] > 0 and result["device"] == "cpu"


def test_recipe_output_parses_and_targets_are_judged() -> None:
    text = (
        "held-out ...\ntraining: 281.5 examples/sec (steps 11-60), "
        "MFU 41.2 % of 989 TFLOP/s (H200 SXM data sheet, dense bf16)\n"
    )
    assert gc.parse_stoker_output(text) == {"images_per_sec": 281.5, "stoker_mfu": pytest.approx(0.412)}
    rows = gc.targets_plan(PYTHON)
    by = {r.name: r for r in rows}
    by[gc.R20_PLAIN].result = {"status": "ok", "images_per_sec": 56000.0}
    by[gc.R20_STOKER].result = {"status": "ok", "images_per_sec": 54600.0}
    by[gc.BERT_PLAIN].result = {"status": "ok", "images_per_sec": 270.0}
    by[gc.BERT_EAGER].result = {"status": "failed: exit 1"}
    by[gc.BERT_COMPILED].result = {"status": "ok", "images_per_sec": 400.0, "mfu": 0.45}
    real = by[f"{gc.R50} stoker compiled real JPEGs"]
    real.result = {"status": "ok", "images_per_sec": 9000.0, "steady_images_per_sec": None}  # too few steps
    by[f"{gc.R50} stoker compiled"].result = {"status": "ok", "images_per_sec": 6900.0}
    lines = gc.target_lines(rows)
    assert lines[0] == "target resnet20 stoker --cuda_graph=true / plain CUDA graph: >= 0.95x: 0.975x MET"
    assert lines[1].startswith("target BERT-large shape: stoker train bert eager / plain eager: >= 1.00x: not measured")
    assert "failed: exit 1" in lines[1]
    assert lines[2].endswith(">= 40 % MFU: 45.0 % MFU MET")
    assert "real JPEGs / synthetic: >= 0.95x: not measured" in lines[3]  # a buffered rate is never a result
    assert lines[4].endswith(
        "not measured (resnet50 imagenet b256 NHWC bf16 stoker eager: not run; "
        "resnet50 imagenet b256 NHWC bf16 plain eager: not run)"
    )


def test_the_steady_rate_leaves_out_what_the_queues_held() -> None:
    # 30 loops of 10 steps: the first 10 loops ran from buffered batches (fast), the rest at the decoding's pace
    times = [0.01] * 10 + [0.05] * 20
    assert gc.steady_rate(times, 256, 10, 100) == pytest.approx(256 / 0.05)
    assert gc.steady_rate(times[:15], 256, 10, 100) is None  # 50 steps after step 100: not enough


def test_the_plan_has_the_restart_rows_and_reads_their_ratio() -> None:
    rows = {r.variant: r for r in gc.plan(PYTHON) if r.impl == "restart"}
    assert set(rows) == {"compile_step", "cuda_graph"} and "--cuda_graph" in rows["cuda_graph"].argv
    line = "resnet20: restart on a fresh machine 0.31x of the first start (target <= 0.4x); final weights ..."
    assert gc.parse_restart_output(line) == {"restart_ratio": 0.31}
    assert gc.parse_restart_output("no line") == {}
