"""Elastic determinism with real processes (gloo): a run on 2 replicas, killed with SIGKILL, resumed
on 1 replica (with worker processes), killed again, resumed on 2, trains on the global batches of
an uninterrupted 2-replica run: the same example ids and the same augmented pixels, bitwise, step
by step, the steps a kill cut short included. (In one process: tests/data/test_elastic_keys.py.)"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.images import make_id_tree
from helpers.paths import SCRIPTS
from helpers.processes import launch_replicas

SCRIPT = SCRIPTS / "elastic_script.py"
STEPS = 14  # 7 epochs of 2 global batches of 8 (20 examples, 4 dropped per epoch)

# Replica rows of one step, as the script records them: (step, ids, pixels)
Rows = tuple[int, list[int], list[bytes]]


def launch(nproc: int, model_dir: Path, data: Path, records: Path, *args: str) -> list[subprocess.Popen[str]]:
    return launch_replicas(
        SCRIPT, nproc, "--model_dir", str(model_dir), "--data", str(data), "--records", str(records), *args
    )


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    errors = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        errors.append(err)
    return errors


def latest_step(model_dir: Path) -> int:
    try:
        return int(json.loads((model_dir / "checkpoint.json").read_text())["latest"].split("-")[-1])
    except (OSError, ValueError, KeyError):
        return 0  # not written yet, or caught mid-write


def kill_9_past(procs: list[subprocess.Popen[str]], model_dir: Path, step: int) -> None:
    """SIGKILL every process once a checkpoint at or past ``step`` is complete."""
    deadline = time.monotonic() + 240
    while latest_step(model_dir) < step:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            p.communicate()[1] for p in procs if p.poll() is not None
        ]
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.communicate()


def global_batches(records: Path, world: int) -> dict[int, tuple[list[int], list[bytes]]]:
    """Step -> the global batch one launch of ``world`` replicas trained there: replica ``r``'s rows
    are rows ``r, r + world, ...`` of it. A step recorded twice by one replica (trained again after
    a kill) must have been the same batch both times."""
    per_replica: list[dict[int, Rows]] = []
    for r in range(world):
        steps: dict[int, Rows] = {}
        for line in Path(f"{records}-r{r}.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows = (row["step"], row["ids"], [base64.b64decode(p) for p in row["pixels"]])
            assert steps.setdefault(row["step"], rows) == rows, f"step {row['step']} trained on two batches"
            steps[row["step"]] = rows
        per_replica.append(steps)
    out = {}
    for step in set.intersection(*(set(s) for s in per_replica)):
        ids, pixels = [0] * 8, [b""] * 8
        for r, steps in enumerate(per_replica):
            ids[r::world], pixels[r::world] = steps[step][1], steps[step][2]
        out[step] = (ids, pixels)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "mixed",
    [(), ("--mix", "batch"), ("--mix", "example")],  # stoker.data.mix of two readings of the tree
    ids=["one_source", "mix", "mix_per_example"],
)
def test_resumed_2_1_2_with_kill_9_trains_on_the_uninterrupted_global_batches(
    tmp_path: Path, mixed: tuple[str, ...]
) -> None:
    data = make_id_tree(tmp_path / "data", count=20)
    reference = launch(2, tmp_path / "whole", data, tmp_path / "whole", "--max_steps", str(STEPS), *mixed)
    elastic = tmp_path / "elastic"
    slow = ("--max_steps", str(STEPS), "--sleep", "0.15", *mixed)
    kill_9_past(launch(2, elastic, data, tmp_path / "a", *slow), elastic, 4)
    workers = () if "example" in mixed else ("--workers", "2")  # an example-wise blend is built inline
    kill_9_past(launch(1, elastic, data, tmp_path / "b", *slow, *workers), elastic, 8)
    errors = finish(launch(2, elastic, data, tmp_path / "c", "--max_steps", str(STEPS), *mixed))
    assert "written by 1 replica(s) and this run has 2" in errors[0]
    finish(reference)

    whole = global_batches(tmp_path / "whole", 2)
    assert sorted(whole) == list(range(1, STEPS + 1))
    assert len({i for ids, _ in whole.values() for i in ids}) == 20  # shuffled epochs: every example, in turn
    launches = [global_batches(tmp_path / "a", 2), global_batches(tmp_path / "b", 1), global_batches(tmp_path / "c", 2)]
    assert 1 < min(launches[1]) < min(launches[2])  # each resumed from a checkpoint, none started over
    assert set().union(*launches) == set(whole)  # together they trained every step
    for trained in launches:
        for step, batch in trained.items():
            assert batch == whole[step], f"step {step}: another global batch than the uninterrupted run's"
    first = np.frombuffer(whole[1][1][0], dtype=np.float32).reshape(3, 12, 12)
    assert first.std() > 0.1  # the pixels are the augmented image (noise), not a flat colour
