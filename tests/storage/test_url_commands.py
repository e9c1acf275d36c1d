"""``stoker inspect`` and ``stoker checkpoint consolidate`` on a model_dir that is an fsspec URL
(memory://, in process): the same answers as on a local directory."""

from __future__ import annotations

import json
import uuid

import fsspec
import safetensors.torch
import torch

from helpers.tiny import make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointManager
from stoker.cli import main as stoker_cli
from stoker.summary.inspect import inspect_run


def _url() -> str:
    return f"memory://cmds/{uuid.uuid4().hex[:8]}"


def test_inspect_a_url_model_dir_equals_the_local_one(tmp_path, capsys):
    x, y = make_data(64)
    url = _url()
    for where in (tmp_path, url):
        make_estimator(where, save_checkpoints_steps=4, keep_checkpoint_max=2, log_every_n_steps=2).train(
            train_input(x, y), max_steps=8
        )
    local, remote = inspect_run(tmp_path), inspect_run(url)
    assert remote["model_dir"] == url
    assert [(c["name"], c["step"], c["latest"], c["present"]) for c in remote["checkpoints"]] == [
        ("ckpt-4", 4, False, True),
        ("ckpt-8", 8, True, True),
    ]
    assert [c["bytes"] for c in remote["checkpoints"]] == [c["bytes"] for c in local["checkpoints"]]
    assert remote["metrics"].keys() == local["metrics"].keys() and "loss" in remote["metrics"]
    assert remote["metrics"]["loss"]["value"] == local["metrics"]["loss"]["value"]
    assert stoker_cli(["inspect", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latest"] == "ckpt-8"
    assert stoker_cli(["inspect", _url()]) == 1  # nothing there
    assert "is not a directory" in capsys.readouterr().err


def test_consolidate_a_sharded_checkpoint_on_a_url(tmp_path, capsys):
    import torch.distributed.checkpoint as dcp

    url = _url()
    m = CheckpointManager(url)
    model = torch.nn.Linear(3, 2)
    prefix = m.begin(4)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(prefix / "dcp"), no_dist=True)
    path = m.save(4, None, {"global_step": 4}, tmp_dir=prefix)
    assert stoker_cli(["checkpoint", "consolidate", url]) == 0
    assert f"wrote {path}/model.safetensors (2 tensors, 8 values)" in capsys.readouterr().out
    data = fsspec.filesystem("memory").cat_file(str(path / "model.safetensors").removeprefix("memory:/"))
    weights = safetensors.torch.load(data)
    assert torch.equal(weights["weight"], model.weight.detach()) and torch.equal(weights["bias"], model.bias.detach())
    assert not storage.exists(path / "model.safetensors.tmp")
    # --out to a local file and to another URL: the same bytes
    assert stoker_cli(["checkpoint", "consolidate", url, "--out", str(tmp_path / "w.safetensors")]) == 0
    other = _url() + "/w.safetensors"
    assert stoker_cli(["checkpoint", "consolidate", str(path), "--out", other]) == 0
    assert (tmp_path / "w.safetensors").read_bytes() == data == storage.read_bytes(storage.location(other))
