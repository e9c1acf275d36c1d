"""image_folder with worker processes under the Estimator: kill -9 and resume, bitwise."""

from __future__ import annotations

import json
import random
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest
import torch

from helpers.images import input_fn, make_estimator, make_image_tree
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, popen, python_env, run_process
from helpers.tiny import state_equal

SCRIPT = SCRIPTS / "data_train_script.py"
MAX_STEPS = 40  # 60 images in batches of 8: 7 batches per epoch, so the runs cross 5 epoch boundaries


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("tree"), classes=3, per_class=20, size=16)


def command(model_dir: Path, data: Path, *extra: str) -> list[str]:
    return [
        PYTHON,
        str(SCRIPT),
        "--model_dir",
        str(model_dir),
        "--data",
        str(data),
        "--max_steps",
        str(MAX_STEPS),
        *extra,
    ]


def run_to_end(model_dir: Path, data: Path) -> subprocess.CompletedProcess[str]:
    return run_process(command(model_dir, data), env=python_env(), capture_output=True, text=True, timeout=300)


def final_weights(model_dir: Path) -> tuple[dict, bytes]:
    """The safetensors header (parsed) and the raw tensor bytes of the final checkpoint.

    Not the file's bytes: safetensors writes the ``__metadata__`` entries in a per-process
    random (hash map) order, so two identical checkpoints can differ in their header text.
    """
    raw = (model_dir / f"ckpt-{MAX_STEPS}" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def test_kill_9_with_image_workers_then_rerun_is_bitwise_equal(tmp_path: Path, tree: Path) -> None:
    ref = in_background(command(tmp_path / "ref", tree))  # trains while the run below is slowed and killed
    crashed = tmp_path / "crashed"
    proc = popen(
        command(crashed, tree, "--sleep", "0.03"),
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (crashed / "checkpoint.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    delay = random.uniform(0.0, 0.5)
    time.sleep(delay)
    proc.kill()  # SIGKILL: no handler runs; the workers are orphaned and exit on their own
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (crashed / f"ckpt-{MAX_STEPS}").exists(), "the run finished before the kill; slow it down"
    done = run_to_end(crashed, tree)
    assert done.returncode == 0, done.stderr
    assert f"resumed from {crashed}" in done.stderr
    finished(ref)
    assert final_weights(crashed) == final_weights(tmp_path / "ref"), f"killed {delay:.2f}s after the first checkpoint"


def test_estimator_resumes_image_folder_with_workers_exactly(tmp_path: Path, tree: Path) -> None:
    whole = make_estimator(tmp_path / "whole")
    whole.train(input_fn(tree, num_workers=2), max_steps=16)
    first = make_estimator(tmp_path / "split")
    first.train(input_fn(tree, num_workers=2), max_steps=8)
    second = make_estimator(tmp_path / "split")  # a new process would build a new one
    second.train(input_fn(tree, num_workers=2), max_steps=16)
    assert whole.global_step == second.global_step == 16
    assert state_equal(whole.model, second.model)
    # and the same as without workers
    plain = make_estimator(tmp_path / "plain")
    plain.train(input_fn(tree, num_workers=0), max_steps=16)
    assert state_equal(whole.model, plain.model)


def test_estimator_evaluates_image_folder_with_workers(tmp_path: Path, tree: Path) -> None:
    import stoker

    est = make_estimator(tmp_path)
    est.train(input_fn(tree, num_workers=0), max_steps=4)
    results = []
    for workers in (0, 2):
        results.append(
            est.evaluate(
                lambda p, w=workers: stoker.data.image_folder(
                    tree,
                    read=stoker.data.ReadOptions(num_workers=w).for_replica(p),
                    image=stoker.data.ImageOptions(image_size=16),
                    train=False,
                )
            )
        )
    assert results[0] == results[1]
    assert 0.0 <= results[0]["accuracy"] <= 1.0 and torch.isfinite(torch.tensor(results[0]["loss"]))
