"""Export a trained model for serving: a ``torch.export`` program, safetensors weights, a signature.

What is exported is the PREDICT-mode computation of ``model_fn``: the module
``features -> model_fn(model, features, None, PREDICT, params).predictions``, with the weights
of one checkpoint baked in. An export directory holds::

    export_dir/
      model.pt2          torch.export program; torch.export.load("model.pt2").module()(*inputs) -> dict
      model.safetensors  the model's weights (the same tensors as the checkpoint's), readable without stoker
      signature.json     input / output names, dtypes and shapes ("batch" marks the dynamic dimension),
                         the checkpoint, versions, and the largest difference from eager seen when exporting
      model.onnx         only with formats=("pt2", "onnx") and the onnx + onnxscript packages installed
      model.aoti.pt2     only with aot=True: the program compiled by AOTInductor (see stoker.export.aot);
                         torch._inductor.aoti_load_package("model.aoti.pt2")(*inputs) -> dict

Which weights: the ``checkpoint_path`` given; else the best checkpoint of ``model_dir`` when
``RunConfig.keep_best`` has chosen one; else the newest; else (no checkpoint at all) the
weights in the Estimator's memory. With ``RunConfig.ema`` (``use_for_inference``) that
checkpoint's (or memory's) moving average of them, once it has started.

The ``run_spec.json`` convention (how a recipe or harness records in its ``model_dir`` how to
rebuild the model) lives in :mod:`stoker.run_spec`, with the registry of builders by kind. The
``stoker export MODEL_DIR`` command is :mod:`stoker.export.cli`.
See docs/export.md.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Protocol

import torch
from torch import nn

from .. import storage
from .._version import __version__
from ..checkpoint.manager import INDEX_NAME, CheckpointManager, model_state_to_bytes
from ..engine.model_state import ModelState
from ..errors import ConfigError, ExportError
from ..spec import EstimatorSpec, ModeKeys
from .aot import AOT_FILE, check_device, compile_package, load_package, require_cxx
from .trust import SHA256_KEY, expected_hashes, file_sha256, read_verified, vet_program


class Exportable(Protocol):
    """What ``export`` reads of a ``stoker.Estimator`` (not imported here: the Estimator imports
    this module for ``Estimator.export``, and stoker's modules form no import circle)."""

    model_fn: Callable[..., EstimatorSpec]
    params: dict[str, Any]
    state: ModelState

    @property
    def model(self) -> nn.Module: ...

    @property
    def model_dir(self) -> str | None: ...

    @property
    def global_step(self) -> int: ...


log = logging.getLogger("stoker")

EXPORT_FORMAT = "stoker-export/1"
PROGRAM_FILE = "model.pt2"
WEIGHTS_FILE = "model.safetensors"
SIGNATURE_FILE = "signature.json"
ONNX_FILE = "model.onnx"
FORMATS: tuple[str, ...] = ("pt2", "onnx")
BATCH = "batch"  # the name of the dynamic first dimension in signature.json shapes


# ==================================================================== the exported module
class PredictModule(nn.Module):
    """``model_fn`` in PREDICT mode as a module: flat input tensors -> dict of predictions.

    ``structure`` says how the flat tensors form ``features``: ``None`` for one tensor, a
    tuple of keys for a dict, or an int (the length) for a tuple.
    """

    def __init__(
        self,
        model: nn.Module,
        model_fn: Callable[..., EstimatorSpec],
        params: dict[str, Any],
        structure: tuple[str, ...] | int | None,
    ) -> None:
        super().__init__()
        self.model = model
        self.model_fn = model_fn
        self.params = params
        self.structure = structure

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.structure is None:
            features: Any = inputs[0]
        elif isinstance(self.structure, int):
            features = tuple(inputs)
        else:
            features = dict(zip(self.structure, inputs, strict=True))
        # a fresh dict per call: model_fn may write into params (the cache), the export must not keep it
        spec = self.model_fn(self.model, features, None, ModeKeys.PREDICT, dict(self.params))
        preds = spec.predictions
        if isinstance(preds, torch.Tensor):
            return {"predictions": preds}
        if not isinstance(preds, Mapping) or not preds:
            raise ExportError("model_fn returned no predictions dict in PREDICT mode; there is nothing to export")
        return dict(preds)


def _flatten_features(features: Any) -> tuple[list[str], list[torch.Tensor], tuple[str, ...] | int | None]:
    """Input names, tensors and structure of ``example_features`` (a tensor, a flat dict or a tuple)."""
    if isinstance(features, torch.Tensor):
        return ["features"], [features], None
    if isinstance(features, Mapping):
        names = [str(k) for k in features]
        tensors = list(features.values())
        structure: tuple[str, ...] | int | None = tuple(names)
    elif isinstance(features, (tuple, list)):
        names = [f"features_{i}" for i in range(len(features))]
        tensors = list(features)
        structure = len(tensors)
    else:
        raise ExportError(
            f"example_features must be a tensor, a dict of tensors or a tuple of tensors; got {type(features).__name__}"
        )
    bad = [n for n, t in zip(names, tensors, strict=True) if not isinstance(t, torch.Tensor)]
    if bad or not tensors:
        raise ExportError(f"example_features must hold tensors only; not tensors: {bad or 'no inputs at all'}")
    return names, tensors, structure


# ==================================================================== export
def export(
    estimator: Exportable,
    export_dir: str | os.PathLike[str],
    example_features: Any,
    dynamic_batch: bool = True,
    formats: Sequence[str] = ("pt2",),
    *,
    checkpoint_path: str | os.PathLike[str] | None = None,
    aot: bool = False,
    aot_device: str = "cpu",
) -> storage.Location:
    """Export ``estimator``'s PREDICT computation to ``export_dir``; return its path (a ``UrlPath`` for a URL).

    Args:
        estimator: the trained ``Estimator``.
        export_dir: the directory to create. An existing one is replaced only if it is empty or
            holds an earlier export (a ``signature.json``); the new export is written beside it
            and renamed into place, so a crash never leaves a half export.
        example_features: one batch of features as ``predict``'s ``input_fn`` would give them
            (a tensor, a flat dict of tensors, or a tuple of tensors); the batch's values do not
            matter, only shapes and dtypes.
        dynamic_batch: export the first dimension of every input as dynamic (any batch >= 1);
            ``False`` fixes it to the example's batch size.
        formats: ``"pt2"`` (always written) and optionally ``"onnx"`` (needs ``onnx`` and ``onnxscript``).
        checkpoint_path: the checkpoint to export (a ``ckpt-<step>`` dir or a model_dir);
            default: the best checkpoint, else the newest, else the weights in memory.
        aot: also compile the program with AOTInductor into ``model.aoti.pt2`` (needs a C++
            compiler; the signature's ``aot`` entry records the device and torch version it runs on).
        aot_device: ``"cpu"`` or ``"cuda"``: the device the package is compiled for.
    """
    package_device = aot_device if aot else None  # where the AOT package runs; None: no package
    formats = _check_request(estimator, formats, package_device)
    target = storage.location(export_dir)
    _check_target(target)
    names, tensors, structure = _flatten_features(example_features)
    tensors = _example_batch(tensors, dynamic_batch)
    weights = _load_weights(estimator, checkpoint_path)
    with estimator.state.inference_weights() as averaged:  # RunConfig.ema's average, where it asks so
        module = _predict_module(estimator, structure, batch_size=int(tensors[0].shape[0]))
    if averaged:
        weights = (weights[0], weights[1], f"{weights[2]}, EMA weights")
    traced = _trace(module, names, tensors, dynamic_batch)
    # An export to an fsspec URL is built in a local directory, then uploaded (signature last).
    staging: Path | None = None
    if isinstance(target, storage.UrlPath):
        staging = Path(tempfile.mkdtemp(prefix="stoker-export-"))
        local_dir = staging / "export"
    else:
        local_dir = target
    try:
        files = _write_export(local_dir, traced, weights, formats, package_device)
        if isinstance(target, storage.UrlPath):
            for name in [*files, SIGNATURE_FILE]:  # the signature last: an export is complete once it is there
                storage.upload(local_dir / name, target / name)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    source, step, which = weights
    log.info(
        "exported %s (step %d, %s) to %s: %s", source or "the weights in memory", step, which, target, ", ".join(files)
    )
    return target


@dataclass(frozen=True)
class _Traced:
    """The traced computation: the eager module, its ``torch.export`` program, the example inputs
    (names and CPU tensors) it was traced with, and the eager outputs on them."""

    module: PredictModule
    program: torch.export.ExportedProgram
    names: list[str]
    tensors: list[torch.Tensor]
    dynamic_shapes: Any
    eager: dict[str, torch.Tensor]

    @property
    def dynamic_batch(self) -> bool:
        return self.dynamic_shapes is not None


def _check_request(estimator: Exportable, formats: Sequence[str], aot_device: str | None) -> tuple[str, ...]:
    """Refuse what cannot be exported before any work; return the formats to write (``pt2`` first).

    ``aot_device``: the device of the AOT package asked for, ``None`` for none.
    """
    if estimator.state.pipeline_stages > 1:
        raise ExportError(
            "export: this process holds only some pipeline stages; export from one process (the same program "
            "without torchrun runs the model unsplit and reads the pipelined checkpoint)"
        )
    formats = tuple(dict.fromkeys(("pt2", *formats)))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ConfigError(f"export: unknown format(s) {unknown}; choose from {', '.join(FORMATS)}")
    if "onnx" in formats:
        _require_onnx()
    if aot_device is not None:  # a missing compiler or device should not cost a trace first
        require_cxx()
        check_device(aot_device)
    return formats


def _example_batch(tensors: list[torch.Tensor], dynamic_batch: bool) -> list[torch.Tensor]:
    """The example inputs to trace with, on the CPU: one batch size, at least two rows when it is dynamic."""
    rows = {t.shape[0] for t in tensors if t.dim()}
    if len(rows) != 1 or any(not t.dim() for t in tensors):
        raise ExportError(
            "every example input needs the same batch size as its first dimension; got shapes "
            f"{[list(t.shape) for t in tensors]}"
        )
    if dynamic_batch and next(iter(rows)) < 2:
        # torch.export specialises a dimension of size 1 (broadcasting could depend on it), so
        # trace with two rows: the program still accepts a batch of one.
        tensors = [t.repeat(2, *([1] * (t.dim() - 1))) for t in tensors]
    return [t.detach().cpu() for t in tensors]


def _predict_module(
    estimator: Exportable, structure: tuple[str, ...] | int | None, *, batch_size: int
) -> PredictModule:
    """A :class:`PredictModule` over a CPU copy of the estimator's model, in eval mode."""
    # A CPU copy: the export does not depend on where the Estimator trains, and leaves it alone.
    model = copy.deepcopy(estimator.model).to("cpu").eval()
    params = dict(estimator.params)
    params.update(batch_size=batch_size, num_replicas=1, replica_index=0, cache=None)
    return PredictModule(model, estimator.model_fn, params, structure).eval()


def _trace(module: PredictModule, names: list[str], tensors: list[torch.Tensor], dynamic_batch: bool) -> _Traced:
    """Run ``module`` eagerly on ``tensors`` and trace it with ``torch.export``."""
    with torch.no_grad():
        eager = module(*tensors)
    batch = torch.export.Dim(BATCH, min=1) if dynamic_batch else None
    # forward(*inputs): the varargs parameter is one entry of dynamic_shapes, a tuple per input
    dynamic_shapes = (tuple({0: batch} for _ in tensors),) if dynamic_batch else None
    try:
        program = torch.export.export(module, tuple(tensors), dynamic_shapes=dynamic_shapes)
    except Exception as e:  # noqa: BLE001 - torch.export reports many kinds of failure
        specialised = dynamic_batch and ("specialized" in str(e) or "Constraints violated" in str(e))
        hint = (
            " The model fixes the batch size somewhere (a reshape with a literal, params['batch_size']);"
            " use the batch of the input tensor, or export with dynamic_batch=False."
            if specialised
            else ""
        )
        raise ExportError(
            f"torch.export could not trace model_fn's PREDICT computation: {type(e).__name__}: {e}.{hint}"
        ) from e
    return _Traced(module, program, names, tensors, dynamic_shapes, eager)


def _write_export(
    export_dir: Path,
    traced: _Traced,
    weights: tuple[storage.Location | None, int, str],
    formats: tuple[str, ...],
    aot_device: str | None,
) -> list[str]:
    """Write the export's files beside ``export_dir`` and rename them into place; return the file names
    (the signature excepted)."""
    tmp = export_dir.parent / f".tmp-export-{export_dir.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        exported = _save_program(traced, tmp / PROGRAM_FILE)
        max_diff = _max_difference(traced.eager, exported)
        (tmp / WEIGHTS_FILE).write_bytes(model_state_to_bytes(traced.module.model.state_dict()))
        files = [PROGRAM_FILE, WEIGHTS_FILE]
        if "onnx" in formats:
            _write_onnx(traced.program, tmp / ONNX_FILE, traced.names, list(exported))
            files.append(ONNX_FILE)
        aot_info = None
        if aot_device is not None:
            aot_info = _write_aot(traced, tmp / AOT_FILE, aot_device)
            files.append(AOT_FILE)
        signature = _signature(traced, exported, files, weights, max_diff, aot_info)
        signature[SHA256_KEY] = {name: file_sha256(tmp / name) for name in files}
        (tmp / SIGNATURE_FILE).write_text(json.dumps(signature, indent=1) + "\n")
        _move_into_place(tmp, export_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files


def _save_program(traced: _Traced, path: Path) -> dict[str, torch.Tensor]:
    """Save the program at ``path`` and run it as serving reads it back; return its outputs."""
    torch.export.save(traced.program, str(path))
    # Check what serving will see: the program as load_exported reads it back (vetted first, so
    # stoker never writes an export it would refuse to load).
    module = _load_program(path.read_bytes(), path)
    try:
        with torch.no_grad():
            return module(*traced.tensors)
    except Exception as e:  # noqa: BLE001 - a program that does not load back is not an export
        raise ExportError(
            f"the saved program does not load back with torch.export.load: {type(e).__name__}: {e}"
        ) from e


def _load_program(data: bytes, where: Path) -> nn.Module:
    """The module of a ``model.pt2``'s bytes, vetted (:func:`stoker.export.trust.vet_program`) and
    then read by ``torch.export.load`` from those same bytes."""
    vet_program(data, where)
    try:
        return torch.export.load(io.BytesIO(data)).module()
    except Exception as e:  # noqa: BLE001 - torch reports damage in many ways
        raise ExportError(f"{where} does not load with torch.export.load: {type(e).__name__}: {e}") from e


def _signature(
    traced: _Traced,
    exported: Mapping[str, torch.Tensor],
    files: list[str],
    weights: tuple[storage.Location | None, int, str],
    max_diff: float,
    aot_info: dict[str, Any] | None,
) -> dict[str, Any]:
    """The contents of ``signature.json``."""
    source, step, which = weights
    dynamic_batch = traced.dynamic_batch
    return {
        "format": EXPORT_FORMAT,
        "inputs": [_describe(n, t, dynamic_batch) for n, t in zip(traced.names, traced.tensors, strict=True)],
        "outputs": [_describe(n, t, dynamic_batch) for n, t in exported.items()],
        "dynamic_batch": dynamic_batch,
        "files": files,
        "checkpoint": str(source) if source is not None else None,
        "checkpoint_choice": which,
        "global_step": step,
        "max_abs_difference_from_eager": max_diff,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "stoker_version": __version__,
        "torch_version": torch.__version__,
        **({"aot": aot_info} if aot_info is not None else {}),
    }


def _write_aot(traced: _Traced, path: Path, device: str) -> dict[str, Any]:
    """Compile the AOT package at ``path``, load it back and check it against eager; return its signature entry."""
    program, tensors = traced.program, traced.tensors
    if device != "cpu":  # the program was traced on CPU; a CUDA package needs the computation traced on CUDA
        on_device = copy.deepcopy(traced.module).to(device)
        tensors = [t.to(device) for t in tensors]
        program = torch.export.export(on_device, tuple(tensors), dynamic_shapes=traced.dynamic_shapes)
    info = compile_package(program, path, device)
    try:
        with torch.no_grad():
            got = {k: v.cpu() for k, v in load_package(path.read_bytes(), info, path)(*tensors).items()}
    except Exception as e:  # noqa: BLE001 - a package that does not load and run is not an export
        raise ExportError(f"the AOT package does not load back with aoti_load_package: {type(e).__name__}: {e}") from e
    info["max_abs_difference_from_eager"] = _max_difference(traced.eager, got)
    return info


def _load_weights(
    estimator: Exportable, checkpoint_path: str | os.PathLike[str] | None
) -> tuple[storage.Location | None, int, str]:
    """Put the weights to export into ``estimator.model``; return ``(checkpoint, step, choice)``."""
    path: storage.Location | None = None
    which = "given"
    if checkpoint_path is not None:
        path = storage.location(checkpoint_path)
    elif estimator.model_dir and storage.exists(storage.location(estimator.model_dir) / INDEX_NAME):
        manager = CheckpointManager(estimator.model_dir, writer=False)
        index = manager.index()
        best = index.best
        best_record = None if best is None else index.record(best.name)
        if best is not None and best_record is not None and storage.is_dir(manager.model_dir / best_record.directory):
            path, which = manager.model_dir / best_record.directory, f"best by {best.metric} ({best.value:.6g})"
        else:
            path, which = manager.latest_path(), "latest"
    if path is None:
        estimator.model  # noqa: B018 - builds the model (and warm-starts it) if not built yet
        if estimator.state.holds == "fresh" and estimator.state.warm_start_from is None:
            log.warning("export: no checkpoint and no training: exporting the initial (untrained) weights")
        return None, estimator.global_step, "memory"
    step, loaded = estimator.state.weights_for_inference(path, "export")
    return loaded, step, which


def _describe(name: str, tensor: torch.Tensor, dynamic_batch: bool) -> dict[str, Any]:
    shape: list[Any] = list(tensor.shape)
    if dynamic_batch and shape:
        shape[0] = BATCH
    return {"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": shape}


def _max_difference(eager: Mapping[str, torch.Tensor], exported: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference between the eager and exported outputs; raise if they disagree."""
    if list(eager) != list(exported):
        raise ExportError(f"the exported program returns {list(exported)}, the eager model_fn {list(eager)}")
    worst = 0.0
    for name, a in eager.items():
        b = exported[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ExportError(f"output {name!r}: eager {a.dtype}{list(a.shape)} but exported {b.dtype}{list(b.shape)}")
        if a.is_floating_point():
            if not torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True):
                raise ExportError(
                    f"output {name!r} of the exported program differs from eager by {(a - b).abs().max().item():.3g}"
                )
            worst = max(worst, float((a - b).abs().max()) if a.numel() else 0.0)
        elif not torch.equal(a, b):
            raise ExportError(f"output {name!r} of the exported program differs from eager")
    return worst


def _check_target(export_dir: storage.Location) -> None:
    if isinstance(export_dir, storage.UrlPath):
        names = storage.listdir(export_dir)
        if names and SIGNATURE_FILE not in names:
            raise ExportError(
                f"{export_dir} exists and is not an earlier export (no {SIGNATURE_FILE}); choose a new directory"
            )
        return
    if export_dir.exists() and (
        not export_dir.is_dir() or (any(export_dir.iterdir()) and not (export_dir / SIGNATURE_FILE).exists())
    ):
        raise ExportError(
            f"{export_dir} exists and is not an earlier export (no {SIGNATURE_FILE}); choose a new directory"
        )


def _move_into_place(tmp: Path, export_dir: Path) -> None:
    if export_dir.exists():
        trash = export_dir.parent / f".trash-export-{export_dir.name}-{uuid.uuid4().hex[:8]}"
        os.replace(export_dir, trash)
        os.replace(tmp, export_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, export_dir)


def onnx_available() -> bool:
    """Whether the packages ONNX export needs (``onnx``, ``onnxscript``) are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript"))


def _require_onnx() -> None:
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(
            f"ONNX export needs the {' and '.join(missing)} package(s), which are not installed: "
            "pip install onnx onnxscript, or export formats=('pt2',) only"
        )


def _write_onnx(
    program: torch.export.ExportedProgram, path: Path, input_names: list[str], output_names: list[str]
) -> None:
    try:
        torch.onnx.export(
            program, f=str(path), input_names=input_names, output_names=output_names, dynamo=True, external_data=False
        )
    except Exception as e:  # noqa: BLE001 - the ONNX exporter raises many kinds of errors
        raise ExportError(f"ONNX export failed (the model.pt2 export worked): {type(e).__name__}: {e}") from e


# ==================================================================== loading an export
@dataclass
class ExportedModel:
    """An export loaded for inference: call it with a dict of input tensors.

    ``module`` is the ``torch.export`` program's module, or the AOTInductor runner when the
    export was loaded with ``aot=True`` (``aot`` then holds the signature's ``aot`` entry).
    Inputs are moved to ``device``; outputs stay there. ``path`` is where it was loaded from
    (a local directory, or an fsspec URL as a :class:`~stoker.storage.UrlPath`).
    """

    path: PurePath
    signature: dict[str, Any]
    module: Callable[..., Any]
    aot: dict[str, Any] | None = None

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.signature["inputs"]]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.signature["outputs"]]

    @property
    def device(self) -> torch.device:
        """Where the model runs: the AOT package's device, else that of the program's first parameter (CPU)."""
        if self.aot is not None:
            return torch.device(self.aot["device"])
        if isinstance(self.module, nn.Module):
            return next((p.device for p in self.module.parameters()), torch.device("cpu"))
        return torch.device("cpu")

    @property
    def kind(self) -> str:
        """``"aot"`` for an AOTInductor package, ``"program"`` for the torch.export program."""
        return "program" if self.aot is None else "aot"

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        device = self.device
        with torch.inference_mode():
            return dict(self.module(*[inputs[n].to(device) for n in self.input_names]))


def _load_from_url(where: storage.UrlPath, aot: bool | None) -> ExportedModel:
    """An export at an fsspec URL, copied to a temporary directory, loaded, and the copy removed
    (torch's loaders read local files, and keep nothing open of them once loaded). The model's
    ``path`` is the URL."""
    base = where.parent if where.name == AOT_FILE else where
    with tempfile.TemporaryDirectory(prefix="stoker-export-") as tmp:
        local = Path(tmp) / base.name  # the export's own name: a server names its model after it
        local.mkdir()
        for name in storage.listdir(base):
            (local / name).write_bytes(storage.read_bytes(base / name))
        model = load_exported(local / AOT_FILE if where.name == AOT_FILE else local, aot=aot)
    model.path = base
    return model


def load_exported(export_path: str | os.PathLike[str], *, aot: bool | None = None) -> ExportedModel:
    """Load an export for inference (no model code needed).

    ``export_path`` is an export directory (``aot=True``: run its ``model.aoti.pt2``, else its
    ``model.pt2``) or the ``model.aoti.pt2`` file itself (an AOT package; its ``signature.json``
    beside it). A package compiled for another device or torch version is refused with an
    ``ExportError`` before it is loaded. An fsspec URL is copied to a local temporary
    directory first (torch's loaders read local files), which is removed once it is loaded.

    Nothing is loaded before every file's sha256 matches ``signature.json``; ``model.pt2`` is
    then inspected and refused (``ExportError``) if loading it would run code from it, and an
    AOT package's library must be the one exported (:mod:`stoker.export.trust`). An AOT package
    is code all the same: load only packages from a source you trust.
    """
    where = storage.location(export_path)
    if isinstance(where, storage.UrlPath):
        return _load_from_url(where, aot)
    path = where
    if path.is_file() and path.name == AOT_FILE:
        if aot is False:
            raise ExportError(
                f"{path} is an AOT package; aot=False asks for the torch.export program: give its directory"
            )
        path, aot = path.parent, True
    sig_path = path / SIGNATURE_FILE
    if not sig_path.exists() or not (path / PROGRAM_FILE).exists():
        raise ExportError(
            f"{path} is not a stoker export: it needs {SIGNATURE_FILE} and {PROGRAM_FILE} (run stoker export)"
        )
    try:
        signature = json.loads(sig_path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ExportError(f"{sig_path} is not JSON: {type(e).__name__}: {e}") from None
    if not isinstance(signature, dict) or signature.get("format") != EXPORT_FORMAT:
        found = signature.get("format") if isinstance(signature, dict) else type(signature).__name__
        raise ExportError(f"{sig_path} has format {found!r}; this stoker reads {EXPORT_FORMAT!r}")
    hashes = expected_hashes(signature, path)
    if aot:
        info = signature.get("aot")
        if not isinstance(info, dict) or not (path / AOT_FILE).exists():
            raise ExportError(
                f"{path} holds no AOT package ({AOT_FILE}); export it with stoker export --aot "
                "(Estimator.export(..., aot=True)), or serve model.pt2"
            )
        data = read_verified(path, hashes, [AOT_FILE])[AOT_FILE]  # every file checked, this one's bytes kept
        return ExportedModel(path, signature, load_package(data, info, path / AOT_FILE), info)
    data = read_verified(path, hashes, [PROGRAM_FILE])[PROGRAM_FILE]
    return ExportedModel(path, signature, _load_program(data, path / PROGRAM_FILE))


__all__ = [
    "AOT_FILE",
    "ExportError",
    "ExportedModel",
    "PredictModule",
    "export",
    "load_exported",
    "onnx_available",
]
