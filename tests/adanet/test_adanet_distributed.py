"""An AdaNet search on two real replicas (gloo, CPU): the replicas agree on every choice and
on the final ensemble, and a search stopped mid-iteration resumes to bitwise the same result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS
from helpers.processes import launch_replicas

SCRIPT = SCRIPTS / "adanet_script.py"
FINAL_STEP = 72  # 3 iterations of 24 steps (helpers.adanet.make_search)


def run_replicas(model_dir: Path, *args: str, nproc: int = 2) -> None:
    procs = launch_replicas(SCRIPT, nproc, "--model_dir", str(model_dir), *args)
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err


def results(out: Path, nproc: int = 2) -> list[dict]:
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(nproc)]


@pytest.mark.slow  # default run under 5 minutes on 2 cores; the fast tests of this area cover the same code
def test_two_replicas_agree_and_resume_bitwise(tmp_path):
    run_replicas(tmp_path / "whole", "--out", str(tmp_path / "whole.json"))
    whole = results(tmp_path / "whole.json")
    arch = json.loads(whole[0]["architecture"])
    assert arch["global_step"] == FINAL_STEP and len(arch["replay_indices"]) == 3
    # every replica made the same choices and holds the same final ensemble and evaluation
    assert whole[0]["architecture"] == whole[1]["architecture"]
    assert whole[0]["final_weights_sha256"] == whole[1]["final_weights_sha256"]
    assert whole[0]["eval"] == whole[1]["eval"] and whole[0]["selections"] == whole[1]["selections"]
    # stopped in the middle of iteration 1, then resumed by a second launch: the same result
    run_replicas(tmp_path / "split", "--max_steps", "36")
    assert json.loads((tmp_path / "split" / "architecture-0.json").read_text())["global_step"] == 24
    assert not (tmp_path / "split" / "architecture-1.json").exists()
    run_replicas(tmp_path / "split", "--out", str(tmp_path / "split.json"))
    split = results(tmp_path / "split.json")
    assert split[0]["architecture"] == whole[0]["architecture"]
    assert split[0]["final_weights_sha256"] == whole[0]["final_weights_sha256"]
    assert split[0]["selections"] == whole[0]["selections"]
