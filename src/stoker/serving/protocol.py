"""What ``stoker serve`` reads and writes, apart from the web framework: the checks of a request
against an export's ``signature.json``, and the Open Inference Protocol (KServe v2 REST) bodies.

Two request shapes reach the same checks (:func:`validate_inputs`):

- stoker's own ``POST /predict`` ``{"inputs": {name: nested lists}}``;
- the Open Inference Protocol's ``POST /v2/models/{name}/infer`` ``{"inputs": [{"name", "shape",
  "datatype", "data"}], "outputs": [{"name"}]}``, with data as a flat (or nested) JSON list, or as
  raw little-endian bytes after the JSON header (Triton's binary tensor extension, which
  tritonclient uses by default: the ``Inference-Header-Content-Length`` header says where the
  JSON ends and each input's ``parameters.binary_data_size`` how many bytes it takes).

Answers use the same encoding as the request asked for: JSON data, or binary for the outputs
that asked for ``binary_data`` (or all, with ``parameters.binary_data_output``).

Non-finite numbers: JSON has none, so a request body with ``NaN`` or ``Infinity`` is not JSON
(400), and an input that holds NaN or an infinity in binary data is refused too (400: a model
fed one answers NaN, which helps nobody). An output that is NaN or infinite all the same
(an overflow in the model) is written as the JSON string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``, which ``float()``, numpy and tritonclient read back; the answer stays JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import RequestError
from ..export.program import BATCH

DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_BODY_BYTES = 8 * 2**20  # the limit of a signature that cannot say (and of the Python API's old callers)
JSON_BYTES_PER_VALUE = 32  # generous: "-1.2345678901234567e-308, " with indentation
BODY_OVERHEAD_BYTES = 64 * 2**10  # names, shapes, datatypes, whitespace of one request
MAX_DERIVED_BODY_BYTES = 256 * 2**20
_FLOAT_KINDS, _INT_KINDS, _BOOL_KINDS = "iuf", "iu", "b"  # numpy dtype kinds each input dtype accepts

# signature dtype -> Open Inference Protocol datatype (and the numpy dtype of its binary form)
DATATYPES: dict[str, tuple[str, str]] = {
    "bool": ("BOOL", "bool"),
    "uint8": ("UINT8", "<u1"),
    "int8": ("INT8", "<i1"),
    "int16": ("INT16", "<i2"),
    "int32": ("INT32", "<i4"),
    "int64": ("INT64", "<i8"),
    "float16": ("FP16", "<f2"),
    "float32": ("FP32", "<f4"),
    "float64": ("FP64", "<f8"),
}


# ==================================================================== the checks
def validate_inputs(
    body: Any, signature: Mapping[str, Any], max_batch: int = DEFAULT_MAX_BATCH
) -> dict[str, torch.Tensor]:
    """Check a decoded ``/predict`` body against the export's signature; return input tensors.

    Raises ``RequestError`` naming the first problem (a missing or unknown input, a ragged or
    non-numeric array, the wrong number of dimensions, a size other than the signature's, a
    float where integers are expected, batches of different sizes, a batch over ``max_batch``).
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("inputs"), Mapping):
        raise RequestError('the body must be a JSON object {"inputs": {name: nested lists}}')
    inputs = body["inputs"]
    expected = {i["name"]: i for i in signature["inputs"]}
    missing = [n for n in expected if n not in inputs]
    unknown = [n for n in inputs if n not in expected]
    if missing or unknown:
        raise RequestError(f"inputs must be exactly {list(expected)}; missing {missing}, unknown {unknown}")
    tensors: dict[str, torch.Tensor] = {}
    batch: int | None = None
    for name, spec in expected.items():
        try:
            array = np.asarray(inputs[name])
        except ValueError as e:  # numpy refuses ragged nested lists
            raise RequestError(f"input {name!r} is not a rectangular array ({e})") from e
        want_shape = spec["shape"]
        if array.ndim != len(want_shape):
            raise RequestError(
                f"input {name!r} has {array.ndim} dimensions {list(array.shape)}; expected {len(want_shape)}: "
                f"{want_shape}"
            )
        for axis, (got, want) in enumerate(zip(array.shape, want_shape, strict=True)):
            if want != BATCH and got != want:
                raise RequestError(
                    f"input {name!r} has shape {list(array.shape)}; expected {want_shape} (dimension {axis} must "
                    f"be {want})"
                )
        dtype = getattr(torch, spec["dtype"])
        kinds = _BOOL_KINDS if dtype == torch.bool else (_FLOAT_KINDS if dtype.is_floating_point else _INT_KINDS)
        if array.size and array.dtype.kind not in kinds:
            found = {"f": "floats", "b": "booleans", "i": "integers", "u": "integers"}.get(
                array.dtype.kind, "non-numbers"
            )
            raise RequestError(f"input {name!r} must hold {spec['dtype']} values; got {found}")
        if want_shape and want_shape[0] == BATCH:
            rows = int(array.shape[0])
            if batch is not None and rows != batch:
                raise RequestError(
                    f"every input needs the same batch size; {name!r} has {rows}, an earlier input {batch}"
                )
            batch = rows
        if array.size and array.dtype.kind in _INT_KINDS and not dtype.is_floating_point and dtype != torch.bool:
            info = torch.iinfo(dtype)
            if int(array.min()) < info.min or int(array.max()) > info.max:
                raise RequestError(
                    f"input {name!r} has values outside the range of {spec['dtype']} [{info.min}, {info.max}]"
                )
        if array.size and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise RequestError(f"input {name!r} holds NaN or infinite values; this server accepts finite numbers only")
        try:
            tensors[name] = torch.as_tensor(array).to(dtype)
        except (TypeError, RuntimeError, OverflowError) as e:
            raise RequestError(f"input {name!r} cannot be converted to {spec['dtype']}: {e}") from e
    if batch is not None and not 1 <= batch <= max_batch:
        raise RequestError(f"the batch has {batch} rows; this server accepts 1 to {max_batch}")
    return tensors


