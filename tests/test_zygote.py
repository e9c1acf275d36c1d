"""The tests' forked processes (helpers.zygote) look to the program they run like a fresh interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import zygote
from helpers.paths import ROOT
from helpers.processes import PYTHON, popen, python_env, run_process

pytestmark = pytest.mark.skipif(not zygote.enabled(), reason="the zygote is off (STOKER_TEST_FORK=0) or cannot fork")

PROBE = """\
import json, os, random, sys
import numpy as np
print(json.dumps({
    "argv": sys.argv, "path": sys.path[:4], "cwd": os.getcwd(), "name": __name__,
    "file": globals().get("__file__"), "rank": os.environ.get("RANK"), "torch": "torch" in sys.modules,
    "random": random.random(), "np_random": float(np.random.rand()), "hash": hash("stoker"),
}))
"""


def _probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe" / "probe.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(PROBE)
    return script


def _both(argv: list[str], **kwargs) -> tuple[dict, dict, str]:
    """The probe's report as a forked child and as a fresh interpreter, and the forked one's kind."""
    forked = popen([PYTHON, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    kind = type(forked).__name__
    out, err = forked.communicate(timeout=60)
    assert forked.returncode == 0, err
    fresh = subprocess.run([PYTHON, *argv], capture_output=True, text=True, timeout=60, **kwargs)
    assert fresh.returncode == 0, fresh.stderr
    return json.loads(out), json.loads(fresh.stdout), kind


@pytest.mark.parametrize("form", ["script", "code", "module"])
def test_a_forked_child_sees_what_a_fresh_interpreter_sees(tmp_path: Path, form: str) -> None:
    script = _probe(tmp_path)
    env = {**python_env(), "RANK": "3"}
    if form == "script":
        argv, cwd = [str(script), "a", "b"], ROOT
    elif form == "code":
        argv, cwd = ["-c", PROBE, "a", "b"], tmp_path
    else:
        env["PYTHONPATH"] = f"{script.parent}{os.pathsep}{env['PYTHONPATH']}"
        argv, cwd = ["-m", "probe", "a", "b"], tmp_path
    forked, fresh, kind = _both(argv, env=env, cwd=cwd)
    assert kind == "ForkedProcess"
    assert forked["torch"] and not fresh["torch"]  # the one difference: torch is imported already
    for key in ("argv", "path", "cwd", "name", "file", "rank"):
        assert forked[key] == fresh[key], key


def test_children_one_after_the_other_draw_different_numbers_and_hash_strings_differently(tmp_path: Path) -> None:
    script = _probe(tmp_path)
    reports = [
        json.loads(run_process([PYTHON, str(script)], env=python_env(), capture_output=True, text=True).stdout)
        for _ in range(2)
    ]
    assert reports[0]["random"] != reports[1]["random"]
    assert reports[0]["np_random"] != reports[1]["np_random"]
    assert reports[0]["hash"] != reports[1]["hash"]  # two zygotes in turn: replicas hash as fresh interpreters do


def test_exit_codes_tracebacks_and_atexit() -> None:
    env = python_env()
    done = run_process([PYTHON, "-c", "import sys; sys.exit(3)"], env=env, capture_output=True, text=True)
    assert done.returncode == 3
    done = run_process([PYTHON, "-c", "import sys; sys.exit('bad flag')"], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (1, "bad flag\n")
    done = run_process([PYTHON, "-c", "raise ValueError('boom')"], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [  # no frame of the zygote's own
        "Traceback (most recent call last):",
        '  File "<string>", line 1, in <module>',
        "ValueError: boom",
    ]
    code = "import atexit, sys; atexit.register(print, 'bye'); print('hi', flush=True); sys.exit(0)"
    done = run_process([PYTHON, "-c", code], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "hi\nbye\n")


def test_a_child_that_cannot_start_exits_1_and_the_zygote_serves_on(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    done = run_process([PYTHON, "-c", "pass"], env=python_env(), cwd=missing, capture_output=True, text=True)
    assert done.returncode == 1 and "FileNotFoundError" in done.stderr and str(missing) in done.stderr
    for _ in range(zygote.ZYGOTES):  # each zygote still forks
        assert run_process([PYTHON, "-c", "print(1)"], env=python_env(), capture_output=True, text=True).stdout == "1\n"


def test_a_zygote_that_died_is_replaced() -> None:
    run_process([PYTHON, "-c", "pass"], env=python_env())  # both zygotes started
    run_process([PYTHON, "-c", "pass"], env=python_env())
    for z in zygote._zygotes:
        z.proc.kill()
        z.proc.wait()
    for _ in range(zygote.ZYGOTES):
        assert run_process([PYTHON, "-c", "print(2)"], env=python_env(), capture_output=True, text=True).stdout == "2\n"


def test_kill_9_ends_a_real_process(tmp_path: Path) -> None:
    proc = popen(
        [PYTHON, "-c", "import time; print('up', flush=True); time.sleep(60)"], env=python_env(), stdout=subprocess.PIPE
    )
    assert type(proc).__name__ == "ForkedProcess"
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert proc.poll() is None and Path(f"/proc/{proc.pid}").exists()
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}").exists() and time.monotonic() < deadline:  # reaped by the zygote
        time.sleep(0.01)
    assert not Path(f"/proc/{proc.pid}").exists()
    with pytest.raises(subprocess.TimeoutExpired):
        popen([PYTHON, "-c", "import time; time.sleep(60)"], env=python_env()).wait(timeout=0.2)


def test_output_to_files_devnull_and_merged(tmp_path: Path) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        assert popen([PYTHON, "-c", code], env=python_env(), stdout=out, stderr=err).wait(30) == 0
    assert (tmp_path / "out").read_text() == "out\n" and (tmp_path / "err").read_text() == "err\n"
    proc = popen([PYTHON, "-c", code], env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out_text, _ = proc.communicate(timeout=30)
    assert sorted(out_text.split()) == ["err", "out"]
    proc = popen([PYTHON, "-c", code], env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.communicate(timeout=30) == (None, "err\n")


def _kind(argv: list[str], **kwargs) -> str:
    proc = popen(argv, **kwargs)
    proc.wait(timeout=60)
    return type(proc).__name__


def test_what_a_fork_cannot_mean_runs_in_a_fresh_interpreter() -> None:
    env = python_env()
    # an interpreter option, settings read while torch or the interpreter starts, data on stdin, not Python
    assert _kind([PYTHON, "-X", "utf8", "-c", "pass"], env=env) == "Popen"
    assert _kind([PYTHON, "-c", "pass"], env={**env, "OMP_NUM_THREADS": "2"}) == "Popen"
    assert _kind([PYTHON, "-c", "pass"], env={**env, "PYTHONHASHSEED": "0"}) == "Popen"
    assert _kind([PYTHON, "-c", "pass"], env=env, stdin=subprocess.PIPE) == "Popen"
    assert _kind(["true"], env=env) == "Popen"
    assert _kind([PYTHON, "-c", "pass"], env={**env, "STOKER_X": "1"}) == "ForkedProcess"


def test_a_hash_seed_in_the_tests_environment_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    # The zygotes drop PYTHONHASHSEED (each picks its own), so a run asked to use one gets a fresh interpreter.
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    code = "print(hash('stoker'))"
    proc = popen([PYTHON, "-c", code], env=python_env(), stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert type(proc).__name__ == "Popen"
    assert out == subprocess.run([PYTHON, "-c", code], env=python_env(), capture_output=True, text=True).stdout


def test_a_child_starts_processes_of_its_own() -> None:
    code = (
        "import subprocess, sys; "
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())"
    )
    done = run_process([PYTHON, "-c", code], env=python_env(), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "42\n")
    assert sys.executable == PYTHON
