"""Export: torch.export program + safetensors + signature, equal to predict, dynamic batch."""

from __future__ import annotations

import argparse
import json
import subprocess

import numpy as np
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

import stoker
from helpers.processes import PYTHON
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.export import (
    ExportError,
    export,
    load_exported,
    onnx_available,
)
from stoker.export.cli import add_parser
from stoker.run_spec import read_run_spec, write_run_spec


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A TinyNet trained 12 steps with an evaluation every 4: ckpt-4, -8, -12, one of them best."""
    model_dir = tmp_path_factory.mktemp("run")
    x, y = make_data(64)
    est = make_estimator(model_dir, keep_best=("accuracy", "max"), keep_checkpoint_max=0)
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=12, eval_every_n_steps=4)
    return est, model_dir, x


def predict_rows(est: stoker.Estimator, x: torch.Tensor, checkpoint: str) -> dict[str, torch.Tensor]:
    batches = list(est.predict(eval_input(x), checkpoint_path=checkpoint, yield_single_examples=False))
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def test_round_trip_equals_predict_for_1_and_7_rows_and_writes_a_correct_signature(trained, tmp_path):
    est, model_dir, x = trained
    out = export(est, tmp_path / "exp", x[:5])
    assert sorted(p.name for p in out.iterdir()) == ["model.pt2", "model.safetensors", "signature.json"]
    sig = json.loads((out / "signature.json").read_text())
    best = json.loads((model_dir / "checkpoint.json").read_text())["best"]
    assert sig["checkpoint"] == str(model_dir / best["name"]) and sig["checkpoint_choice"].startswith(
        "best by accuracy"
    )
    assert sig["global_step"] == best["step"]
    assert sig["inputs"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 8]}]
    assert sig["outputs"] == [
        {"name": "logits", "dtype": "float32", "shape": ["batch", 3]},
        {"name": "classes", "dtype": "int64", "shape": ["batch"]},
    ]
    assert sig["dynamic_batch"] is True
    assert sig["stoker_version"] == stoker.__version__ and sig["torch_version"] == torch.__version__
    program = torch.export.load(str(out / "model.pt2")).module()
    for rows in (1, 7):
        expected = predict_rows(est, x[:rows], sig["checkpoint"])
        got = program(x[:rows])
        assert got["logits"].shape == (rows, 3)
        torch.testing.assert_close(got["logits"], expected["logits"], rtol=1e-5, atol=1e-6)
        assert torch.equal(got["classes"], expected["classes"])
    # the weights file holds the exported checkpoint's tensors
    weights = safetensors.torch.load_file(str(out / "model.safetensors"))
    ckpt = safetensors.torch.load_file(str(model_dir / best["name"] / "model.safetensors"))
    assert weights.keys() == ckpt.keys() and all(torch.equal(weights[k], ckpt[k]) for k in ckpt)


def test_the_program_loads_with_torch_alone_in_a_fresh_process(trained, tmp_path):
    est, _, x = trained
    out = export(est, tmp_path / "exp", x[:1])  # an example of one row still exports a dynamic batch
    code = (
        "import sys, torch\n"
        "m = torch.export.load(sys.argv[1]).module()\n"
        "out = m(torch.zeros(7, 8))\n"
        "assert 'stoker' not in sys.modules\n"
        "print(sorted(out), list(out['logits'].shape))\n"
    )
    done = subprocess.run([PYTHON, "-c", code, str(out / "model.pt2")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['classes', 'logits'] [7, 3]"


def test_latest_when_no_best_and_static_batch(tmp_path):
    x, y = make_data(32)
    est = make_estimator(tmp_path / "run")
    est.train(train_input(x, y), max_steps=8)
    out = export(est, tmp_path / "exp", x[:4], dynamic_batch=False)
    sig = json.loads((out / "signature.json").read_text())
    assert sig["checkpoint_choice"] == "latest" and sig["global_step"] == 8
    assert sig["inputs"][0]["shape"] == [4, 8] and sig["dynamic_batch"] is False
    program = load_exported(out)
    assert program({"features": x[:4]})["logits"].shape == (4, 3)
    with pytest.raises(Exception):  # noqa: B017 - torch raises its own guard error for another batch
        program({"features": x[:5]})


def test_dict_features_in_memory_estimator_and_replacing_an_export(tmp_path):
    def model_fn(model, features, labels, mode, params):
        logits = model(features["a"] + features["b"])
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return stoker.EstimatorSpec(loss=loss, predictions={"p": logits.softmax(-1)})

    from helpers.tiny import TinyNet

    est = stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(progress_bar=False),
        train_batch_size=8,
    )
    x, y = make_data(16)
    est.train(
        lambda p: stoker.data.arrays({"a": x, "b": x * 2}, y, read=stoker.data.ReadOptions().for_replica(p)),
        max_steps=2,
    )
    example = {"a": x[:3], "b": x[3:6]}
    out = export(est, tmp_path / "exp", example)
    again = export(est, tmp_path / "exp", example)  # an earlier export is replaced
    assert again == out
    sig = json.loads((out / "signature.json").read_text())
    assert [i["name"] for i in sig["inputs"]] == ["a", "b"] and sig["checkpoint_choice"] == "memory"
    got = load_exported(out)({"a": x[:2], "b": x[2:4]})["p"]
    with torch.no_grad():
        want = est.model.eval()(x[:2] + x[2:4]).softmax(-1)
    torch.testing.assert_close(got, want)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not an earlier export"):
        export(est, tmp_path / "other", example)


@pytest.mark.skipif(
    onnx_available(), reason="onnx and onnxscript are installed: the missing-package message cannot be shown"
)
def test_onnx_without_the_packages_says_what_to_install_and_writes_nothing(trained, tmp_path):
    est, _, x = trained
    with pytest.raises(ExportError, match="pip install onnx onnxscript"):
        export(est, tmp_path / "exp", x[:2], formats=("pt2", "onnx"))
    assert not (tmp_path / "exp").exists()


def test_onnx_export_when_installed(trained, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    est, _, x = trained
    out = export(est, tmp_path / "exp", x[:2], formats=("pt2", "onnx"))
    assert (out / "model.onnx").stat().st_size > 0
    assert "model.onnx" in json.loads((out / "signature.json").read_text())["files"]
    ort = pytest.importorskip("onnxruntime")  # the file runs, any batch size, with the exported program's outputs
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    program = load_exported(out)
    for rows in (1, 7):
        (name,) = [i.name for i in session.get_inputs()]
        got = session.run(None, {name: x[:rows].numpy()})
        want = program({"features": x[:rows]})
        assert len(got) == len(want)
        for g, w in zip(got, want.values(), strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stoker")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_exports_a_zoo_model_dir_from_its_run_spec(tmp_path, capsys):
    from stoker.models import create_model

    def model_fn(model, features, labels, mode, params):
        logits = model(features)
        return stoker.EstimatorSpec(loss=F.cross_entropy(logits, labels), predictions={"classes": logits.argmax(-1)})

    model_dir = tmp_path / "zoo"
    est = stoker.Estimator(
        model=lambda p: create_model("trivial", dataset="cifar10"),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.01),
        config=stoker.RunConfig(model_dir=model_dir, progress_bar=False),
        train_batch_size=4,
    )
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    est.train(lambda p: stoker.data.arrays(images, labels, read=stoker.data.ReadOptions().for_replica(p)), max_steps=2)
    write_run_spec(model_dir, kind="zoo", model="trivial", dataset="cifar10")
    assert read_run_spec(model_dir)["model"] == "trivial"

    assert _cli(["export", str(model_dir), "--out", str(tmp_path / "exp")]) == 0
    assert "input  features: float32['batch', 3, 32, 32]" in capsys.readouterr().out
    program = load_exported(tmp_path / "exp")
    out = program({"features": images[:3]})
    with torch.no_grad():
        want = est.model.eval()(images[:3])
    torch.testing.assert_close(out["logits"], want, rtol=1e-5, atol=1e-5)

    assert _cli(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 1  # no run_spec.json
    assert "run_spec.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        _cli(["export", str(model_dir)])  # --out missing: argparse's usage error
    assert usage.value.code == 2
