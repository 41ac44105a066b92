"""QMatrix: a weight matrix held in a GGML block format, and what can be done with its blocks.

A matrix [rows, cols] is stored row by row (a row is cols / block_size blocks), so rows are
independent: concatenating matrices by rows, reordering rows (the Llama Q/K permutation) and
reading a few rows (embedding lookups) work on the bytes, never on a float copy.

Formats: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 are held as they are (the CPU kernels
compute them directly). The k-quants are converted at load (`to_native`, which reports a
bound on the error it made): Q4_K and Q5_K to Q4_1 and Q5_1 with their own codes (a
sub-block of 32 values is such a block whose scale and offset are products of the
super-block's f16 factors and 6-bit integers, rounded here to f16), the others (Q2_K, Q3_K,
Q6_K) to Q8_0: in C across every core (npu.engine.convert), this module's numpy code being
the reference it equals byte for byte. The numpy reference (`dequantize`) is gguf's own, the
oracle for every other backend.
"""

from __future__ import annotations

import mmap

import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as QT

from npu.errors import ModelError

NATIVE = frozenset({QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1})
# the formats the CPU kernels multiply in integer arithmetic, with 8-bit activations
INTEGER = frozenset({QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1})
CONVERTED = frozenset({QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K})
# what `quantize:` in a model's config may ask for
QUANTIZE = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0,
            "q5_1": QT.Q5_1, "f16": QT.F16, "bf16": QT.BF16}


# values converted at a time (a few MB: in the CPU's caches, 1.5-3x faster than a whole
# matrix at once, and bounded float32 copies)
CONVERT_FLOATS = 1 << 20


