"""Compiled artifacts travel with the checkpoint (stoker.engine.compile_cache, issue 49).

Fast tests: the bundle's format, and what a resume does with the bundle a checkpoint references
(installed when its fingerprint and sha256 hold; one log line and a fresh compile otherwise).
Slow tests compile for real, in processes with empty compiler caches (a fresh machine): the
restart compiles from the artifacts (inductor's cache counters say so) and trains bitwise as an
uninterrupted compiled run; a corrupted bundle is refused and the run compiles afresh, bitwise.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.paths import ROOT
from stoker.checkpoint import CheckpointManager
from stoker.checkpoint.compiled import COMPILED_DIR, CompiledBundle
from stoker.engine.compile_cache import CompileCache, fingerprint, pack, unpack
from stoker.errors import CheckpointError

KERNEL = "ab/cabcdefghijklmnopqrstuvwxyz0123.main.cpp"


def cache(model: torch.nn.Module | None = None, precision: str = "fp32") -> CompileCache:
    return CompileCache(
        model or torch.nn.Linear(2, 2), compile_mode="step", precision=precision, device=torch.device("cpu")
    )


def checkpoint_with(tmp_path: Path, bundle: CompiledBundle) -> Path:
    mgr = CheckpointManager(tmp_path / "m")
    mgr.save(1, {"w": torch.ones(1)}, {"global_step": 1}, compiled=bundle)
    latest = mgr.latest_path()
    assert isinstance(latest, Path)
    return latest


def test_a_bundle_packs_and_unpacks_and_refuses_paths_outside_the_cache():
    data = pack(b"portable", {KERNEL: b"int x;"})
    assert unpack(data) == (b"portable", {KERNEL: b"int x;"})
    for name in ("../evil.so", "ab/../../evil.so", "/tmp/evil.so", "ab/evil.py"):
        with pytest.raises(CheckpointError, match="is not a kernel file"):
            unpack(pack(b"", {name: b"x"}))
    with pytest.raises(CheckpointError, match="not a stoker compiled-artifacts bundle"):
        unpack(b"\x80pickle")


def test_the_fingerprint_holds_versions_device_step_configuration_and_model_structure():
    fp = cache().fingerprint
    assert fp["torch"] == torch.__version__ and fp["device"] == "cpu" and fp["compile"] == "step"
    assert fp["capability"] == torch.backends.cpu.get_cpu_capability() and "triton" in fp
    assert cache().fingerprint == fp
    assert cache(precision="bf16").fingerprint["precision"] == "bf16"
    assert cache(torch.nn.Linear(2, 3)).fingerprint["model"] != fp["model"]
    assert cache(torch.nn.Sequential(torch.nn.Linear(2, 2))).fingerprint["model"] != fp["model"]
    assert (
        fingerprint(torch.nn.Linear(2, 2), compile_mode="module", precision="fp32", device=torch.device("cpu"))[
            "compile"
        ]
        == "module"
    )


def test_a_matching_bundle_is_installed_before_the_first_step(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cc = cache()
    ckpt = checkpoint_with(tmp_path, CompiledBundle(cc.fingerprint, pack(b"", {KERNEL: b"int x;"})))
    with caplog.at_level(logging.INFO, logger="stoker"):
        restored = cc.restore(ckpt)
    assert restored.source == "artifacts"
    assert (tmp_path / "inductor" / KERNEL).read_bytes() == b"int x;"
    assert "compiled artifacts loaded from" in caplog.text and "1 kernel files written" in caplog.text
    assert cc.bundle() is not None and cc.bundle().data == pack(b"", {KERNEL: b"int x;"})  # shared on


def test_on_an_object_store_the_bundle_is_read_checked_and_installed(s3_env, tmp_path, monkeypatch):
    from stoker import storage

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cc = cache()
    mgr = CheckpointManager("s3://bucket/compile-cache")
    mgr.save(
        1, {"w": torch.ones(1)}, {"global_step": 1}, compiled=CompiledBundle(cc.fingerprint, pack(b"", {KERNEL: b"k"}))
    )
    ckpt = mgr.latest_path()
    assert isinstance(ckpt, storage.UrlPath)
    assert cc.restore(ckpt).source == "artifacts" and (tmp_path / "inductor" / KERNEL).read_bytes() == b"k"


def test_a_bundle_of_another_fingerprint_is_one_log_line_and_a_fresh_compile(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    other = dict(cache().fingerprint, torch="2.12.0", precision="bf16")
    ckpt = checkpoint_with(tmp_path, CompiledBundle(other, pack(b"", {KERNEL: b"int x;"})))
    with caplog.at_level(logging.INFO, logger="stoker"):
        restored = cache().restore(ckpt)
    assert (restored.source, restored.reason) == ("fresh", "fingerprint differs")
    assert [r.getMessage() for r in caplog.records] == [
        f"compiled artifacts of {ckpt} not used: they were compiled for another torch '2.12.0' -> "
        f"{torch.__version__!r}, precision 'bf16' -> 'fp32'; compiling afresh"
    ]
    assert not (tmp_path / "inductor" / KERNEL).exists()


def test_a_corrupted_bundle_is_refused_by_its_sha256(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cc = cache()
    bundle = CompiledBundle(cc.fingerprint, pack(b"", {KERNEL: b"int x;"}))
    ckpt = checkpoint_with(tmp_path, bundle)
    path = tmp_path / "m" / COMPILED_DIR / bundle.name
    path.write_bytes(path.read_bytes().replace(b"int x;", b"int y;"))
    with caplog.at_level(logging.INFO, logger="stoker"):
        restored = cc.restore(ckpt)
    assert (restored.source, restored.reason) == ("fresh", "bundle refused")
    assert len(caplog.records) == 1 and "compiled artifacts refused:" in caplog.text and "sha256" in caplog.text
    assert not (tmp_path / "inductor" / KERNEL).exists()


def test_a_checkpoint_without_artifacts_compiles_afresh_silently(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path / "m")
    mgr.save(1, {"w": torch.ones(1)}, {"global_step": 1})
    with caplog.at_level(logging.INFO, logger="stoker"):
        restored = cache().restore(mgr.latest_path())
    assert (restored.source, restored.reason) == ("fresh", "no artifacts in the checkpoint") and not caplog.records


# ---------------------------------------------------------------- real compiles (slow)
SCRIPT = ROOT / "tests" / "helpers" / "scripts" / "compiled_script.py"


def run(model_dir: Path, steps: int, caches: Path) -> tuple[dict, str]:
    """Train the compiled tiny MLP in ``model_dir`` to ``steps`` in a process whose compiler caches
    are under ``caches`` (a fresh folder: a fresh machine); its counters and log."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}")
    for var, sub in (
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("TRITON_CACHE_DIR", "triton"),
        ("XDG_CACHE_HOME", "xdg"),
    ):
        env[var] = str(caches / sub)
    env["STOKER_CACHE_DIR"] = str(caches / "stoker")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(model_dir), str(steps)], env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    counters = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("fxgraph_cache_miss", "fxgraph_cache_hit", "autograd_cache_miss"):
        counters.setdefault(key, 0)  # torch's counters leave out what never happened
    return counters, out.stderr