def decode_json(body: bytes) -> Any:
    """``json.loads`` with every failure a ``RequestError``; ``NaN`` and ``Infinity``, which
    Python's parser accepts and JSON does not have, are refused."""
    try:
        return json.loads(body, parse_constant=_not_json)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:  # Recursion: absurd nesting
        raise RequestError(f"the body is not valid JSON: {type(e).__name__}: {e}") from e


def _not_json(name: str) -> Any:
    raise RequestError(f"{name} is not a JSON number (send finite numbers)")


def json_values(array: np.ndarray) -> Any:
    """``array.tolist()``, with NaN and infinities as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (JSON has no such numbers)."""
    if array.dtype.kind != "f" or bool(np.isfinite(array).all()):
        return array.tolist()
    out = array.astype(object)
    out[np.isnan(array)] = "NaN"
    out[np.isposinf(array)] = "Infinity"
    out[np.isneginf(array)] = "-Infinity"
    return out.tolist()


def default_max_body_bytes(signature: Mapping[str, Any], max_batch: int) -> int:
    """The body limit a server derives from its export: the largest request the signature
    allows (``max_batch`` rows; a static batch its own), at ``JSON_BYTES_PER_VALUE`` per value
    plus ``BODY_OVERHEAD_BYTES``, capped at ``MAX_DERIVED_BODY_BYTES`` (pass ``--max_body_bytes``
    for more). Binary tensor data takes at most 8 bytes a value, so it always fits."""
    values = 0
    for spec in signature.get("inputs", []):
        shape = spec.get("shape", [])
        if any(not isinstance(d, int) for d in shape[1:]):
            return DEFAULT_MAX_BODY_BYTES
        rows = max_batch if shape and shape[0] == BATCH else (shape[0] if shape and isinstance(shape[0], int) else 1)
        values += rows * math.prod(shape[1:])
    return min(values * JSON_BYTES_PER_VALUE + BODY_OVERHEAD_BYTES, MAX_DERIVED_BODY_BYTES)


