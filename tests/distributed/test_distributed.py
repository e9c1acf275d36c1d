"""Two real processes on CPU (gloo): replicated training equals one process, and survives crashes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, launch_replicas, popen, python_env

SCRIPT = SCRIPTS / "dist_script.py"


def launch(nproc: int, *args: str) -> list[subprocess.Popen[str]]:
    return launch_replicas(SCRIPT, nproc, *args)


def run(nproc: int, *args: str) -> list[tuple[int, str]]:
    return collect(launch(nproc, *args))


def collect(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    """Wait for launched replicas; assert that each exited 0."""
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        results.append((p.returncode, err))
    for code, err in results:
        assert code == 0, err
    return results


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("opt", ["sgd", pytest.param("momentum", marks=pytest.mark.slow)])
def test_replicated_equals_one_process_with_the_same_global_batch(tmp_path, opt):
    # independent runs, launched together: the one process mostly imports torch beside the two replicas
    one_process = launch(1, "--opt", opt, "--out", str(tmp_path / "one.json"))
    run(2, "--opt", opt, "--out", str(tmp_path / "two.json"))
    collect(one_process)
    one, two = load(tmp_path / "one.json"), load(tmp_path / "two.json")
    assert two["world_size"] == 2 and one["world_size"] == 1
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    np.testing.assert_allclose(two["thirds"], one["thirds"], rtol=1e-5)  # host_call, averaged over replicas
    np.testing.assert_allclose(one["thirds"], np.array(one["losses"]) / 3, rtol=1e-6)
    for k in one["weights"]:
        np.testing.assert_allclose(two["weights"][k], one["weights"][k], rtol=1e-5, atol=1e-6)
    # eval on 203 examples (ragged: 101 + 102 per replica, last batches padded and masked)
    assert two["metrics"]["accuracy"] == pytest.approx(one["metrics"]["accuracy"], abs=1e-12)
    assert two["metrics"]["loss"] == pytest.approx(one["metrics"]["loss"], rel=1e-5)
    # predict: every example once, in input order, on the chief
    assert len(two["predictions"]) == 203
    assert two["predictions"] == one["predictions"]


def test_replicated_resume_is_bitwise_and_one_process_can_resume(tmp_path):
    # One uninterrupted two-replica run to step 14: its ckpt-12 is the bitwise reference for the split
    # run, its step-14 weights the reference for the one-process resume (a run saves every 2 steps, so
    # it holds ckpt-12; it used to stop at 12 and be resumed to 14, one more launch proving nothing new).
    run(2, "--model_dir", str(tmp_path / "whole"), "--max_steps", "14", "--out", str(tmp_path / "two.json"))
    run(2, "--model_dir", str(tmp_path / "split"), "--max_steps", "6")
    run(2, "--model_dir", str(tmp_path / "split"), "--max_steps", "12", "--out", str(tmp_path / "split.json"))
    whole = (tmp_path / "whole" / "ckpt-12" / "model.safetensors").read_bytes()
    assert (tmp_path / "split" / "ckpt-12" / "model.safetensors").read_bytes() == whole
    assert sorted(p.name for p in (tmp_path / "whole" / "ckpt-12").iterdir()) == [
        "input-0.json",
        "input-1.json",
        "manifest.json",
        "model.safetensors",
        "train_state.pt",
    ]
    # the same checkpoint resumed by a single process: weights, optimizer and step carry over
    ((code, err),) = run(
        1, "--model_dir", str(tmp_path / "split"), "--max_steps", "14", "--out", str(tmp_path / "one.json")
    )
    assert "written by 2 replica(s) and this run has 1" in err
    assert "re-shard" not in err and "replaying" not in err  # the input position carried over
    assert load(tmp_path / "one.json")["world_size"] == 1
    # the input was re-sharded, not restarted: one process continues on the same examples
    one, two = load(tmp_path / "one.json"), load(tmp_path / "two.json")
    for k in two["weights"]:
        np.testing.assert_allclose(one["weights"][k], two["weights"][k], rtol=1e-5, atol=1e-6)


def test_kill_9_of_one_replica_names_it_and_rerun_resumes(tmp_path):
    model_dir = tmp_path / "run"
    procs = launch(2, "--model_dir", str(model_dir), "--max_steps", "400", "--sleep", "0.01", "--timeout", "30")
    deadline = time.monotonic() + 120
    while not (model_dir / "checkpoint.json").exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    time.sleep(0.5)
    started = time.monotonic()
    procs[1].send_signal(signal.SIGKILL)
    out, err = procs[0].communicate(timeout=90)
    procs[1].wait()
    assert procs[0].returncode not in (0, None)
    assert time.monotonic() - started < 60
    assert "replica 1 (silent for" in err and "stopped responding" in err, err[-2000:]
    index = json.loads((model_dir / "checkpoint.json").read_text())
    last = index["latest"]
    assert (model_dir / last / "input-1.json").exists()  # the index names only complete checkpoints
    run(2, "--model_dir", str(model_dir), "--max_steps", str(int(last.split("-")[1]) + 4))
    assert os.path.exists(model_dir / f"ckpt-{int(last.split('-')[1]) + 4}")


def test_a_stuck_replica_is_named_with_its_step_and_phase_and_every_replica_exits_within_seconds(tmp_path):
    # Replica 1 hangs in model_fn at its 10th step (loops of 2 steps: 4 loops timed before it);
    # replica 0 waits in that step's gradient all-reduce and must name it well before the 300 s
    # distributed_timeout: after min_seconds=3 (20 x a median step of ms is less) plus a heartbeat.
    # Then the stuck replica (still inside its 200 s step) ends too, from its heartbeat thread.
    args = ("--max_steps", "40", "--timeout", "300", "--hang", "1", "10", "200", "--stuck_min_seconds", "3")
    procs = launch(2, *args, "--model_dir", str(tmp_path / "m"))
    try:
        out, err = procs[0].communicate(timeout=150)
        named = time.monotonic()
        _, stuck_err = procs[1].communicate(timeout=30)
        stuck_exited = time.monotonic() - named
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 1, err[-3000:]
    assert "stuck replica: replica 1 last seen at step 10, in the input and model_fn" in err, err[-3000:]
    assert "replica 0 has waited" in err and "the backward pass (its gradient all-reduce) of step 10" in err
    waited = float(err.split("replica 0 has waited ")[1].split(" s")[0])
    assert 3 <= waited < 10  # named within seconds of the limit, not after distributed_timeout
    assert procs[1].returncode == 1, stuck_err[-3000:]
    assert "replica 1 stops with exit status 1: another replica named a stuck one (stuck replica: replica 1" in (
        stuck_err
    )
    assert stuck_exited < 5  # within a heartbeat or two of the naming, not after its 200 s step


@pytest.mark.slow
def test_under_torchrun_a_stuck_replica_ends_the_job_within_seconds_not_after_its_kill_timeout(tmp_path):
    # torchrun's agent SIGTERMs the workers left when one fails and SIGKILLs them 30 s later; the
    # stuck worker, inside a 200 s step, used to wait for that kill (its SIGTERM handler waits
    # for the step to end). Now it ends by itself once named, and the job with it.
    command = [
        PYTHON,
        *("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"),
        str(SCRIPT),
        *("--max_steps", "40", "--timeout", "300", "--hang", "1", "10", "200", "--stuck_min_seconds", "3"),
        *("--model_dir", str(tmp_path / "m")),  # with it, PreemptionHook's SIGTERM handler runs
    ]
    proc = popen(command, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    named: list[float] = []
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "stuck replica: replica 1 last seen at step 10" in line and not named:
                named.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = time.monotonic()
    reader.join(timeout=10)
    text = "".join(lines)
    assert named, text[-3000:]
    assert proc.returncode != 0
    assert "replica 1 stops with exit status 1: another replica named a stuck one" in text, text[-3000:]
    assert ended - named[0] < 15, text[-3000:]  # torchrun would have waited 30 s before its SIGKILL


def test_a_replica_slow_between_loops_is_not_taken_for_stuck(tmp_path):
    # A hook that takes 8 s on replica 1 only (past min_seconds=3): the work between loops is left
    # to distributed_timeout, so both replicas finish.
    run(2, "--max_steps", "16", "--timeout", "300", "--hook_sleep", "1", "10", "8", "--stuck_min_seconds", "3")


def test_sharded_equals_replicated_and_resumes_from_dcp(tmp_path):
    run(2, "--opt", "momentum", "--strategy", "replicated", "--out", str(tmp_path / "rep.json"))
    run(2, "--opt", "momentum", "--strategy", "sharded", "--model_dir", str(tmp_path / "sh"), "--max_steps", "6")
    run(
        2,
        "--opt",
        "momentum",
        "--strategy",
        "sharded",
        "--model_dir",
        str(tmp_path / "sh"),
        "--max_steps",
        "12",
        "--out",
        str(tmp_path / "sh.json"),
    )
    rep, sh = load(tmp_path / "rep.json"), load(tmp_path / "sh.json")
    np.testing.assert_allclose(sh["losses"], rep["losses"][6:], rtol=1e-5)
    for k in rep["weights"]:
        np.testing.assert_allclose(sh["weights"][k], rep["weights"][k], rtol=1e-5, atol=1e-6)
    assert sh["predictions"] == rep["predictions"]
    ckpt = tmp_path / "sh" / "ckpt-12"
    assert (ckpt / "dcp" / ".metadata").exists() and not (ckpt / "model.safetensors").exists()
    index = json.loads((tmp_path / "sh" / "checkpoint.json").read_text())
    assert any(f.startswith("dcp/") for f in index["checkpoints"][-1]["files"])
    # consolidated weights equal what the run ended with
    from stoker.distributed.sharded import consolidate

    full = consolidate(ckpt / "dcp")
    for k, v in full.items():
        np.testing.assert_allclose(v.numpy(), np.asarray(sh["weights"][k]), rtol=0, atol=0)
    # the command line writes the same consolidated weights as one safetensors file
    import subprocess as _sp

    import safetensors.torch

    out = _sp.run(
        [
            PYTHON,
            "-m",
            "stoker",
            "checkpoint",
            "consolidate",
            str(tmp_path / "sh"),
            "--out",
            str(tmp_path / "full.safetensors"),
        ],
        env=python_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    cli_full = safetensors.torch.load_file(str(tmp_path / "full.safetensors"))
    assert set(cli_full) == set(full) and all((cli_full[k] == full[k]).all() for k in full)
    # and one process resumes from the sharded checkpoint
    run(1, "--opt", "momentum", "--model_dir", str(tmp_path / "sh"), "--max_steps", "14")
    assert (tmp_path / "sh" / "ckpt-14" / "model.safetensors").exists()
