"""Compiled artifacts that travel with the checkpoints (issue 49): captured at saves, installed on resume.

A compiled run (``RunConfig(compile="module" | "step")``) restarted on another machine would
compile everything again before its first step. ``CompileCache`` hands each save what the
compiler produced, as one bundle (``stoker.checkpoint.compiled`` stores it beside the
checkpoints and references it from each), and on resume installs the bundle the checkpoint
references before the first compiled step, so the compiler finds its caches warm.

A bundle holds:

* PyTorch's portable cache artifacts (``torch.compiler.save_cache_artifacts``, the "Mega-cache":
  the FX graph cache's compiled graphs and AOTAutograd's, on a GPU also Triton's kernels and
  autotuning results). They are recorded only while inductor's FX graph cache is on (its
  default; ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` leaves nothing to save).
* the C++ kernels inductor built on a CPU: shared libraries and their sources in its cache
  directory, which the portable artifacts leave out (a graph found in the FX graph cache still
  has its kernels built by the C++ compiler, most of a CPU compile), and the libraries of the
  vector-ISA probes built in this process (each probe library is run on the machine that loads
  it, so what it says is about that machine). Names are inductor's: a hash of the source and
  the compile command, so a library is only ever picked up for the same code and flags.

Dynamo's tracing is not carried (PyTorch has no portable form of it on 2.13): a restart still
traces the step, then finds every graph compiled.

The fingerprint (:func:`fingerprint`) says what a bundle is valid for; a bundle of another
fingerprint, or whose bytes fail their sha256, is one log line and a fresh compile.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checkpoint.compiled import CompiledBundle, checkpoint_reference, read_bundle
from ..errors import CheckpointError, StorageError
from ..storage import Location

log = logging.getLogger("stoker")

MAGIC = b"stoker-compiled/1\n"
#: a kernel file of inductor's cache directory: ``<2 chars>/c<hash>[.main].(so|cpp)``
KERNEL_RE = re.compile(r"^([0-9a-z]{2})/c([0-9a-z]{20,})(\.main)?\.(so|cpp)$")
_STARTED = time.time()  # probe libraries built after this (by this process) are carried
_installed: set[str] = set()  # kernel files this process installed from a bundle: carried on


def fingerprint(module: nn.Module, *, compile_mode: str, precision: str, device: torch.device) -> dict[str, str]:
    """What a bundle is valid for: torch and Triton versions, device kind and capability, the step's
    configuration (compile mode, precision) and the model's structure (its modules' types and its
    state's names, shapes and dtypes)."""
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "none"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        capability = f"sm_{major}{minor} {torch.cuda.get_device_name(device)}"
    elif device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
    else:
        capability = device.type
    structure = hashlib.sha256()
    for name, sub in module.named_modules():
        structure.update(f"{name}:{type(sub).__module__}.{type(sub).__qualname__}\n".encode())
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:  # no state_dict hooks
        structure.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}\n".encode())
    return {
        "torch": torch.__version__,
        "triton": triton,
        "device": device.type,
        "capability": capability,
        "compile": compile_mode,
        "precision": precision,
        "model": structure.hexdigest()[:16],
    }


