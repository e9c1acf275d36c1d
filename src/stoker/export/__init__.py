"""Exporting a trained model: ``torch.export`` programs, safetensors weights, AOTInductor packages, ``stoker export``.

Owns :mod:`~stoker.export.program` (:func:`export` writes the PREDICT computation of an
Estimator's best or newest checkpoint as ``model.pt2`` + ``model.safetensors`` +
``signature.json``, optionally ONNX; :func:`load_exported` reads it back),
:mod:`~stoker.export.aot` (AOTInductor packages: compile, check, load) and the command
(:mod:`~stoker.export.cli`). It may import the engine's :class:`~stoker.engine.model_state.ModelState`,
:mod:`stoker.checkpoint`, :mod:`stoker.storage` and ``stoker.run_spec``; the command alone loads
the run-spec providers that recipes and the harness register. See docs/export.md.
"""

from .aot import AOT_DEVICES, AOT_FILE
from .program import (
    BATCH,
    EXPORT_FORMAT,
    FORMATS,
    ONNX_FILE,
    PROGRAM_FILE,
    SIGNATURE_FILE,
    WEIGHTS_FILE,
    ExportedModel,
    ExportError,
    PredictModule,
    export,
    load_exported,
    onnx_available,
)

__all__ = [
    "AOT_DEVICES",
    "AOT_FILE",
    "BATCH",
    "EXPORT_FORMAT",
    "FORMATS",
    "ONNX_FILE",
    "PROGRAM_FILE",
    "SIGNATURE_FILE",
    "WEIGHTS_FILE",
    "ExportError",
    "ExportedModel",
    "PredictModule",
    "export",
    "load_exported",
    "onnx_available",
]