def public_signature(signature: Mapping[str, Any]) -> dict[str, Any]:
    """The signature without the exporting machine's paths: the checkpoint by its directory's
    name, the AOT compiler by its file name (what ``GET /signature`` answers by default)."""
    public = dict(signature)
    if isinstance(public.get("checkpoint"), str):
        public["checkpoint"] = public["checkpoint"].replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if isinstance(public.get("aot"), dict):
        aot = dict(public["aot"])
        if isinstance(aot.get("compiler"), str):
            aot["compiler"] = aot["compiler"].rsplit("/", 1)[-1]
        public["aot"] = aot
    return public


# ==================================================================== Open Inference Protocol
def model_metadata(signature: Mapping[str, Any], name: str, platform: str) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the signature's tensors with OIP datatypes, ``-1`` for the batch."""

    def tensors(kind: str) -> list[dict[str, Any]]:
        return [
            {
                "name": t["name"],
                "datatype": DATATYPES[t["dtype"]][0],
                "shape": [-1 if d == BATCH else int(d) for d in t["shape"]],
            }
            for t in signature[kind]
        ]

    return {
        "name": name,
        "versions": [model_version(signature)],
        "platform": platform,
        "inputs": tensors("inputs"),
        "outputs": tensors("outputs"),
    }


def model_version(signature: Mapping[str, Any]) -> str:
    """The model's version in the protocol: the exported checkpoint's global step."""
    return str(signature.get("global_step", 1))


@dataclass
class InferRequest:
    """A decoded ``/infer`` request: input tensors, which outputs to return and how."""

    inputs: dict[str, torch.Tensor]
    outputs: list[str]
    binary: set[str] = field(default_factory=set)  # outputs to send as raw bytes
    id: str | None = None

    @property
    def rows(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0]) if self.inputs else 0


def decode_infer_request(
    body: bytes, header_length: str | None, signature: Mapping[str, Any], max_batch: int = DEFAULT_MAX_BATCH
) -> InferRequest:
    """Decode and check an OIP ``/infer`` body (JSON, or JSON + binary tensors); ``RequestError`` if bad."""
    json_part, binary = _split_binary(body, header_length)
    request = decode_json(json_part)
    if not isinstance(request, Mapping) or not isinstance(request.get("inputs"), list):
        raise RequestError('the body must be a JSON object {"inputs": [{"name", "shape", "datatype", "data"}, ...]}')
    by_name = {t["name"]: t for t in signature["inputs"]}
    arrays: dict[str, Any] = {}
    offset = 0
    for item in request["inputs"]:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise RequestError('each of "inputs" must be an object with "name", "shape", "datatype" and "data"')
        name = item["name"]
        if name in arrays:
            raise RequestError(f"input {name!r} is given twice")
        if name not in by_name:
            raise RequestError(f"unknown input {name!r}; the model's inputs are {list(by_name)}")
        arrays[name], offset = _decode_tensor(item, by_name[name], binary, offset, max_batch)
    if offset != len(binary):
        raise RequestError(
            f"the binary part has {len(binary)} bytes but the inputs' binary_data_size add up to {offset}"
        )
    tensors = validate_inputs({"inputs": arrays}, signature, max_batch)
    outputs, binary_outputs = _requested_outputs(request, signature)
    request_id = request.get("id")
    return InferRequest(tensors, outputs, binary_outputs, None if request_id is None else str(request_id))


