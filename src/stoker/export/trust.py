"""What stoker checks of an export before it loads any of it.

An export travels (a bucket, a model store, another team), so everything in it is read as
data from elsewhere:

- ``signature.json`` is plain JSON. It holds the sha256 of every other file of the export
  (``sha256``); each is checked before anything is loaded (:func:`read_verified`). A hash says the
  bytes are the ones written, not that they are safe: whoever can write the files can write
  the signature too.
- ``model.pt2`` is read once; :func:`vet_program` inspects that archive, through torch's own
  archive reader, and refuses anything torch's loader would decode by running code:
  pickled weights or constants (``use_pickle``, which ``torch.export.load`` unpickles with
  ``weights_only=False``), custom or opaque objects, the legacy layout, compiled code
  (``data/aotinductor``) or other extra parts, sample inputs that torch's ``weights_only``
  unpickler refuses (torch falls back to unrestricted unpickling), and program text that torch
  evaluates: shape expressions (``sympify``, which is ``eval``), input guards (``exec``), names
  that its code generator pastes into source, and pytree specs that import modules. Only then
  are the same bytes handed to ``torch.export.load``.
- ``model.aoti.pt2`` is a shared library: code, by design. It is loaded only when its sha256
  matches the signature's, its library's sha256 matches the one recorded at export, and the
  archive holds nothing but the compiled model; it is loaded from a private copy of the bytes
  that were checked. It must come from a source you trust (docs/export.md, "Security").
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ExportError

SHA256_KEY = "sha256"  # signature.json: {file name: sha256 hex} of every other file of the export
LIBRARY_KEY = "library_sha256"  # the signature's aot entry: {archive member: sha256} of the compiled library

_LIBRARY_SUFFIXES = (".so", ".dylib", ".dll", ".pyd")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYMBOL = re.compile(r"[a-z]{1,8}[0-9]+")  # torch's shape symbols: s0, u3, zuf0, ...
# The functions a shape expression may call: sympy's own and torch.utils._sympy.functions.
_SYMPY_CALLS = frozenset(
    {
        "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs",
        "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "floor", "ceiling", "sqrt", "Piecewise",
        "ITE", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Equality", "Unequality",
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
        "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv", "TruncToFloat",
        "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "IsNonOverlappingAndDenseIndicator",
    }
)  # fmt: skip
_SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "pi", "E", "S", "True", "False", "None"})
# What an input guard (Python that torch exec()s when the program becomes a module) may use.
_GUARD_NAMES = frozenset({"L", "math", "inf", "max", "min", "abs", "int", "float", "bool"}) | _SYMPY_CALLS
_GUARD_ATTRIBUTES = frozenset(
    {"size", "stride", "storage_offset", "dim", "numel", "isnan", "isinf", "inf", "floor", "ceil", "trunc", "sqrt"}
)
_TREESPEC_TYPES = frozenset(
    {
        None,
        "builtins.tuple",
        "builtins.list",
        "builtins.dict",
        "collections.OrderedDict",
        "torch.fx.immutable_collections.immutable_list",
        "torch.fx.immutable_collections.immutable_dict",
    }
)
_BIG = 2**63


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def refuse(where: object, why: str) -> ExportError:
    """The error for an export file that is refused, unloaded."""
    return ExportError(
        f"{where} is refused: {why}; it was not loaded (an export runs no code from its files: see "
        "docs/export.md, 'Security')"
    )


# ---------------------------------------------------------------------------- hashes
def expected_hashes(signature: Mapping[str, Any], where: Path) -> dict[str, str]:
    """The signature's ``{file: sha256}``, covering every file it lists; ``ExportError`` if it has none."""
    hashes = signature.get(SHA256_KEY)
    files = signature.get("files")
    if not isinstance(hashes, dict) or not isinstance(files, list):
        raise ExportError(
            f"{where / 'signature.json'} has no sha256 of the export's files (an export written before stoker "
            "0.1.0); export it again (stoker export), so its files can be verified before they are loaded"
        )
    missing = [f for f in files if f not in hashes]
    if missing:
        raise refuse(where / "signature.json", f"it lists {missing} without a sha256")
    return {str(k): str(v) for k, v in hashes.items()}