def _cache_dir() -> Path:
    """Inductor's cache directory (as its ``cache_dir()``; without importing inductor when set)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.path.abspath(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def _kernel_files() -> list[str]:
    """The kernel files (relative to inductor's cache directory) this process built or loaded."""
    from torch._inductor import codecache

    root = _cache_dir()
    keys: set[str] = set()
    for cls in (codecache.CppCodeCache, codecache.CppPythonBindingsCodeCache, codecache.CppWrapperCodeCache):
        keys |= set(cls.cache)
    names = set(_installed)
    for key in keys:
        names |= {p.relative_to(root).as_posix() for p in (root / key[1:3]).glob(f"{key}.*")}
    for path in root.glob("??/c*.so"):  # the vector-ISA probes built here (not kernels: no ".main")
        if ".main." not in path.name and path.stat().st_mtime >= _STARTED:
            names |= {path.relative_to(root).as_posix(), path.with_suffix(".cpp").relative_to(root).as_posix()}
    return sorted(n for n in names if KERNEL_RE.match(n) and (root / n).is_file())


def _fresh_compiles() -> tuple[int, ...]:
    """Counts that grow when something is compiled afresh (not found in a cache)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:  # dynamo never imported: nothing compiled (and no import just to ask)
        return 0, 0, 0
    inductor, aot = utils.counters["inductor"], utils.counters["aot_autograd"]
    return inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_bypass"], aot["autograd_cache_miss"]


def pack(portable: bytes, files: dict[str, bytes]) -> bytes:
    """A bundle: ``MAGIC``, a length-prefixed JSON header (each part's name and size), the parts."""
    parts = [("portable", portable), *sorted(files.items())]
    header = json.dumps([[name, len(data)] for name, data in parts]).encode()
    return b"".join([MAGIC, struct.pack("<Q", len(header)), header, *(data for _, data in parts)])


def unpack(data: bytes) -> tuple[bytes, dict[str, bytes]]:
    """The portable artifacts and the kernel files of a bundle (``CheckpointError`` when malformed)."""
    if not data.startswith(MAGIC):
        raise CheckpointError("not a stoker compiled-artifacts bundle")
    at = len(MAGIC) + 8
    (length,) = struct.unpack("<Q", data[len(MAGIC) : at])
    parts = json.loads(data[at : at + length])
    at += length
    out: dict[str, bytes] = {}
    for name, size in parts:
        if name != "portable" and not KERNEL_RE.match(name) or not isinstance(size, int) or size < 0:
            raise CheckpointError(f"bundle part {name!r} is not a kernel file")
        out[name] = data[at : at + size]
        at += size
    if at != len(data):
        raise CheckpointError("bundle size differs from its header's")
    return out.pop("portable", b""), out


def install(data: bytes) -> int:
    """Put a bundle's kernel files in inductor's cache directory (those not there) and hot-load its
    portable artifacts; returns the number of kernel files written."""
    portable, files = unpack(data)
    root = _cache_dir()
    written = 0
    for name, content in files.items():
        target = root / name
        _installed.add(name)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_bytes(content)
        os.replace(tmp, target)  # never a half-written library where inductor looks
        written += 1
    if portable:
        torch.compiler.load_cache_artifacts(portable)
    return written


def capture() -> bytes | None:
    """This process's compiled artifacts as a bundle (``None``: nothing was compiled)."""
    saved = torch.compiler.save_cache_artifacts()
    root = _cache_dir()
    files = {name: (root / name).read_bytes() for name in _kernel_files()}
    if saved is None and not files:
        return None
    return pack(saved[0] if saved is not None else b"", files)


@dataclass
class Restored:
    """How a resume got its compiled artifacts: ``source`` (``"artifacts"`` or ``"fresh"``), why
    (``reason``, for a fresh compile), and the seconds reading and installing the bundle took."""

    source: str = "fresh"
    reason: str = "first start"
    seconds: float = 0.0


class CompileCache:
    """A compiled run's artifacts: the bundle each save carries and the one its resume installs.

    ``model`` (unwrapped), ``compile_mode``, ``precision`` and ``device`` make the fingerprint.
    """

    def __init__(self, model: nn.Module, *, compile_mode: str, precision: str, device: torch.device) -> None:
        self.fingerprint = fingerprint(model, compile_mode=compile_mode, precision=precision, device=device)
        self.restored = Restored()
        self._bundle: CompiledBundle | None = None
        self._compiled: tuple[int, ...] = ()

    def bundle(self) -> CompiledBundle | None:
        """The bundle a save carries: the one installed or captured before while nothing was
        compiled afresh since (checkpoints share it), else captured now; ``None`` before any compile."""
        if self._bundle is not None and _fresh_compiles() == self._compiled:
            return self._bundle
        compiled = _fresh_compiles()
        data = capture()
        if data is None:
            return None
        self._bundle, self._compiled = CompiledBundle(self.fingerprint, data), compiled
        return self._bundle

    def restore(self, checkpoint: Location) -> Restored:
        """Install the bundle ``checkpoint`` references, when it is valid here; else say in one
        line why the run compiles afresh. Never raises for a bundle: the compiler is the fallback."""
        start = time.perf_counter()
        self.restored = Restored(*self._restore(checkpoint))
        self.restored.seconds = time.perf_counter() - start
        return self.restored

    def _restore(self, checkpoint: Location) -> tuple[str, str]:
        try:
            ref = checkpoint_reference(checkpoint)
        except CheckpointError as e:
            log.warning("compiled artifacts of %s refused: %s; compiling afresh", checkpoint, e)
            return "fresh", "reference refused"
        if ref is None:
            return "fresh", "no artifacts in the checkpoint"
        if dict(ref.fingerprint) != self.fingerprint:
            theirs = ref.fingerprint
            differ = [f"{k} {theirs.get(k)!r} -> {v!r}" for k, v in self.fingerprint.items() if theirs.get(k) != v]
            log.info(
                "compiled artifacts of %s not used: they were compiled for another %s; compiling afresh",
                checkpoint,
                ", ".join(differ),
            )
            return "fresh", "fingerprint differs"
        model_dir = checkpoint.parent
        try:
            data = read_bundle(model_dir, ref)
            written = install(data)
        except (CheckpointError, StorageError, OSError, ValueError) as e:
            log.warning("compiled artifacts refused: %s; compiling afresh", e)
            return "fresh", "bundle refused"
        except Exception as e:  # noqa: BLE001 - torch's loader: whatever it raises, the compiler is the fallback
            log.warning("compiled artifacts could not be loaded (%s: %s); compiling afresh", type(e).__name__, e)
            return "fresh", "bundle not loadable"
        self._bundle, self._compiled = CompiledBundle(self.fingerprint, data), _fresh_compiles()
        log.info(
            "compiled artifacts loaded from %s (%.1f MB, %d kernel files written)",
            model_dir / "compiled" / ref.name,
            len(data) / 1e6,
            written,
        )
        return "artifacts", ""


__all__ = ["CompileCache", "Restored", "capture", "fingerprint", "install", "pack", "unpack"]