def _split_binary(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        raise RequestError(f"Inference-Header-Content-Length {header_length!r} is not a number") from None
    if not 0 < n <= len(body):
        raise RequestError(f"Inference-Header-Content-Length {n} does not fit a body of {len(body)} bytes")
    return body[:n], body[n:]


def _decode_tensor(
    item: Mapping[str, Any], spec: Mapping[str, Any], binary: bytes, offset: int, max_batch: int = DEFAULT_MAX_BATCH
) -> tuple[np.ndarray, int]:
    """One OIP input tensor as a numpy array of its declared shape; the new offset into ``binary``."""
    name = item["name"]
    datatype, np_dtype = DATATYPES[spec["dtype"]]
    if item.get("datatype") != datatype:
        raise RequestError(f"input {name!r} has datatype {item.get('datatype')!r}; the model expects {datatype}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise RequestError(f"input {name!r}: shape must be a list of non-negative integers; got {shape!r}")
    _check_shape(name, shape, spec["shape"], max_batch)  # before any size is computed from it
    count = math.prod(shape)
    params = item.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, Mapping) else None
    if size is not None:
        itemsize = np.dtype(np_dtype).itemsize
        if not isinstance(size, int) or size != count * itemsize or offset + size > len(binary):
            raise RequestError(
                f"input {name!r}: binary_data_size {size!r} does not match shape {shape} of {datatype} "
                f"({count * itemsize} bytes) or the {len(binary) - offset} bytes left in the body"
            )
        array = np.frombuffer(binary, dtype=np_dtype, count=count, offset=offset).reshape(shape).copy()  # writable
        return array, offset + size
    if "data" not in item:
        raise RequestError(f'input {name!r} has no "data" (and no binary_data_size)')
    try:
        array = np.asarray(item["data"])
    except ValueError as e:
        raise RequestError(f"input {name!r}: data is not a rectangular array ({e})") from e
    if array.size != count:
        raise RequestError(f"input {name!r}: shape {shape} holds {count} values but data has {array.size}")
    return array.reshape(shape), offset


def _check_shape(name: str, shape: list[int], want: list[Any], max_batch: int) -> None:
    """A declared shape must be the signature's (any batch up to ``max_batch``): so no product of
    it can overflow or ask for more memory than the largest request."""
    if len(shape) != len(want):
        raise RequestError(f"input {name!r} has {len(shape)} dimensions {shape}; expected {len(want)}: {want}")
    for axis, (got, dim) in enumerate(zip(shape, want, strict=True)):
        if dim == BATCH:
            if not 1 <= got <= max_batch:
                raise RequestError(f"input {name!r} has a batch of {got} rows; this server accepts 1 to {max_batch}")
        elif got != dim:
            raise RequestError(f"input {name!r} has shape {shape}; expected {want} (dimension {axis} must be {dim})")


def _requested_outputs(request: Mapping[str, Any], signature: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    names = [o["name"] for o in signature["outputs"]]
    params = request.get("parameters")
    if not isinstance(params, Mapping):
        params = {}
    all_binary = bool(params.get("binary_data_output", False))
    asked = request.get("outputs")
    if asked is None:
        return names, set(names) if all_binary else set()
    if not isinstance(asked, list) or not all(isinstance(o, Mapping) and isinstance(o.get("name"), str) for o in asked):
        raise RequestError('"outputs" must be a list of objects {"name": ...}')
    unknown = [o["name"] for o in asked if o["name"] not in names]
    if unknown:
        raise RequestError(f"unknown output(s) {unknown}; the model's outputs are {names}")
    binary = {o["name"] for o in asked if (o.get("parameters") or {}).get("binary_data", all_binary)}
    return [o["name"] for o in asked], binary


def encode_infer_response(
    request: InferRequest, outputs: Mapping[str, torch.Tensor], signature: Mapping[str, Any], model_name: str
) -> tuple[bytes, int | None]:
    """The ``/infer`` answer body, and the JSON header's length when binary outputs follow it."""
    dtypes = {o["name"]: o["dtype"] for o in signature["outputs"]}
    items, chunks = [], []
    for name in request.outputs:
        array = outputs[name].detach().cpu().numpy()
        datatype, np_dtype = DATATYPES[dtypes[name]]
        item: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if name in request.binary:
            raw = np.ascontiguousarray(array, dtype=np_dtype).tobytes()
            item["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            item["data"] = json_values(array.reshape(-1))
        items.append(item)
    answer: dict[str, Any] = {"model_name": model_name, "model_version": model_version(signature), "outputs": items}
    if request.id is not None:
        answer["id"] = request.id
    header = json.dumps(answer).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


__all__ = [
    "DATATYPES",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_BODY_BYTES",
    "InferRequest",
    "RequestError",
    "decode_infer_request",
    "decode_json",
    "default_max_body_bytes",
    "encode_infer_response",
    "json_values",
    "model_metadata",
    "model_version",
    "public_signature",
    "validate_inputs",
]
