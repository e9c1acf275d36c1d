"""DCP's readers and load planners with its two unrestricted unpicklings replaced.

``torch.distributed.checkpoint`` reads a checkpoint's ``.metadata`` with the plain ``pickle.load``
and every non-tensor entry of its slices with ``torch.load(weights_only=False)``: a ``dcp/``
directory from elsewhere could run code through either. :func:`reader` decodes ``.metadata``
once, with the restricted unpickler of :mod:`stoker.distributed.dcp_metadata`, and hands DCP
that object; the planners decode entries with torch's ``weights_only`` unpickler. Both raise
``pickle.UnpicklingError`` for anything else. Imported lazily by :mod:`stoker.distributed.sharded`
(DCP is slow to import).
"""

from __future__ import annotations

import io
import pickle
from typing import Any, cast

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from .. import storage
from .dcp_metadata import load_dcp_metadata


class _VettedMetadata:
    """A DCP reader mixin whose ``read_metadata`` returns the metadata decoded (and vetted) before
    the load began: DCP never opens ``.metadata`` itself, nor falls back to a rank's own file."""

    load_id: str
    vetted: Metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        storage_meta = getattr(self.vetted, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        self.vetted.storage_meta = storage_meta
        return self.vetted


class VettedReader(_VettedMetadata, FileSystemReader):
    """DCP's local reader, with its metadata vetted."""


class VettedFsspecReader(_VettedMetadata, FsspecReader):
    """DCP's fsspec reader, with its metadata vetted."""


def read_metadata(directory: storage.Location) -> Metadata:
    """``directory/.metadata`` decoded by the restricted unpickler (``pickle.UnpicklingError`` if refused)."""
    metadata = load_dcp_metadata(storage.read_bytes(directory / ".metadata"))
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f".metadata holds a {type(metadata).__name__}, not a DCP Metadata")
    return metadata


def reader(directory: str | storage.Location) -> FileSystemReader:
    """A reader for a ``dcp/`` directory (a local path or an fsspec URL) whose metadata is read and
    vetted now, once."""
    location = storage.location(directory)
    metadata = read_metadata(location)
    vetted: FileSystemReader = (
        VettedFsspecReader(str(location)) if isinstance(location, storage.UrlPath) else VettedReader(str(location))
    )
    cast(_VettedMetadata, vetted).vetted = metadata
    return vetted


class _WeightsOnlyBytes:
    """A DCP load planner mixin: non-tensor entries through torch's ``weights_only`` unpickler."""

    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, map_location="cpu", weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class SafeLoadPlanner(_WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default load planner (into an existing state dict), without unrestricted unpickling."""


class SafeEmptyPlanner(_WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds the whole state from the metadata, without unrestricted unpickling."""


__all__ = ["SafeEmptyPlanner", "SafeLoadPlanner", "VettedFsspecReader", "VettedReader", "read_metadata", "reader"]
