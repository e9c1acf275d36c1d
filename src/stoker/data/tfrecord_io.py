"""TFRecord files without TensorFlow: record framing (read and write) and ``tf.train.Example``
messages.

**Framing** (TensorFlow's ``core/lib/io/record_writer``): each record is ``uint64 length``
(little-endian), ``uint32 masked crc32c(length)``, the data, ``uint32 masked crc32c(data)``.
Both checksums are verified on every read (``google_crc32c``, in C); a bad checksum, a
truncated record or a length that disagrees with the index raises a
:class:`~stoker.data.DataError` naming the file, the record number, its byte offset and what
is wrong.

**Examples** are parsed by protobuf's own runtime from the message definitions of TensorFlow's
``core/example/feature.proto`` and ``example.proto`` (``Example``, ``Features``, ``Feature``,
``BytesList``, ``FloatList``, ``Int64List``, field for field), declared in a private descriptor
pool: tensorboard ships no ``example_pb2``, and the ``tfrecord`` package's registers the
``tensorflow.*`` names in protobuf's default pool, which makes a process that also imports
TensorFlow fail with "duplicate symbol" whichever is imported first. A private pool coexists
with TensorFlow; the wire format is the same (a test reads records TensorFlow wrote).

The per-shard offset index that reads records by number: :mod:`stoker.data.tfrecord_index`.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import google_crc32c

from ..errors import UserCodeError
from .base import DataError

_HEADER = struct.Struct("<QI")  # length, masked crc32c of the 8 length bytes
_FOOTER = 4  # masked crc32c of the data
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's masked CRC-32C of ``data`` (rotate right by 15, add a constant)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """``data`` as one framed TFRecord: length, its checksum, the data, its checksum."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def write_tfrecords(path: str | os.PathLike[str], records: Iterable[bytes]) -> int:
    """Write ``records`` (raw bytes each, e.g. serialised ``tf.train.Example`` s) as a TFRecord
    file readable by TensorFlow's ``TFRecordDataset``; returns how many were written.

    The file is written under a hidden temporary name and renamed when complete, so a reader
    globbing ``train-*-of-*`` never sees a half-written shard.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    count = 0
    try:
        with open(tmp, "wb") as f:
            for data in records:
                f.write(frame_record(bytes(data)))
                count += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _where(path: str | os.PathLike[str], index: int, offset: int) -> str:
    return f"TFRecord file {path}: record {index} at byte {offset}"


def _check_header(head: bytes, path: str | os.PathLike[str], index: int, offset: int) -> int:
    """The data length of a record from its 12 header bytes, its checksum verified."""
    if len(head) < _HEADER.size:
        raise DataError(
            f"{_where(path, index, offset)}: truncated: the file ends {len(head)} bytes into the "
            f"{_HEADER.size}-byte record header"
        )
    length, stored = _HEADER.unpack_from(head)
    computed = masked_crc32c(head[:8])
    if computed != stored:
        raise DataError(
            f"{_where(path, index, offset)}: corrupt length field: length checksum mismatch "
            f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
        )
    return int(length)


def _check_data(data: bytes, stored: int, path: str | os.PathLike[str], index: int, offset: int) -> None:
    computed = masked_crc32c(data)
    if computed != stored:
        raise DataError(
            f"{_where(path, index, offset)}: corrupt data: data checksum mismatch "
            f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
        )


def read_record(fd: int, path: str | os.PathLike[str], index: int, offset: int, length: int) -> bytes:
    """The data of record ``index`` of the open file ``fd`` (one ``pread``), both checksums checked."""
    return check_record(os.pread(fd, _HEADER.size + length + _FOOTER, offset), path, index, offset, length)


def check_record(buf: bytes, path: str | os.PathLike[str], index: int, offset: int, length: int) -> bytes:
    """The data of record ``index`` from ``buf``, its framed bytes read from ``offset`` (fewer when
    the file ends sooner), both checksums checked."""
    want = _HEADER.size + length + _FOOTER
    if len(buf) < _HEADER.size:
        _check_header(buf, path, index, offset)  # raises: truncated header
    stored_length = _check_header(buf[: _HEADER.size], path, index, offset)
    if stored_length != length:
        raise DataError(
            f"{_where(path, index, offset)}: wrong length: the record says {stored_length} bytes, its index "
            f"{length}; the file changed after it was indexed"
        )
    if len(buf) < want:
        raise DataError(
            f"{_where(path, index, offset)}: truncated: the record needs {want} bytes, the file holds "
            f"{len(buf)} from there"
        )
    data = buf[_HEADER.size : _HEADER.size + length]
    _check_data(data, int.from_bytes(buf[-_FOOTER:], "little"), path, index, offset)
    return data


def read_tfrecords(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Every record of a TFRecord file in order, both checksums checked (no index)."""
    with open(path, "rb") as f:
        offset, index = 0, 0
        while head := f.read(_HEADER.size):
            length = _check_header(head, path, index, offset)
            body = f.read(length + _FOOTER)
            if len(body) < length + _FOOTER:
                raise DataError(
                    f"{_where(path, index, offset)}: truncated: the record needs {_HEADER.size + length + _FOOTER} "
                    f"bytes, the file holds {_HEADER.size + len(body)} from there"
                )
            data = body[:length]
            _check_data(data, int.from_bytes(body[length:], "little"), path, index, offset)
            yield data
            offset += _HEADER.size + length + _FOOTER
            index += 1