def read_verified(directory: Path, hashes: Mapping[str, str], load: Iterable[str]) -> dict[str, bytes]:
    """Check every file the signature hashes; return the bytes of those in ``load`` (read once:
    what was checked is what gets loaded)."""
    wanted = set(load)
    out: dict[str, bytes] = {}
    for name, want in sorted(hashes.items()):
        path = directory / name
        if "/" in name or name in ("", ".", ".."):
            raise refuse(directory / "signature.json", f"it names {name!r}, not a file of the export")
        if not path.is_file():
            raise refuse(directory, f"{name} is missing (signature.json lists it)")
        if name in wanted:
            data = path.read_bytes()
            got = sha256(data)
            out[name] = data
        else:
            got = file_sha256(path)
        if got != want:
            raise refuse(path, f"its sha256 is {got[:12]}… but signature.json says {want[:12]}…")
    absent = wanted - set(out)
    if absent:
        raise refuse(directory / "signature.json", f"it has no sha256 for {sorted(absent)}")
    return out


# ---------------------------------------------------------------------------- model.pt2
def vet_program(data: bytes, where: object) -> None:
    """Refuse a ``torch.export`` archive whose loading would run code from it (see the module doc)."""
    names, read = _archive(data, where)
    models = sorted(n[len("models/") : -len(".json")] for n in names if re.fullmatch(r"models/[A-Za-z0-9_]+\.json", n))
    if not models:
        raise refuse(where, "it holds no models/<name>.json (not a torch.export archive of this torch's format)")
    allowed = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
    for m in models:
        allowed |= {
            f"models/{m}.json",
            f"data/weights/{m}_weights_config.json",
            f"data/constants/{m}_constants_config.json",
        }
        allowed.add(f"data/sample_inputs/{m}.pt")
    for name in names:
        if name in allowed or re.fullmatch(r"data/weights/weight_[0-9]+|data/constants/tensor_[0-9]+", name):
            continue
        why = "compiled code, pickled objects or extra files are never loaded"
        raise refuse(where, f"it holds {name!r}, which a torch.export program of tensors does not ({why})")
    if read("archive_format").strip() != b"pt2":
        raise refuse(where, "its archive_format is not 'pt2'")
    for m in models:
        for kind in ("weights", "constants"):
            config = f"data/{kind}/{m}_{kind}_config.json"
            if config not in names:
                raise refuse(where, f"it has no {config} (the legacy layout, whose {kind} are pickles, is not loaded)")
            _vet_payload_config(_json(read(config), where, config), kind, where)
        _vet_sample_inputs(read(f"data/sample_inputs/{m}.pt") if f"data/sample_inputs/{m}.pt" in names else b"", where)
        vet_program_json(_json(read(f"models/{m}.json"), where, f"models/{m}.json"), where)


def _archive(data: bytes, where: object) -> tuple[set[str], Any]:
    """The member names of a pt2 archive, and a reader of members, through torch's own zip reader
    (the one its loader uses: no second parser to disagree with)."""
    from torch.export.pt2_archive._package import PT2ArchiveReader

    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
        names = list(reader.get_file_names())
    except Exception as e:  # noqa: BLE001 - the C++ reader raises RuntimeError for many kinds of damage
        raise refuse(where, f"it is not a readable pt2 archive ({type(e).__name__}: {str(e)[:120]})") from None
    if len(set(names)) != len(names):
        raise refuse(where, "it holds the same member twice")

    def read(name: str) -> bytes:
        try:
            return bytes(reader.read_bytes(name))
        except Exception as e:  # noqa: BLE001
            raise refuse(where, f"its member {name} cannot be read ({type(e).__name__})") from None

    return set(names), read


