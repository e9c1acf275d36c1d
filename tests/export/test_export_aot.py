"""AOTInductor packages: ``stoker export --aot`` round trips in a Python without stoker, refusals.

Compiling takes 10 to 60 s on the shared CPU, so the default run compiles one package (resnet20,
through the command line, module-scoped) and every default test reuses it; the charlm round
trip is marked slow.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import stoker
from helpers.processes import PYTHON
from stoker.errors import ExportError
from stoker.export import AOT_FILE, export, load_exported
from stoker.export.aot import AOT_FORMAT
from stoker.export.cli import add_parser
from stoker.models import create_model
from stoker.run_spec import estimator_from_model_dir, write_run_spec

# Loads the package with torch alone and proves stoker was never imported.
FRESH_PYTHON = (
    "import sys, torch\n"
    "runner = torch._inductor.aoti_load_package(sys.argv[1])\n"
    "inputs = torch.load(sys.argv[2])\n"
    "outputs = [runner(x) for x in inputs]\n"
    "assert 'stoker' not in sys.modules, 'stoker was imported'\n"
    "torch.save(outputs, sys.argv[3])\n"
)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def run_fresh(package, inputs: list[torch.Tensor], tmp_path) -> list[dict[str, torch.Tensor]]:
    """Outputs of ``package`` on each of ``inputs``, computed in a new Python process without stoker."""
    torch.save(inputs, tmp_path / "inputs.pt")
    proc = subprocess.run(
        [PYTHON, "-c", FRESH_PYTHON, str(package), str(tmp_path / "inputs.pt"), str(tmp_path / "outputs.pt")],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(tmp_path / "outputs.pt")


def predict_batch(est: stoker.Estimator, x: torch.Tensor, checkpoint: str | None = None) -> dict[str, torch.Tensor]:
    data = lambda p: stoker.data.arrays(x, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p))  # noqa: E731
    batches = list(est.predict(data, checkpoint_path=checkpoint, yield_single_examples=False))
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if value.is_floating_point():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-5)
        else:
            assert torch.equal(got[key], value), key


@pytest.fixture(scope="module")
def resnet20_aot(tmp_path_factory):
    """A resnet20 model_dir trained one step, exported by ``stoker export --aot``."""

    def model_fn(model, features, labels, mode, params):
        logits = model(features)
        return stoker.EstimatorSpec(loss=F.cross_entropy(logits, labels), predictions={"classes": logits.argmax(-1)})

    model_dir = tmp_path_factory.mktemp("resnet20")
    est = stoker.Estimator(
        model=lambda p: create_model("resnet20", dataset="cifar10"),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(model_dir=model_dir, progress_bar=False, device="cpu"),
        train_batch_size=4,
    )
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    est.train(lambda p: stoker.data.arrays(images, labels, read=stoker.data.ReadOptions().for_replica(p)), max_steps=1)
    write_run_spec(model_dir, kind="zoo", model="resnet20", dataset="cifar10")
    out = tmp_path_factory.mktemp("exp") / "resnet20"
    assert _cli(["export", str(model_dir), "--out", str(out), "--aot"]) == 0
    return model_dir, out


def test_resnet20_package_in_a_python_without_stoker_equals_predict_at_batch_1_and_7(resnet20_aot, tmp_path, capsys):
    model_dir, out = resnet20_aot
    sig = json.loads((out / "signature.json").read_text())
    assert sig["files"] == ["model.pt2", "model.safetensors", AOT_FILE]
    aot = sig["aot"]
    assert (aot["format"], aot["file"], aot["device"], aot["torch_version"]) == (
        AOT_FORMAT,
        AOT_FILE,
        "cpu",
        torch.__version__,
    )
    assert aot["max_abs_difference_from_eager"] <= 1e-5
    assert sig["inputs"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 3, 32, 32]}]
    x = torch.randn(7, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    got = run_fresh(out / AOT_FILE, [x[:1], x], tmp_path)
    est, _, _ = estimator_from_model_dir(model_dir)
    for rows, outputs in zip((1, 7), got, strict=True):
        want = predict_batch(est, x[:rows], sig["checkpoint"])
        assert outputs["logits"].shape == (rows, 10)
        assert_same(outputs, want)
    # stoker's own loader runs the same package by its file name or by the directory with aot=True
    by_file, by_dir = load_exported(out / AOT_FILE), load_exported(out, aot=True)
    assert by_file.kind == by_dir.kind == "aot" and load_exported(out).kind == "program"
    assert_same(by_file({"features": x}), got[1])


def copy_export(out, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    return copy


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("torch_version", "2.0.0+cu999", r"compiled with torch 2\.0\.0\+cu999 and this is torch"),
        ("device", "tpu", "compiled for device 'tpu'"),
        ("format", "stoker-aot/0", "has format 'stoker-aot/0'"),
    ],
)
def test_a_package_for_another_torch_or_device_is_refused_before_loading(resnet20_aot, tmp_path, key, value, message):
    copy = copy_export(resnet20_aot[1], tmp_path)
    sig = json.loads((copy / "signature.json").read_text())
    sig["aot"][key] = value
    (copy / "signature.json").write_text(json.dumps(sig))
    with pytest.raises(ExportError, match=message):
        load_exported(copy / AOT_FILE)
    assert load_exported(copy).kind == "program"  # the torch.export program still serves


_CONSTRUCTOR = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) { int fd = creat(MARKER, 0600); if (fd >= 0) close(fd); }
"""


