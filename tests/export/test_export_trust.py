"""An export from elsewhere never runs code: every tampering of ``model.pt2`` that made torch's
loader run a payload (issue 52), and every file whose bytes differ from ``signature.json``, is
refused before anything is loaded, on every path that loads an export: ``load_exported``,
``stoker serve``, ``stoker bench --exported`` and an export at a URL.

Each hostile archive is written the way an attacker would: its members edited, and the
signature's sha256 of ``model.pt2`` updated to match (so only the archive's vetting stands
between the payload and torch's unpickler, ``sympify`` or ``exec``).
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from helpers.cli import run_main
from helpers.tiny import make_data, make_estimator, train_input
from stoker.errors import ExportError
from stoker.export import export, load_exported
from stoker.export.trust import vet_program_json


class _Touch:
    """Unpickling this creates ``path``: proof that code from the file ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def _pickled(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    x, y = make_data(32)
    est = make_estimator(tmp_path_factory.mktemp("run"))
    est.train(train_input(x, y), max_steps=4)
    return export(est, tmp_path_factory.mktemp("exp") / "net", x[:2])


Members = dict[str, bytes]


def _tamper(src: Path, dst: Path, edit: Callable[[Members, Path], None], marker: Path) -> Path:
    """A copy of export ``src`` at ``dst`` whose model.pt2 members ``edit`` changed, its sha256 in
    the signature updated as an attacker with write access would."""
    shutil.copytree(src, dst)
    with zipfile.ZipFile(src / "model.pt2") as z:
        members = {n: z.read(n) for n in z.namelist()}
    root = next(iter(members)).split("/")[0]
    rel = {n[len(root) + 1 :]: data for n, data in members.items()}
    edit(rel, marker)
    with zipfile.ZipFile(dst / "model.pt2", "w", zipfile.ZIP_STORED) as z:
        for name, data in rel.items():
            z.writestr(f"{root}/{name}", data)
    _rehash(dst, "model.pt2")
    return dst


def _rehash(export_dir: Path, name: str) -> None:
    sig = json.loads((export_dir / "signature.json").read_text())
    sig["sha256"][name] = hashlib.sha256((export_dir / name).read_bytes()).hexdigest()
    (export_dir / "signature.json").write_text(json.dumps(sig))


def _program(rel: Members) -> dict:
    return json.loads(rel["models/model.json"])


def _set_program(rel: Members, program: dict) -> None:
    rel["models/model.json"] = json.dumps(program).encode()


def weight_use_pickle(rel: Members, marker: Path) -> None:
    cfg = json.loads(rel["data/weights/model_weights_config.json"])
    first = next(iter(cfg["config"].values()))
    first["use_pickle"] = True
    rel["data/weights/" + first["path_name"]] = _pickled({"w": _Touch(marker)})
    rel["data/weights/model_weights_config.json"] = json.dumps(cfg).encode()


def constant_use_pickle(rel: Members, marker: Path) -> None:
    cfg = json.loads(rel["data/constants/model_constants_config.json"])
    cfg["config"]["c"] = {"path_name": "tensor_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    rel["data/constants/tensor_0"] = _pickled(_Touch(marker))
    rel["data/constants/model_constants_config.json"] = json.dumps(cfg).encode()


def opaque_constant(rel: Members, marker: Path) -> None:
    import pickle

    cfg = json.loads(rel["data/constants/model_constants_config.json"])
    cfg["config"]["c"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    rel["data/constants/opaque_obj_0"] = pickle.dumps(_Touch(marker))
    rel["data/constants/model_constants_config.json"] = json.dumps(cfg).encode()


def pickled_sample_inputs(rel: Members, marker: Path) -> None:
    rel["data/sample_inputs/model.pt"] = _pickled(((_Touch(marker),), {}))


def legacy_weights(rel: Members, marker: Path) -> None:
    del rel["data/weights/model_weights_config.json"]
    rel["data/weights/model.pt"] = _pickled({"w": _Touch(marker)})


def compiled_code_inside(rel: Members, marker: Path) -> None:
    rel["data/aotinductor/model/model.so"] = b"\x7fELF not really"


def shape_expression(rel: Members, marker: Path) -> None:
    text = rel["models/model.json"].decode()
    payload = f"__import__('pathlib').Path('{marker}').touch() or Symbol("
    rel["models/model.json"] = text.replace('"Symbol(', f'"{payload}', 1).encode()


def input_guard(rel: Members, marker: Path) -> None:
    program = _program(rel)
    program["guards_code"] = [f"__import__('pathlib').Path('{marker}').touch() or True"]
    _set_program(rel, program)


def quoted_parameter_name(rel: Members, marker: Path) -> None:
    program = _program(rel)
    spec = program["graph_module"]["signature"]["input_specs"][0]["parameter"]
    spec["parameter_name"] = f'model.fc1.x"); __import__("pathlib").Path("{marker}").touch(); ("'
    _set_program(rel, program)


def treespec_enum(rel: Members, marker: Path) -> None:
    program = _program(rel)
    sig = program["graph_module"]["module_call_graph"][0]["signature"]
    spec = json.loads(sig["out_spec"])
    spec[1]["context"] = json.dumps([{"__enum__": True, "fqn": "this:x", "name": "y"}])  # imports `this`
    sig["out_spec"] = json.dumps(spec)
    _set_program(rel, program)


TAMPERINGS = [
    (weight_use_pickle, r"stored as a pickle \(use_pickle\)"),
    (constant_use_pickle, r"stored as a pickle \(use_pickle\)"),
    (opaque_constant, r"stored as a pickle|opaque_obj_0"),
    (pickled_sample_inputs, r"sample inputs are not plain tensors .*WeightsUnpickler error"),
    (legacy_weights, r"data/weights/model\.pt"),
    (compiled_code_inside, r"data/aotinductor/model/model\.so"),
    (shape_expression, r"shape expression .*__import__"),
    (input_guard, r"input guard .*__import__"),
    (quoted_parameter_name, r"parameter_name string .* with '\"'"),
    (treespec_enum, r"pytree spec has a context object"),
]


@pytest.mark.parametrize(("edit", "message"), TAMPERINGS, ids=[t[0].__name__ for t in TAMPERINGS])
def test_a_tampered_program_is_refused_before_torch_reads_it(exported, tmp_path, edit, message):
    marker = tmp_path / "code-ran"
    bad = _tamper(exported, tmp_path / "net", edit, marker)
    with pytest.raises(ExportError, match=message) as info:
        load_exported(bad)
    assert "model.pt2 is refused" in str(info.value) and "it was not loaded" in str(info.value)
    assert not marker.exists()


def test_every_file_is_verified_against_the_signature_before_anything_loads(exported, tmp_path):
    sig = json.loads((exported / "signature.json").read_text())
    assert set(sig["sha256"]) == set(sig["files"]) == {"model.pt2", "model.safetensors"}
    assert all(len(h) == 64 for h in sig["sha256"].values())
    for name in sig["files"]:
        copy = tmp_path / name / "net"
        shutil.copytree(exported, copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        with pytest.raises(ExportError, match=rf"{name} is refused: its sha256 is \w+… but signature.json says"):
            load_exported(copy)
    copy = tmp_path / "missing" / "net"
    shutil.copytree(exported, copy)
    (copy / "model.safetensors").unlink()
    with pytest.raises(ExportError, match="model.safetensors is missing"):
        load_exported(copy)
    del sig["sha256"]
    (copy / "signature.json").write_text(json.dumps(sig))
    with pytest.raises(ExportError, match="no sha256 of the export's files .* export it again"):
        load_exported(copy)


def test_a_tampered_export_is_refused_by_serve_bench_and_from_a_url(exported, tmp_path, capsys):
    import fsspec

    marker = tmp_path / "code-ran"
    bad = _tamper(exported, tmp_path / "net", weight_use_pickle, marker)
    code, out, err = run_main(capsys, "serve", str(bad), "--port", "0")
    assert code == 1 and "model.pt2 is refused" in err and "Traceback" not in out + err
    code, out, err = run_main(
        capsys, "bench", "--mode=inference", f"--exported={bad}", "--batch_size=2", "--iterations=1", "--device=cpu"
    )
    assert code != 0 and "model.pt2 is refused" in out + err and "Traceback" not in out + err
    fs = fsspec.filesystem("memory")
    for p in bad.iterdir():
        fs.pipe_file(f"/trust-test/net/{p.name}", p.read_bytes())
    with pytest.raises(ExportError, match="model.pt2 is refused"):
        load_exported("memory://trust-test/net")
    assert not marker.exists()
    # the untouched export still loads on each of these paths
    assert load_exported(exported)({"features": torch.zeros(2, 8)})["logits"].shape == (2, 3)


def test_real_programs_pass_the_vetting_with_their_shape_expressions():
    """Shape expressions, guards and specs as torch writes them pass; each one-step-away hostile form fails."""
    ok = {
        "guards_code": ["L['args'][0][0].size()[0] % 2 == 0", "2 <= L['args'][0][0].size()[0]"],
        "graph_module": {
            "x": {"expr_str": "Mul(Integer(2), Symbol('s21', positive=True, integer=True))"},
            "y": {"expr_str": "FloorDiv(s0, 2) + Max(1, s1)"},
            "z": {"expr_str": "Pow(Symbol('s0', integer=True), Integer(2))"},
            "in_spec": '[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]',
            "out_spec": '[1, {"type": "builtins.dict", "context": "[\\"logits\\"]", "children_spec": []}]',
            "stack_trace": 'File "model.py", line 3, in forward\n    return self.fc(x["a"])',
        },
    }
    vet_program_json(ok, "test")
    for key, bad in [
        ("expr_str", "Symbol('s0').__class__"),
        ("expr_str", "exec(chr(49))"),
        ("expr_str", "Symbol(chr(115))"),
        ("expr_str", "Pow(Integer(9), Pow(Integer(9), Integer(9)))"),
        ("expr_str", "Integer(10**100)"),
        ("in_spec", '[1, {"type": "collections.defaultdict", "context": "null", "children_spec": []}]'),
        ("stack_trace", 'File "a", line 1, in f\nx\r__import__("os")'),
        ("name", "a\\"),
    ]:
        with pytest.raises(ExportError, match="refused"):
            vet_program_json({"graph_module": {key: bad}}, "test")
    for guard in ("L['x'].__class__", "exec('1')", "L['a\"'] == 1", "__import__('os')"):
        with pytest.raises(ExportError, match="input guard"):
            vet_program_json({"guards_code": [guard]}, "test")