def _json(data: bytes, where: object, member: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise refuse(where, f"{member} is not JSON ({type(e).__name__})") from None


def _vet_payload_config(config: Any, kind: str, where: object) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise refuse(where, f"its {kind} config is not a {{'config': {{...}}}} object")
    prefix = "weight_" if kind == "weights" else "tensor_"
    for fqn, entry in entries.items():
        if not isinstance(entry, dict) or entry.get("use_pickle") is not False:
            why = "which torch would unpickle with weights_only=False"
            raise refuse(where, f"{kind[:-1]} {fqn!r} is stored as a pickle (use_pickle), {why}")
        path = entry.get("path_name")
        if not isinstance(path, str) or not re.fullmatch(prefix + "[0-9]+", path):
            raise refuse(where, f"{kind[:-1]} {fqn!r} is stored as {path!r}, not as a raw tensor ({prefix}<n>)")
        _vet_strings(fqn, "name", where)


def _vet_sample_inputs(data: bytes, where: object) -> None:
    """Torch reads sample inputs with ``weights_only=True`` and, when that refuses, unrestricted."""
    import torch

    if not data:
        return
    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - weights_only refuses with UnpicklingError, damage with others
        reason = next((ln.strip() for ln in str(e).splitlines() if "WeightsUnpickler error" in ln), type(e).__name__)
        raise refuse(where, f"its sample inputs are not plain tensors ({reason[:200]})") from None
    if not isinstance(value, (tuple, dict)):
        raise refuse(where, f"its sample inputs are a {type(value).__name__}, not a tuple")


# ---------------------------------------------------------------------------- the program's text
def vet_program_json(program: Any, where: object) -> None:
    """Refuse program text that torch would evaluate or paste into generated source."""
    if not isinstance(program, dict):
        raise refuse(where, "its program is not a JSON object")
    guards = program.get("guards_code", [])
    if not isinstance(guards, list):
        raise refuse(where, "its guards_code is not a list")
    for guard in guards:
        _vet_guard(guard, where)
    _walk({k: v for k, v in program.items() if k != "guards_code"}, "", where)


def _walk(value: Any, key: str, where: object) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _vet_strings(k, "name", where)
            _walk(v, k, where)
    elif isinstance(value, list):
        for v in value:
            _walk(v, key, where)
    elif isinstance(value, str):
        if key == "expr_str":
            _vet_sympy(value, where)
        elif key in ("in_spec", "out_spec"):
            _vet_treespec(value, where)
        else:
            _vet_strings(value, key, where)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**64:
        raise refuse(where, f"its program holds the integer {str(value)[:30]}…, larger than any tensor size")


def _vet_strings(text: str, key: str, where: object) -> None:
    """Every other string: no line breaks but a stack trace's, no quotes or backslashes (torch's
    code generator writes some names into source between double quotes)."""
    if key == "stack_trace":
        bad = [c for c in set(text) if (ord(c) < 32 and c not in "\n\t") or c in "\r\x0b\x0c\x85\u2028\u2029"]
    else:
        bad = [c for c in set(text) if ord(c) < 32 or c in '"\\\x7f\x85\u2028\u2029']
    if bad:
        raise refuse(where, f"its program has a {key or 'value'} string {text[:60]!r} with {''.join(sorted(bad))!r}")


def _vet_sympy(text: str, where: object) -> None:
    """A shape expression, which torch hands to ``sympy.sympify`` (an ``eval``): only sympy's
    arithmetic over shape symbols and numbers."""
    import sympy  # type: ignore[import-untyped]

    def fail(why: str) -> ExportError:
        return refuse(where, f"its shape expression {text[:80]!r} {why}")

    if len(text) > 10_000:
        raise fail("is too long")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise fail("is not an expression") from None
    known = vars(sympy).keys() | vars(builtins).keys()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)):
            if isinstance(node, (ast.MatMult, ast.BitXor)):
                raise fail("uses an operator shapes do not")
            continue
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.keyword)):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _small_int(node.right):
                raise fail("raises to a power other than a small integer")
            if isinstance(node, ast.keyword) and not (node.arg and isinstance(node.value, ast.Constant)):
                raise fail("passes a keyword that is not a constant")
            continue
        if isinstance(node, ast.Call):
            func = node.func.id if isinstance(node.func, ast.Name) else None
            if func not in _SYMPY_CALLS:
                raise fail(f"calls {ast.unparse(node.func)[:40]!r}, not one of sympy's shape functions")
            if func == "Pow" and (len(node.args) != 2 or not _small_int(node.args[1])):
                raise fail("raises to a power other than a small integer")
            strings = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if strings and (func != "Symbol" or node.args[0] is not strings[0] or len(strings) > 1):
                raise fail("passes a string to something other than Symbol")
            continue
        if isinstance(node, ast.Name):
            if node.id in _SYMPY_CALLS or node.id in _SYMPY_CONSTANTS:
                continue
            if _SYMBOL.fullmatch(node.id) and node.id not in known:
                continue
            raise fail(f"names {node.id!r}, neither a shape symbol nor a sympy function")
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str) and (_SYMBOL.fullmatch(value) or _IDENTIFIER.fullmatch(value)):
                continue
            if isinstance(value, (bool, float)) or value is None or (isinstance(value, int) and abs(value) < _BIG):
                continue
            raise fail(f"holds the constant {str(value)[:30]!r}")
        raise fail(f"holds a {type(node).__name__}")


