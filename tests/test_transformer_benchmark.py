"""``benchmarks/transformer.py``: the BERT recipe beside a plain PyTorch loop, run once at a tiny
size. What is checked is the table (every row, the ratios, the same work counted for both
models) and the figures file, never a speed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env, run_process

TINY = ["--hidden=32", "--layers=2", "--heads=2", "--intermediate=64", "--seq_len=16", "--batch=4"]
ONCE = ["--warmup=1", "--steps=1", "--rounds=1"]
RATE = r"\s+\d+\.\d\s+\d+\.\d\dx$"  # a row's examples/sec and its ratio to the plain loop


def _run(tmp_path: Path, *flags: str) -> tuple[str, dict]:
    out = tmp_path / "figures.json"
    proc = run_process(
        [PYTHON, "benchmarks/transformer.py", *TINY, *ONCE, *flags, f"--json={out}"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text())


def _row(stdout: str, name: str, text: str) -> None:
    assert re.search(rf"^  {re.escape(name + ': ' + text)}{RATE}", stdout, re.M), stdout


def test_eager_rows_and_ratios(tmp_path: Path) -> None:
    stdout, figures = _run(tmp_path, "--compile=none")
    assert "hidden 32, 2 layers, 2 heads, intermediate 64, seq 16, batch 4, fp32, fast_linear off" in stdout
    assert re.search(r"one step: plain (\S+) GFLOP, stoker \1 GFLOP \(the same work", stdout), stdout
    _row(stdout, "plain", "plain nn.TransformerEncoder + AdamW, eager")
    _row(stdout, "stoker sdpa", "stoker train bert --attention sdpa")
    _row(stdout, "stoker math", "stoker train bert --attention math")
    assert re.search(r"^  plain: .*\s1\.00x$", stdout, re.M)  # the baseline's ratio to itself
    assert re.search(r"^  stoker sdpa / stoker math: \d+\.\d\dx$", stdout, re.M), stdout
    assert "compiled" not in stdout  # --compile=none: no compiled rows
    assert figures["step_flops"]["plain"] == figures["step_flops"]["stoker"] > 0
    assert set(figures["examples_per_sec"]) == {"plain", "stoker sdpa", "stoker math"}
    assert all(len(rounds) == 1 for rounds in figures["rounds"].values())
    rate, ratio = figures["examples_per_sec"], figures["ratios"]
    assert ratio["stoker sdpa"] == pytest.approx(rate["stoker sdpa"] / rate["plain"])
    assert ratio["stoker sdpa / stoker math"] == pytest.approx(rate["stoker sdpa"] / rate["stoker math"])


@pytest.mark.slow  # inductor compiles two models: ~35 s on two cores without its cache
def test_compiled_rows(tmp_path: Path) -> None:
    stdout, figures = _run(tmp_path, "--compile=module")
    _row(stdout, "plain compiled", "plain, torch.compile of the model")
    _row(stdout, "stoker compiled", "stoker train bert --attention sdpa --compile module")
    assert re.search(r"^  stoker compiled / plain compiled: \d+\.\d\dx$", stdout, re.M), stdout
    assert set(figures["examples_per_sec"]) == {
        "plain",
        "stoker sdpa",
        "stoker math",
        "plain compiled",
        "stoker compiled",
    }


def test_bad_shape_is_a_usage_error() -> None:
    proc = run_process(
        [PYTHON, "benchmarks/transformer.py", "--hidden=30", "--heads=4"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--hidden (30) must be divisible by --heads (4)" in proc.stderr
