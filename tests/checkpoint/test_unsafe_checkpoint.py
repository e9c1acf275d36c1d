"""Checkpoint files that a safe decoder refuses raise CorruptCheckpointError, never a raw error.

Each test plants a hostile or malformed file *and updates its sha256 in the index*, so the
hash check passes and only the decoder stands between the file and the process.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.checkpoint import CheckpointManager, load_checkpoint, warm_start
from stoker.checkpoint.safe_load import load_dcp_metadata
from stoker.errors import CorruptCheckpointError


class _Touch:
    """Unpickling this creates ``path``: proof that code from the file ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def _plant(model_dir: Path, ckpt: str, fname: str, data: bytes) -> None:
    """A hostile file whose sha256 the index and the checkpoint's manifest both carry: only the
    decoder stands between it and the unpickler."""
    (model_dir / ckpt / fname).write_bytes(data)
    index_path = model_dir / "checkpoint.json"
    index = json.loads(index_path.read_text())
    rec = next(r for r in index["checkpoints"] if r["name"] == ckpt)
    rec["files"][fname] = hashlib.sha256(data).hexdigest()
    index_path.write_text(json.dumps(index))
    manifest_path = model_dir / ckpt / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][fname] = {"bytes": len(data), "sha256": rec["files"][fname]}
    manifest_path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run")
    x, y = make_data(64)
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(x, y), max_steps=8)
    return model_dir, x, y


@pytest.mark.parametrize("fname", ["train_state.pt", "model.safetensors", "input-0.json"])
def test_refused_file_names_file_and_previous_checkpoint(trained, tmp_path, fname):
    src, x, y = trained
    model_dir = tmp_path / "run"
    shutil.copytree(src, model_dir)
    marker = tmp_path / "code-ran"
    hostile = {"optimizer": _Touch(marker)}
    if fname.endswith(".pt"):  # a real torch.save file, as a hostile writer would make it
        buf = io.BytesIO()
        torch.save(hostile, buf)
        data = buf.getvalue()
    else:
        data = pickle.dumps(hostile)
    _plant(model_dir, "ckpt-8", fname, data)
    with pytest.raises(
        CorruptCheckpointError, match=rf"ckpt-8.*{fname}.*previous retained checkpoint is .*ckpt-4"
    ) as info:
        make_estimator(model_dir).train(train_input(x, y), max_steps=12)
    assert not marker.exists()
    assert "Traceback" not in str(info.value)
    # the offered checkpoint still loads
    assert (
        make_estimator(model_dir).evaluate(eval_input(x, y), checkpoint_path=model_dir / "ckpt-4")["global_step"] == 4
    )


def test_dcp_metadata_is_vetted_before_torch_unpickles_it(tmp_path):
    import torch.distributed.checkpoint as dcp

    manager = CheckpointManager(tmp_path)
    model = torch.nn.Linear(3, 2)
    for step in (4, 8):
        tmp = manager.begin(step)
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp / "dcp"), no_dist=True)
        manager.save(step, None, {"global_step": step}, {0: {"skip": step}}, tmp_dir=tmp)
    loaded = load_checkpoint(tmp_path / "ckpt-8")  # genuine metadata passes
    assert loaded.dcp_dir == tmp_path / "ckpt-8" / "dcp" and loaded.step == 8
    genuine = (tmp_path / "ckpt-8" / "dcp" / ".metadata").read_bytes()
    assert type(load_dcp_metadata(genuine)).__name__ == "Metadata"
    marker = tmp_path / "code-ran"
    _plant(tmp_path, "ckpt-8", "dcp/.metadata", pickle.dumps(_Touch(marker)))
    with pytest.raises(
        CorruptCheckpointError, match=r"ckpt-8.*dcp/.metadata.*pathlib.*previous retained checkpoint is .*ckpt-4"
    ):
        load_checkpoint(tmp_path / "ckpt-8")
    assert not marker.exists()


def test_warm_start_from_a_refused_safetensors_file(tmp_path):
    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CorruptCheckpointError, match=r"w.safetensors"):
        warm_start(torch.nn.Linear(3, 2), bad)