# ---------------------------------------------------------------------- tf.train.Example


@functools.cache
def example_class() -> Any:
    """The ``tf.train.Example`` message class (protobuf's runtime, private pool; see the module doc)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="stoker/tensorflow_core_example.proto", package="tensorflow", syntax="proto3"
    )

    def message(name: str, fields: Sequence[tuple[str, int, int, int, str]], into: Any = file) -> Any:
        m = into.message_type.add(name=name) if into is file else into.nested_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            field = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                field.type_name = type_name
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", [("value", 1, rep, F.TYPE_BYTES, "")])
    message("FloatList", [("value", 1, rep, F.TYPE_FLOAT, "")]).field[0].options.packed = True
    message("Int64List", [("value", 1, rep, F.TYPE_INT64, "")]).field[0].options.packed = True
    feature = message(
        "Feature",
        [
            ("bytes_list", 1, opt, F.TYPE_MESSAGE, ".tensorflow.BytesList"),
            ("float_list", 2, opt, F.TYPE_MESSAGE, ".tensorflow.FloatList"),
            ("int64_list", 3, opt, F.TYPE_MESSAGE, ".tensorflow.Int64List"),
        ],
    )
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", [("feature", 1, rep, F.TYPE_MESSAGE, ".tensorflow.Features.FeatureEntry")])
    entry = message(
        "FeatureEntry",
        [("key", 1, opt, F.TYPE_STRING, ""), ("value", 2, opt, F.TYPE_MESSAGE, ".tensorflow.Feature")],
        into=features,
    )
    entry.options.map_entry = True
    message("Example", [("features", 1, opt, F.TYPE_MESSAGE, ".tensorflow.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def make_example(
    features: Mapping[str, bytes | int | float | Sequence[bytes] | Sequence[int] | Sequence[float]],
) -> bytes:
    """A serialised ``tf.train.Example``: ``bytes`` values become a ``bytes_list``, ``int`` s an
    ``int64_list``, ``float`` s a ``float_list`` (a single value or a list; an empty list is an
    empty ``float_list``)."""
    example = example_class()()
    for key, value in features.items():
        values: list[Any] = [value] if isinstance(value, (bytes, int, float)) else list(value)
        feature = example.features.feature[key]
        if values and all(isinstance(v, bytes) for v in values):
            feature.bytes_list.value.extend(values)
        elif values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            feature.int64_list.value.extend(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            feature.float_list.value.extend(float(v) for v in values)
        else:
            raise UserCodeError(f"make_example: {key!r} mixes types or holds a {type(values[0]).__name__}")
    return bytes(example.SerializeToString())


__all__ = [
    "example_class",
    "frame_record",
    "make_example",
    "masked_crc32c",
    "read_record",
    "read_tfrecords",
    "write_tfrecords",
]