def _small_int(node: ast.expr) -> bool:
    """``node`` is an integer literal (or ``Integer(n)``) of at most 64 in size."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer" and node.args:
        node = node.args[0]
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) <= 64


def _vet_guard(text: Any, where: object) -> None:
    """An input guard, which torch ``exec``s: comparisons of input sizes and numbers, no more."""

    def fail(why: str) -> ExportError:
        return refuse(where, f"its input guard {str(text)[:80]!r} {why}")

    if not isinstance(text, str) or len(text) > 10_000:
        raise fail("is not a short string")
    if any(ord(c) < 32 or c in "\r\x7f\x85\u2028\u2029" for c in text):
        raise fail("has a control character")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise fail("is not an expression") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)):
            continue
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Subscript, ast.Call, ast.Tuple)):
            if isinstance(node, ast.Call) and node.keywords:
                raise fail("passes keywords")
            continue
        if isinstance(node, ast.Name) and node.id in _GUARD_NAMES:
            continue
        if isinstance(node, ast.Attribute) and node.attr in _GUARD_ATTRIBUTES:
            continue
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str) and (value == "" or _IDENTIFIER.fullmatch(value)):
                continue
            if isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) < _BIG):
                continue
        raise fail(f"holds {ast.unparse(node)[:40]!r}, which a guard on input sizes does not")


def _vet_treespec(text: str, where: object) -> None:
    """A pytree spec: builtin containers only (others import modules by name when read)."""
    try:
        protocol, schema = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        raise refuse(where, f"its pytree spec {text[:60]!r} is not [protocol, spec]") from None
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or node.get("type") not in _TREESPEC_TYPES:
            kind = node.get("type") if isinstance(node, dict) else type(node).__name__
            raise refuse(where, f"its pytree spec has a node of type {kind!r}; only tuples, lists and dicts are read")
        context = node.get("context")
        if context is not None:
            if not isinstance(context, str):
                raise refuse(where, "its pytree spec has a context that is not JSON text")
            _vet_context(context, where)
        children = node.get("children_spec", [])
        if not isinstance(children, list):
            raise refuse(where, "its pytree spec has children that are not a list")
        stack.extend(children)


def _vet_context(text: str, where: object) -> None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise refuse(where, f"its pytree spec has a context {text[:60]!r} that is not JSON") from None
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            raise refuse(where, "its pytree spec has a context object (torch reads enums from those by importing them)")
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            _vet_strings(item, "name", where)


# ---------------------------------------------------------------------------- model.aoti.pt2
def library_hashes(data: bytes, where: object) -> dict[str, str]:
    """``{member: sha256}`` of the shared libraries in an AOT package."""
    names, read = _archive(data, where)
    return {n: sha256(read(n)) for n in sorted(names) if n.endswith(_LIBRARY_SUFFIXES)}


def vet_package(data: bytes, info: Mapping[str, Any], where: object) -> None:
    """Refuse an AOT package whose library is not the one recorded at export, or that holds more
    than a compiled model (a torch.export program in it would be deserialized too)."""
    names, _ = _archive(data, where)
    stray = sorted(n for n in names if not (n.startswith("data/aotinductor/") or n in _PACKAGE_FILES))
    if stray:
        raise refuse(where, f"it holds {stray[:3]}, which a compiled package does not")
    want = info.get(LIBRARY_KEY)
    if not isinstance(want, dict) or not want:
        raise refuse(where, "signature.json records no sha256 of its shared library (export it again)")
    got = library_hashes(data, where)
    if got != want:
        changed = sorted(set(got) ^ set(want) | {n for n in got if n in want and got[n] != want[n]})
        raise refuse(where, f"its shared library is not the one exported ({', '.join(changed)[:120]} differs)")


_PACKAGE_FILES = frozenset(
    {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
)


__all__ = [
    "LIBRARY_KEY",
    "SHA256_KEY",
    "expected_hashes",
    "file_sha256",
    "library_hashes",
    "read_verified",
    "refuse",
    "sha256",
    "vet_package",
    "vet_program",
    "vet_program_json",
]
