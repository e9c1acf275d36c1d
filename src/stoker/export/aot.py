"""Ahead-of-time compiled serving packages: an export's program lowered by AOTInductor.

``export(..., aot=True)`` (``stoker export --aot``) compiles the exported program with
``torch._inductor.aoti_compile_and_package`` into one ``model.aoti.pt2`` beside ``model.pt2``:
generated C++ (and, for CUDA, Triton kernels) built into a shared library with the weights,
which ``torch._inductor.aoti_load_package`` runs without Python per operator and without the
model's code. Compiling needs the program only: no training data and no run of the model.

A package is tied to what built it: the device kind it was compiled for and the exact torch
version (AOTInductor's generated code and its runtime ABI change between releases). Both are
written twice: into the package's own metadata (``aot_inductor.metadata``) and into the
``aot`` entry of ``signature.json``. The sidecar is checked *before* loading, because loading
a package built for another device or torch may crash the process instead of raising;
:func:`check_package` turns that into an :class:`~stoker.errors.ExportError` that says what to
rebuild.

A package is code: loading it runs its library's constructors. The signature records the
sha256 of the package and of its library (``library_sha256``); :func:`load_package` checks both
(:mod:`stoker.export.trust`) and loads a private copy of the bytes it checked. That proves the
package is the one exported, not that the exporter is to be trusted. See docs/export.md.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import ExportError
from .trust import LIBRARY_KEY, library_hashes, vet_package

AOT_FILE = "model.aoti.pt2"
AOT_FORMAT = "stoker-aot/1"
AOT_DEVICES: tuple[str, ...] = ("cpu", "cuda")


def compiler_names() -> list[str]:
    """The compilers AOTInductor looks for, in order: its ``cpp.cxx`` setting, which torch fills
    from ``$CXX`` when it is first imported, else ``g++`` (``clang++`` on macOS)."""
    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx
    return [str(c) for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]


def find_cxx() -> str | None:
    """The path of the C++ compiler AOTInductor will call, or ``None`` when it has none."""
    return next((found for name in compiler_names() if (found := shutil.which(name))), None)


def require_cxx() -> str:
    """The compiler's path, or an ``ExportError`` that says how to get one."""
    cxx = find_cxx()
    if cxx is None:
        raise ExportError(
            f"aot=True (stoker export --aot) compiles C++ and needs a C++ compiler, but "
            f"{' / '.join(compiler_names()) or 'none'} (what torch looks for: $CXX as it was when torch was "
            "imported, else g++) is not on PATH; install one (e.g. apt-get install g++) or set CXX before "
            "starting Python, or export without --aot"
        )
    return cxx


def check_device(device: str) -> None:
    """Refuse an AOT device this process cannot compile and check for (the package is loaded back once)."""
    if device not in AOT_DEVICES:
        raise ExportError(f"aot_device must be one of {', '.join(AOT_DEVICES)}; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ExportError(
            "aot_device='cuda' needs a CUDA device in the exporting process (the package is "
            "compiled for it and loaded back to check it); export with aot_device='cpu' here"
        )


def compile_package(program: torch.export.ExportedProgram, path: Path, device: str) -> dict[str, Any]:
    """Compile ``program`` (traced on ``device``) into the package ``path``; return its sidecar entry."""
    cxx = require_cxx()
    check_device(device)
    info = {"format": AOT_FORMAT, "file": path.name, "device": device, "torch_version": torch.__version__}
    start = time.perf_counter()
    try:
        torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(path),
            inductor_configs={"aot_inductor.metadata": {f"stoker_{k}": v for k, v in info.items()}},
        )
    except Exception as e:  # noqa: BLE001 - inductor fails in many ways (codegen, the C++ build)
        raise ExportError(
            f"AOTInductor could not compile the exported program, so nothing was written (the "
            f"torch.export step worked: export without --aot for model.pt2 alone): {type(e).__name__}: {e}"
        ) from e
    libraries = library_hashes(path.read_bytes(), path)  # checked before the library is ever opened again
    return {
        **info,
        "compiler": Path(cxx).name,
        "compile_s": round(time.perf_counter() - start, 3),
        LIBRARY_KEY: libraries,
    }


def check_package(info: Mapping[str, Any], where: Path) -> None:
    """Refuse a package this process cannot run: another format, a device it lacks, another torch."""
    if info.get("format") != AOT_FORMAT:
        raise ExportError(
            f"{where}: the AOT package has format {info.get('format')!r}; this stoker reads {AOT_FORMAT!r}"
        )
    device = info.get("device")
    if device not in AOT_DEVICES:
        raise ExportError(
            f"{where}: the AOT package was compiled for device {device!r}, which this stoker does not know"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise ExportError(
            f"{where}: the AOT package was compiled for cuda and this process has no CUDA device; "
            "serve model.pt2 instead, or re-export with --aot --aot_device cpu"
        )
    if info.get("torch_version") != torch.__version__:
        raise ExportError(
            f"{where}: the AOT package was compiled with torch {info.get('torch_version')} and this is "
            f"torch {torch.__version__}; AOTInductor packages run only on the torch that built them: "
            "re-export with stoker export --aot here, or serve model.pt2"
        )


def load_package(data: bytes, info: Mapping[str, Any], where: Path) -> Callable[..., Any]:
    """Check ``info`` (the signature's ``aot`` entry) and the package's bytes (its library's hash,
    nothing but a compiled model in it), load those bytes from a private copy, and check the
    package's embedded metadata. ``data`` must already match the signature's sha256."""
    check_package(info, where)
    vet_package(data, info, where)
    with tempfile.TemporaryDirectory(prefix="stoker-aot-") as tmp:  # mode 0700: nobody swaps the bytes
        private = Path(tmp) / AOT_FILE
        private.write_bytes(data)
        runner = torch._inductor.aoti_load_package(str(private))  # extracts the library, then dlopens it
    embedded = runner.get_metadata()
    for key in ("device", "torch_version"):
        if embedded.get(f"stoker_{key}") != info.get(key):
            raise ExportError(
                f"{where}: the package says {key}={embedded.get(f'stoker_{key}')!r} but signature.json "
                f"says {info.get(key)!r}; the files are from different exports: export again"
            )
    return runner


__all__ = [
    "AOT_DEVICES",
    "AOT_FILE",
    "AOT_FORMAT",
    "check_device",
    "check_package",
    "compile_package",
    "find_cxx",
    "load_package",
    "require_cxx",
]