def weights(model_dir: Path, step: int) -> bytes:
    return (model_dir / f"ckpt-{step}" / "model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # five compiles of the tiny MLP, each in a fresh process: minutes on 2 cores
def test_a_restart_on_a_fresh_machine_compiles_from_the_artifacts_bitwise(tmp_path):
    whole, first = tmp_path / "whole", tmp_path / "first"
    run(whole, 12, tmp_path / "c0")
    counters, log = run(first, 8, tmp_path / "c1")
    assert counters["fxgraph_cache_miss"] > 0 and "compiled artifacts saved" in log, (counters, log[-3000:])
    assert "time to full speed" in log and "first start" in log
    corrupted = tmp_path / "corrupted"
    subprocess.run(["cp", "-r", str(first), str(corrupted)], check=True)
    counters, log = run(first, 12, tmp_path / "c2")  # a fresh machine
    assert "compiled artifacts loaded from" in log and "compile" in log and "from artifacts" in log
    assert counters["fxgraph_cache_miss"] == 0 and counters["fxgraph_cache_hit"] > 0
    assert counters["autograd_cache_miss"] == 0
    assert len(list((first / COMPILED_DIR).iterdir())) == 1  # the restart's checkpoint shares the bundle
    assert weights(first, 12) == weights(whole, 12)
    (bundle,) = (corrupted / COMPILED_DIR).iterdir()
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 1
    bundle.write_bytes(bytes(data))
    counters, log = run(corrupted, 12, tmp_path / "c3")
    assert "compiled artifacts refused" in log and "fresh (bundle refused)" in log
    assert counters["fxgraph_cache_miss"] > 0
    assert weights(corrupted, 12) == weights(whole, 12)
