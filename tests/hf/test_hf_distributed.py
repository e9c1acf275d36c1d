"""stoker.hf on two real processes (gloo): DDP and FSDP2 train the tiny transformers classifier as one
process does, and a sharded (dcp/) checkpoint is written as a save_pretrained folder, collectively at
the end of the run and afterwards from the checkpoint alone."""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import numpy as np  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForSequenceClassification  # noqa: E402

import stoker.hf as hf  # noqa: E402
from helpers import hf as tiny  # noqa: E402
from helpers.paths import SCRIPTS  # noqa: E402
from helpers.processes import launch_replicas  # noqa: E402

SCRIPT = SCRIPTS / "hf_script.py"


def collect(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]


def assert_same_run(two: dict, one: dict) -> None:
    assert two["world_size"] == 2 and one["world_size"] == 1
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    for k in one["weights"]:
        np.testing.assert_allclose(two["weights"][k], one["weights"][k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two["predictions"], one["predictions"], rtol=1e-5, atol=1e-6)
    assert two["evaluation"]["accuracy"] == one["evaluation"]["accuracy"]  # 48 examples, each counted once
    assert two["evaluation"]["loss"] == pytest.approx(one["evaluation"]["loss"], rel=1e-5)


def beside_one_process(tmp_path, *args: str) -> tuple[dict, dict]:
    """Two replicas run with ``args`` and, beside them, one process with the same global batch:
    what each wrote (``two.json``, ``one.json``)."""
    one = launch_replicas(SCRIPT, 1, "--out", str(tmp_path / "one.json"))
    collect(launch_replicas(SCRIPT, 2, *args, "--out", str(tmp_path / "two.json")))
    collect(one)
    return json.loads((tmp_path / "two.json").read_text()), json.loads((tmp_path / "one.json").read_text())


@pytest.mark.slow  # default run under 5 minutes on 2 cores; the fast tests of this area cover the same code
def test_sharded_training_equals_one_process_and_its_dcp_checkpoint_saves_as_hf(tmp_path):
    model_dir = tmp_path / "run"
    two, one = beside_one_process(
        tmp_path, "--strategy", "sharded", "--model_dir", str(model_dir), "--hf_out", str(tmp_path / "hf")
    )
    assert_same_run(two, one)
    assert (model_dir / "ckpt-6" / "dcp" / ".metadata").exists() and not (
        model_dir / "ckpt-6" / "model.safetensors"
    ).exists()
    # the folder both replicas wrote at the end, and one written afterwards from the dcp/ checkpoint alone
    later = hf.save_pretrained(tiny.classifier(model_dir), tmp_path / "later", checkpoint_path=model_dir / "ckpt-6")
    at_end = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    afterwards = safetensors.torch.load_file(later / "model.safetensors")
    assert at_end.keys() == afterwards.keys() and all(torch.equal(at_end[k], afterwards[k]) for k in at_end)
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    features = tiny.tokenizer()(
        list(tiny.dataset(48)["text"]), padding="max_length", max_length=12, truncation=True, return_tensors="pt"
    )
    with torch.no_grad():
        np.testing.assert_allclose(loaded(**features).logits.numpy(), np.array(two["predictions"]), rtol=0, atol=1e-6)


@pytest.mark.slow  # two more processes importing transformers: about 40 s on 2 busy cores
def test_replicated_training_equals_one_process(tmp_path):
    assert_same_run(*beside_one_process(tmp_path, "--strategy", "replicated"))
