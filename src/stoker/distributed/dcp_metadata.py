"""A sharded checkpoint's ``dcp/.metadata``, decoded without running code from it.

``torch.distributed.checkpoint`` writes ``.metadata`` as a pickle and reads it back with the
plain ``pickle.load``. :func:`load_dcp_metadata` reads it with an unpickler that resolves only
the globals such a file legitimately holds, each by its exact name (a dotted name would reach
through a module's attributes: ``metadata.os.system``), and checks that every slice it points
to is a file of the ``dcp/`` directory itself (a ``../`` path would read any file into the
weights); anything else raises ``pickle.UnpicklingError``.
:mod:`stoker.checkpoint.safe_load` uses it for every checkpoint it verifies, and
:mod:`stoker.distributed.safe_dcp` for every DCP load.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import torch

# Module -> the names a DCP ``.metadata`` pickle may refer to (exactly these: never "every name",
# which would include whatever the module imported, such as ``os``).
_DCP_METADATA_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),  # and dtypes, checked below
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "slice", "tuple", "list", "dict"}),
}


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the globals a DCP metadata file needs."""

    def find_class(self, module: str, name: str) -> Any:
        is_dtype = module == "torch" and "." not in name and isinstance(getattr(torch, name, None), torch.dtype)
        if not (is_dtype or name in _DCP_METADATA_GLOBALS.get(module, frozenset())):
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in checkpoint metadata")
        return super().find_class(module, name)


_SLICE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def load_dcp_metadata(data: bytes) -> Any:
    """Decode a DCP ``.metadata`` file, refusing any global it would not legitimately hold and
    any slice outside its own directory."""
    metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    storage = getattr(metadata, "storage_data", None)
    for info in (storage or {}).values() if isinstance(storage, dict) else ():
        where = getattr(info, "relative_path", None)
        if not isinstance(where, str) or not _SLICE_NAME.fullmatch(where) or where in (".", ".."):
            raise pickle.UnpicklingError(f"a slice is at {where!r}, not a file of the dcp/ directory")
    return metadata


__all__ = ["load_dcp_metadata"]
