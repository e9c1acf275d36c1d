"""Real runs of tests/helpers/scripts/callbacks_script.py for the callback tests: to the end, and
killed with SIGKILL at random moments (not a test module)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, popen, python_env, run_process

SCRIPT = SCRIPTS / "callbacks_script.py"


def command(model_dir: Path, *extra: str) -> list[str]:
    return [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), *extra]


def run_to_end(model_dir: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """Run the script to its end; its printed result and its log."""
    done = run_process(command(model_dir, *extra), env=env or python_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def latest_step(model_dir: Path) -> int:
    try:
        index = json.loads((model_dir / "checkpoint.json").read_text())
    except (OSError, ValueError):
        return -1
    return next((r["step"] for r in index["checkpoints"] if r["name"] == index["latest"]), -1)


def kill_at_random_moments(
    model_dir: Path, *extra: str, times: int = 2, seed: int = 0, env: dict[str, str] | None = None
) -> list[int]:
    """Start the script ``times`` times (slowed), each killed with SIGKILL a random moment after
    it wrote a new checkpoint (the second time inside a slowed checkpoint write); the steps of
    the newest checkpoint after each kill."""
    rng = random.Random(seed)
    after = []
    for i in range(times):
        slow_write = "0.3" if i % 2 else "0"
        proc = popen(
            command(model_dir, *extra, "--sleep", "0.03", "--slow_write", slow_write),
            env=env or python_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        before, deadline = latest_step(model_dir), time.monotonic() + 120
        while latest_step(model_dir) == before:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no new checkpoint"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        after.append(latest_step(model_dir))
    return after
