"""read_header: a GGUF file's metadata and tensor table, parsed from its first bytes.

Layout (GGUF v2 and v3, little-endian): the magic `GGUF`, a u32 version, u64 tensor and
key-value counts; each key-value pair is a string key, a u32 value type and the value
(strings are a u64 length and UTF-8 bytes; arrays a u32 element type, a u64 count and the
elements); each tensor is a string name, a u32 dimension count, u64 dimensions (the
fastest-varying first), a u32 `GGMLQuantizationType` and a u64 offset into the data, which
starts at the first multiple of `general.alignment` (default 32) after the table.

Our own parser, because `gguf.GGUFReader` builds a numpy view per string and per field part:
2-3 s for a tokenizer of 49,152 tokens, against about 0.1 s here. Values come back as
`GGUFReader`'s `contents()` gives them: Python numbers, str, bool, and lists for arrays.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

# value type -> (struct format, numpy dtype) for the fixed-size ones
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16),
            3: ("<h", np.int16), 4: ("<I", np.uint32), 5: ("<i", np.int32),
            6: ("<f", np.float32), 7: ("<?", np.bool_), 10: ("<Q", np.uint64),
            11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
FIRST_READ = 8 << 20  # bytes read for the header at first (then 4x more until it fits)


class TensorInfo(msgspec.Struct, frozen=True):
    name: str
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first
    tensor_type: int  # a GGMLQuantizationType value (unknown ones kept as numbers)
    data_offset: int  # from the file's start
    n_bytes: int  # 0 for a type this gguf package does not know


class GGUFHeader(msgspec.Struct, frozen=True):
    version: int
    meta: dict[str, Any]
    tensors: list[TensorInfo]


class _Short(Exception):
    """The header goes on past the bytes read so far."""


# (buf, at, count) -> `count` strings from buf[at] joined by NULs, and the offset after the
# last (npu.engine.convert.strings_joined, in C); ValueError where they run past the end
Walk = Callable[[bytes, int, int], "tuple[bytes, int] | None"]


class _Cursor:
    __slots__ = ("buf", "at", "walk")

    def __init__(self, buf: bytes, walk: Walk | None = None) -> None:
        self.buf, self.at, self.walk = buf, 0, walk

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.at)
        except struct.error:
            raise _Short from None
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        end = self.at + n
        if end > len(self.buf):
            raise _Short
        text = self.buf[self.at : end].decode("utf-8")
        self.at = end
        return text

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row (a tokenizer's 50-250k tokens and merges): joined by
        NULs (`walk`'s C, else their offsets found in a Python loop and the lengths masked
        out at once), decoded at once and split again (the string by string loop where one
        holds a NUL itself)."""
        first = self.at
        if count > (len(self.buf) - first) // 8:  # each takes 8 bytes at least
            raise _Short
        if count < 64:
            starts, self.at = self._walk(count)
            return self._one_by_one(first, count)
        joined = None
        if self.walk is not None:
            try:
                joined = self.walk(self.buf, first, count)
            except ValueError:
                raise _Short from None
        if joined is not None:
            data, self.at = joined
        else:
            starts, self.at = self._walk(count)
            region = np.frombuffer(self.buf, dtype=np.uint8, count=self.at - first,
                                   offset=first).copy()
            prefixes = starts - 8 - first
            keep = np.ones(region.size, dtype=bool)
            keep[(prefixes[:, None] + np.arange(8)).ravel()] = False
            seps = prefixes[1:] + 7  # each later string's length's last byte becomes a NUL
            region[seps], keep[seps] = 0, True
            data = region[keep].tobytes()
        out = data.decode("utf-8").split("\0")
        return out if len(out) == count else self._one_by_one(first, count)

    def _walk(self, count: int) -> tuple[np.ndarray, int]:
        buf, at, length = self.buf, self.at, _U64.unpack_from
        starts = np.empty(count, dtype=np.int64)
        try:
            for i in range(count):
                starts[i] = at + 8
                at += 8 + length(buf, at)[0]
        except struct.error:
            raise _Short from None
        if at > len(buf):
            raise _Short
        return starts, at

    def _one_by_one(self, at: int, count: int) -> list[str]:
        buf, length = self.buf, _U64.unpack_from
        out = []
        for _ in range(count):
            n = length(buf, at)[0]
            out.append(buf[at + 8 : at + 8 + n].decode("utf-8"))
            at += 8 + n
        return out

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == _STRING:
                return self.strings(count)
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item][1]).newbyteorder("<")
                size = dtype.itemsize * count
                if self.at + size > len(self.buf):
                    raise _Short
                out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.at)
                self.at += size
                return out.tolist()
            return [self.value(item) for _ in range(count)]  # arrays of arrays
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        return self.unpack(_SCALARS[kind][0])


def _n_bytes(shape: tuple[int, ...], tensor_type: int) -> int:
    try:
        block, size = GGML_QUANT_SIZES[QT(tensor_type)]
    except (ValueError, KeyError):
        return 0
    return int(np.prod(shape, dtype=np.int64)) // block * size


def read_header(path: Path, *, walk: Walk | None = None) -> GGUFHeader:
    """The metadata and tensor table of the GGUF file `path`; `walk`: joins long runs of
    strings (npu.engine.convert.strings_joined: C, a tokenizer's 30 ms sooner).

    Raises:
        ValueError: not a GGUF file, or its header is cut short or malformed.
        OSError: the file cannot be opened.
    """
    size = FIRST_READ
    with open(path, "rb") as f:
        while True:
            f.seek(0)
            buf = f.read(size)
            try:
                return _parse(buf, walk)
            except _Short:
                if len(buf) < size:  # the whole file was read
                    raise ValueError("the header is cut short (truncated file)") from None
                size *= 4


def _parse(buf: bytes, walk: Walk | None = None) -> GGUFHeader:
    c = _Cursor(buf, walk)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"bad magic {bytes(buf[:4])!r} (a GGUF file starts with b'GGUF')")
    c.at = 4
    version = c.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (this reader knows 2 and 3)")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.unpack("<I"))
    table = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(c.unpack("<Q") for _ in range(c.unpack("<I")))
        table.append((name, dims, c.unpack("<I"), c.unpack("<Q")))
    align = int(meta.get("general.alignment", 32))
    start = -(-c.at // align) * align
    tensors = [TensorInfo(name, dims, kind, start + offset, _n_bytes(dims, kind))
               for name, dims, kind, offset in table]
    return GGUFHeader(version, meta, tensors)