def _with_library(package, library: bytes, dst) -> list[str]:
    """``package`` with every shared library in it replaced by ``library``, written to ``dst``."""
    import zipfile

    with zipfile.ZipFile(package) as z:
        members = {n: z.read(n) for n in z.namelist()}
    replaced = [n for n in members if n.endswith(".so")]
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, library if name in replaced else data)
    return replaced


def test_a_replaced_shared_library_is_refused_before_it_is_opened(resnet20_aot, tmp_path, capsys):
    """Before issue 52 the library's constructor ran, then serve crashed with a traceback."""
    import hashlib

    from stoker.cli import main

    marker = tmp_path / "constructor-ran"
    source = tmp_path / "evil.c"
    source.write_text(_CONSTRUCTOR)
    subprocess.run(
        ["g++", "-x", "c", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(tmp_path / "evil.so"), str(source)],
        check=True,
        timeout=120,
    )
    copy = copy_export(resnet20_aot[1], tmp_path)
    sig = json.loads((copy / "signature.json").read_text())
    assert list(sig["aot"]["library_sha256"]) and all(n.endswith(".so") for n in sig["aot"]["library_sha256"])
    assert "/" not in sig["aot"]["compiler"]  # a name, not the exporting machine's path
    assert _with_library(resnet20_aot[1] / AOT_FILE, (tmp_path / "evil.so").read_bytes(), copy / AOT_FILE)
    with pytest.raises(ExportError, match=r"model.aoti.pt2 is refused: its sha256 is \w+… but signature.json says"):
        load_exported(copy, aot=True)
    # an attacker who rewrites the package's hash too: the library's own hash still differs
    sig["sha256"][AOT_FILE] = hashlib.sha256((copy / AOT_FILE).read_bytes()).hexdigest()
    (copy / "signature.json").write_text(json.dumps(sig))
    with pytest.raises(ExportError, match="its shared library is not the one exported"):
        load_exported(copy / AOT_FILE)
    assert main(["serve", str(copy / AOT_FILE), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "shared library is not the one exported" in err and "Traceback" not in err
    assert not marker.exists()
    assert load_exported(copy).kind == "program"  # model.pt2 is untouched and still serves


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the refusal cannot be shown")
def test_a_cuda_package_without_cuda_is_refused(resnet20_aot, tmp_path):
    copy = copy_export(resnet20_aot[1], tmp_path)
    sig = json.loads((copy / "signature.json").read_text())
    sig["aot"]["device"] = "cuda"
    (copy / "signature.json").write_text(json.dumps(sig))
    with pytest.raises(ExportError, match="compiled for cuda and this process has no CUDA device"):
        load_exported(copy, aot=True)


def test_a_sidecar_that_disagrees_with_the_package_metadata_is_refused(resnet20_aot, tmp_path, monkeypatch):
    # the sidecar passes the check (claims this torch) but the package's embedded metadata was
    # written by another: the check after loading catches files mixed from two exports
    copy = copy_export(resnet20_aot[1], tmp_path)
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    sig = json.loads((copy / "signature.json").read_text())
    sig["aot"]["torch_version"] = "9.9.9"
    (copy / "signature.json").write_text(json.dumps(sig))
    with pytest.raises(ExportError, match="files are from different exports"):
        load_exported(copy, aot=True)


def test_no_package_and_no_compiler_are_clear_errors(resnet20_aot, tmp_path, monkeypatch, capsys):
    from helpers.tiny import make_data, make_estimator

    with pytest.raises(ExportError, match="holds no AOT package"):
        load_exported(_without_aot(resnet20_aot[1], tmp_path), aot=True)
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler anywhere
    x, _ = make_data(4)
    est = make_estimator(None)
    with (
        torch._inductor.config.patch({"cpp.cxx": (None, "g++")}),
        pytest.raises(
            ExportError, match=r"needs a C\+\+ compiler, but g\+\+ \(what torch looks for.*\) is not on PATH"
        ),
    ):
        export(est, tmp_path / "exp", x[:2], aot=True)
    assert not (tmp_path / "exp").exists()
    with (
        torch._inductor.config.patch({"cpp.cxx": (None, "/bin/true")}),
        pytest.raises(ExportError, match="aot_device must be one of cpu, cuda; got 'tpu'"),
    ):
        export(est, tmp_path / "exp", x[:2], aot=True, aot_device="tpu")
    assert _cli(["export", str(tmp_path), "--out", str(tmp_path / "x"), "--aot_device", "cuda"]) == 2
    assert "--aot_device needs --aot" in capsys.readouterr().err


def _without_aot(out, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    (plain / AOT_FILE).unlink()
    return plain


@pytest.mark.slow
def test_charlm_package_in_a_python_without_stoker_equals_predict_at_batch_1_and_7(tmp_path):
    from stoker.recipes.charlm import CharLMConfig, build_estimator

    est = build_estimator(CharLMConfig(device="cpu", eval_batch_size=7))
    x = torch.randint(0, 256, (7, 32), generator=torch.Generator().manual_seed(0))
    out = est.export(tmp_path / "charlm", x[:2], aot=True)
    got = run_fresh(out / AOT_FILE, [x[:1], x], tmp_path)
    # an Estimator that never trained predicts from weights it warm-starts from: the exported ones
    est = build_estimator(CharLMConfig(device="cpu", eval_batch_size=7), warm_start_from=str(out / "model.safetensors"))
    for rows, outputs in zip((1, 7), got, strict=True):
        assert outputs["next_byte_logits"].shape == (rows, 256)
        assert_same(outputs, predict_batch(est, x[:rows]))


def test_bench_measures_the_package(resnet20_aot, capsys):
    from stoker.cli import main

    package = resnet20_aot[1] / AOT_FILE
    code = main(
        [
            "bench",
            "--mode=inference",
            f"--exported={package}",
            "--batch_size=2",
            "--iterations=3",
            "--device=cpu",
            "--data_name=cifar10",
            "--peak_tflops=1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Model:       AOT package {package}" in out and "total images/sec:" in out


def test_stoker_serve_serves_the_package_to_tritonclient(resnet20_aot):
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")
    from stoker.serving.server import make_server

    out = resnet20_aot[1]
    srv = make_server(out / AOT_FILE, "127.0.0.1", 0, model_name="resnet20").start()
    client = httpclient.InferenceServerClient(srv.url.removeprefix("http://"), network_timeout=30)
    try:
        assert client.get_model_metadata("resnet20")["platform"] == "pytorch_aotinductor"
        x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2)).numpy()
        inp = httpclient.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("resnet20", [inp])
        want = load_exported(out, aot=True)({"features": torch.from_numpy(x)})
        assert (result.as_numpy("logits") == want["logits"].numpy()).all()
        assert (result.as_numpy("classes") == want["classes"].numpy()).all()
    finally:
        client.close()
        srv.stop()


@pytest.mark.slow  # inductor generates the code before the compiler fails: ~9 s
def test_a_failed_compile_writes_nothing_and_says_so(tmp_path):
    from helpers.tiny import make_data, make_estimator

    x, _ = make_data(4)
    # a compiler that is found but fails every build, and no cached build to fall back on
    with (
        torch._inductor.config.patch({"cpp.cxx": (None, "/bin/false"), "force_disable_caches": True}),
        pytest.raises(ExportError, match="could not compile the exported program, so nothing was written"),
    ):
        export(make_estimator(None), tmp_path / "exp", x[:2], aot=True)
    assert list(tmp_path.iterdir()) == []  # not even the temporary directory is left