def row_bytes(qtype: QT, cols: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ModelError(f"{qtype.name} needs rows of a multiple of {block} values, not {cols}")
    return cols // block * size


# a k-quant held in the format of the same codes: (its super-block bytes, the format, the
# format's block bytes, the codes' largest value)
SAME_CODES = {QT.Q4_K: (144, QT.Q4_1, 20, 15), QT.Q5_K: (176, QT.Q5_1, 24, 31)}


def k_quant_as_1(data: np.ndarray, qtype: QT) -> tuple[np.ndarray, float]:
    """Q4_K or Q5_K rows as Q4_1 or Q5_1 rows with the same codes, and a bound on the error.

    A super-block holds 256 values: f16 d and dmin, twelve bytes of 6-bit scales and mins
    for its 8 sub-blocks of 32, (Q5_K: 32 bytes whose bit s of byte l is the fifth bit of
    value l of sub-block s,) then 4-bit codes: per 64 values 32 bytes whose low nibbles are
    the first sub-block, high nibbles the second. A sub-block is a Q4_1 / Q5_1 block (f16
    scale d * sc, f16 offset -dmin * m, (Q5_1: a u32 whose bit i is value i's fifth bit,)
    then value i in byte i's low nibble and value i + 16 in its high one). The f16 rounding
    of the scales and offsets is the only error (about 2^-12 of a value, against Q8_0's
    2^-8); the bound is relative to the largest value a block can hold. No value is
    computed."""
    size, _, block, _ = SAME_CODES[qtype]
    rows = data.shape[0]
    b = np.ascontiguousarray(data).reshape(-1, size)
    out = np.empty((b.shape[0], 8 * block), np.uint8)
    err = top = 0.0
    step = CONVERT_FLOATS // 256
    for at in range(0, b.shape[0], step):
        e, t = _k_blocks_as_1(qtype, b[at : at + step], out[at : at + step])
        err, top = max(err, e), max(top, t)
    return out.reshape(rows, -1), err / (top or 1.0)


def _k_blocks_as_1(qtype: QT, b: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """Super-blocks `b` [n, 144 | 176] into blocks `out` [n, 8 x (20 | 24)]; returns the
    largest error and the largest value a block can hold."""
    _, _, block, top_code = SAME_CODES[qtype]
    five = qtype == QT.Q5_K
    n = b.shape[0]
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    packed = b[:, 4:16].reshape(n, 3, 4)
    lo, hi, both = packed[:, 0], packed[:, 1], packed[:, 2]
    # sub-blocks 0-3: the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7:
    # a nibble of bytes 8-11 below the top 2 bits of bytes 0-3 (scales) and 4-7 (mins)
    sc = np.concatenate([lo & 63, (both & 15) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([hi & 63, (both >> 4) | ((hi >> 6) << 4)], axis=1)
    scale, offset = d * sc, -(dmin * mn)  # exact in float32, as llama.cpp computes them
    with np.errstate(over="ignore", invalid="ignore"):
        scale16, offset16 = scale.astype(np.float16), offset.astype(np.float16)
        err = top_code * np.abs(scale16 - scale) + np.abs(offset16 - offset)
        top = np.maximum(np.abs(offset), np.abs(offset + top_code * scale))
    blocks = out.reshape(n, 4, 2, block)  # per 64 values: two blocks
    blocks[:, :, :, 0:2] = scale16.reshape(n, 4, 2, 1).view(np.uint8)
    blocks[:, :, :, 2:4] = offset16.reshape(n, 4, 2, 1).view(np.uint8)
    if five:  # sub-block s's fifth bits: bit s of the 32 bytes, as a little-endian u32
        qh = b[:, 16:48]
        bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
        blocks[:, :, :, 4:8] = np.packbits(bits, axis=-1, bitorder="little").reshape(n, 4, 2, 4)
    # byte i of a block holds values i and i + 16: per 64 values, with a = bytes 0-15 and
    # c = bytes 16-31 of the codes, the first block is a's and c's low nibbles, the second
    # their high ones
    qs = b[:, 48 if five else 16 :].reshape(n, 4, 2, 16)
    a, c = qs[:, :, 0], qs[:, :, 1]
    nib = 8 if five else 4
    blocks[:, :, 0, nib:] = (a & 15) | (c << 4)
    blocks[:, :, 1, nib:] = (a >> 4) | (c & 0xF0)
    return float(err.max(initial=0.0)), float(top.max(initial=0.0))


def release_pages(data: np.ndarray) -> None:
    """Hand the pages under `data` back to the page cache when it is a view of a read-only
    file mapping (a GGUF file's, npu.load.mapped): its copy has been made, the process's
    resident memory drops by its size. The view stays valid (a later read faults the pages
    back in from the file). Anything else: nothing happens."""
    owner = data
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    if isinstance(owner, memoryview):  # np.frombuffer's base
        owner = owner.obj
    if not isinstance(owner, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    view = memoryview(owner)
    if not view.readonly or not data.size:
        return
    start = data.ctypes.data - np.frombuffer(owner, np.uint8, count=1).ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside `data` only
    stop = (start + data.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if stop > first:
        owner.madvise(mmap.MADV_DONTNEED, first, stop - first)


def converted_type(qtype: QT) -> QT:
    """The format `to_native` gives a matrix of `qtype`."""
    if qtype in NATIVE:
        return qtype
    return SAME_CODES[qtype][1] if qtype in SAME_CODES else QT.Q8_0


def conversion_bound(target: QT, s0: float, s1: float) -> float:
    """The C conversion's bound on its error relative to the largest value, from its stats
    (npu.engine.convert): Q8_0's s0 is the largest step d and s1 the largest value (a value
    off by at most 0.5313 d: see `QMatrix.to_native`); Q4_1 / Q5_1's s0 is the error."""
    return (0.5313 * s0 if target == QT.Q8_0 else s0) / (s1 or 1.0)


def adjacent(arrays: list[np.ndarray]) -> np.ndarray | None:
    """The arrays as one view when they are C-contiguous slices lying one after the other
    in one buffer; else None."""
    if len(arrays) < 2 or not all(a.flags.c_contiguous for a in arrays):
        return None
    owner = arrays[0].base
    if not isinstance(owner, np.ndarray) or owner.ndim != 1 or owner.dtype != np.uint8:
        return None
    at = arrays[0].ctypes.data
    for a in arrays:
        if a.base is not owner or a.ctypes.data != at:
            return None
        at += a.nbytes
    start = arrays[0].ctypes.data - owner.ctypes.data
    return owner[start : start + at - arrays[0].ctypes.data]


class QMatrix:
    """A matrix [rows, cols] in the block format `qtype`; `data` is uint8 [rows, row bytes]."""

    __slots__ = ("qtype", "shape", "data")

    def __init__(self, qtype: QT, shape: tuple[int, int], data: np.ndarray) -> None:
        rows, cols = shape
        data = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
        if data.shape[1] != row_bytes(qtype, cols):
            raise ModelError(f"{qtype.name} matrix {rows}x{cols}: {data.shape[1]} bytes a row, "
                             f"expected {row_bytes(qtype, cols)}")
        self.qtype, self.shape, self.data = qtype, (rows, cols), data

    @classmethod
    def from_float(cls, array: np.ndarray, qtype: QT = QT.F32) -> QMatrix:
        """`array` [rows, cols] in `qtype` (F32 keeps the array itself: no copy)."""
        array = np.asarray(array)
        if qtype == QT.F32:
            return cls(qtype, array.shape, np.ascontiguousarray(array, dtype=np.float32))
        return cls(qtype, array.shape, quants.quantize(np.asarray(array, np.float32), qtype))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def floats(self) -> np.ndarray | None:
        """The float32 [rows, cols] view of an F32 matrix (None for other formats)."""
        return self.data.view(np.float32) if self.qtype == QT.F32 else None

    def dequantize(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows start .. stop as a new float32 array (numpy reference)."""
        if self.qtype == QT.F32:
            return self.floats[start:stop].copy()
        return np.asarray(quants.dequantize(self.data[start:stop], self.qtype), np.float32)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows `ids` as float32 [len(ids), cols] (numpy reference)."""
        if self.qtype == QT.F32:
            return self.floats[ids]
        return np.asarray(quants.dequantize(self.data[ids], self.qtype), np.float32)

    def reorder(self, order: np.ndarray) -> QMatrix:
        """The matrix with its rows in `order` (row i of the result is row order[i])."""
        return QMatrix(self.qtype, self.shape, self.data[order])

    def to_native(self, reference: bool = False, out: np.ndarray | None = None,
                  order: np.ndarray | None = None) -> tuple[QMatrix, float]:
        """This matrix in a format the CPU kernels compute, and a bound on the conversion's
        error relative to the largest value (0.0 when it is one already); `order`: its rows
        in that order first (`reorder`).

        k-quants convert in C on every core (npu.engine.convert, byte for byte this numpy
        code's result; the rows taken in `order` as they are read), unless `reference` or
        the kernels cannot be built; `out` (uint8 [rows, the result's row bytes]): where the
        C conversion writes (`converted_type` names the format; a part of a buffer several
        matrices share, see `concat`)."""
        if self.qtype not in NATIVE and self.qtype not in CONVERTED:
            raise ModelError(f"tensor type {self.qtype.name} is not supported (supported: "
                             f"{', '.join(sorted(t.name for t in NATIVE | CONVERTED))})")
        if self.qtype in CONVERTED and not reference:
            from npu.engine.convert import convert

            done = convert(self.qtype, self.data, out=out, order=order)
            if done is not None:
                qtype, data, s0, s1 = done
                return QMatrix(qtype, self.shape, data), conversion_bound(qtype, s0, s1)
        if order is not None:
            return self.reorder(order).to_native(reference)
        if self.qtype in NATIVE:
            return self, 0.0
        if self.qtype in SAME_CODES:
            data, bound = k_quant_as_1(self.data, self.qtype)
            return QMatrix(SAME_CODES[self.qtype][1], self.shape, data), bound
        rows, cols = self.shape
        out = np.empty((rows, row_bytes(QT.Q8_0, cols)), dtype=np.uint8)
        top = 0.0
        step = max(1, CONVERT_FLOATS // cols)  # rows at a time: bounded float32 copies
        for start in range(0, rows, step):
            values = self.dequantize(start, start + step)
            out[start : start + step] = quants.quantize(values, QT.Q8_0)
            top = max(top, float(np.abs(values).max()))
        # a Q8_0 value is off by at most half its block's step d (the code's rounding)
        # plus 127 times the f16 rounding of d (2^-12 of it): 0.5313 d
        steps = out.reshape(rows, -1, 34)[:, :, :2].copy().view(np.float16)
        return QMatrix(QT.Q8_0, self.shape, out), \
            0.5313 * float(np.abs(steps).max(initial=0.0)) / (top or 1.0)

    @staticmethod
    def concat(parts: list[QMatrix]) -> QMatrix:
        """The parts stacked by rows (all of one format and width): a view where they lie
        one after the other in one buffer (a loader converted them so), else a new copy
        (parts that are views of a mapped file hand their pages back, `release_pages`)."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.shape[1] != first.shape[1] for p in parts):
            raise ValueError("concat needs matrices of one format and width")
        rows = sum(p.shape[0] for p in parts)
        joined = adjacent([p.data for p in parts])
        if joined is not None:
            return QMatrix(first.qtype, (rows, first.shape[1]), joined)
        out = QMatrix(first.qtype, (rows, first.shape[1]),
                      np.concatenate([p.data for p in parts], axis=0))
        for p in parts:  # parts read from a mapped file: their pages go back
            release_pages(p.data)
        return out

    def __repr__(self) -> str:
        return f"QMatrix({self.qtype.name}, {self.shape[0]}x{self.shape[1]})"
