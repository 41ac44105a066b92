"""QMatrix: a weight matrix held in a GGML block format, and what can be done with its blocks.

A matrix [rows, cols] is stored row by row (a row is cols / block_size blocks), so rows are
independent: concatenating matrices by rows, reordering rows (the Llama Q/K permutation) and
reading a few rows (embedding lookups) work on the bytes, never on a float copy.

Formats: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 are held as they are (the CPU kernels
compute them directly). The k-quants are converted at load (`to_native`, which reports the
error it made): Q4_K to Q4_1 with its own 4-bit codes (a Q4_K sub-block of 32 values is a
Q4_1 block whose scale and offset are products of the super-block's f16 factors and 6-bit
integers, rounded here to f16), the others (Q2_K, Q3_K, Q5_K, Q6_K) to Q8_0. The numpy
reference (`dequantize`) is gguf's own, the oracle for every other backend.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants

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


def q4_k_as_q4_1(data: np.ndarray) -> tuple[np.ndarray, float]:
    """Q4_K rows (super-blocks of 256 values, 144 bytes: f16 d and dmin, twelve bytes of 6-bit
    scales and mins for 8 sub-blocks of 32, then 4-bit codes: per 64 values 32 bytes whose
    low nibbles are the first sub-block, high nibbles the second) as Q4_1 rows with the same
    codes (blocks of 32, 20 bytes: f16 scale d * sc, f16 offset -dmin * m, then value i in
    byte i's low nibble and value i + 16 in its high one), and a bound on the error: the f16
    rounding of the scales and offsets (about 2^-12 of a value, against Q8_0's 2^-8),
    relative to the largest value a block can hold. No value is computed."""
    rows = data.shape[0]
    b = np.ascontiguousarray(data).reshape(-1, 144)
    out = np.empty((b.shape[0], 8 * 20), np.uint8)
    err = top = 0.0
    step = CONVERT_FLOATS // 256
    for at in range(0, b.shape[0], step):
        e, t = _q4_k_blocks_as_q4_1(b[at : at + step], out[at : at + step])
        err, top = max(err, e), max(top, t)
    return out.reshape(rows, -1), err / (top or 1.0)


def _q4_k_blocks_as_q4_1(b: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """Super-blocks `b` [n, 144] into Q4_1 blocks `out` [n, 160]; returns the largest error
    and the largest value a block can hold."""
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
        err = 15 * np.abs(scale16 - scale) + np.abs(offset16 - offset)
        top = np.maximum(np.abs(offset), np.abs(offset + 15 * scale))
    blocks = out.reshape(n, 4, 2, 20)  # per 64 values: the two Q4_1 blocks
    blocks[:, :, :, 0:2] = scale16.reshape(n, 4, 2, 1).view(np.uint8)
    blocks[:, :, :, 2:4] = offset16.reshape(n, 4, 2, 1).view(np.uint8)
    # byte i of a Q4_1 block holds values i and i + 16: per 64 values, with a = bytes 0-15
    # and c = bytes 16-31 of the Q4_K codes, the first block is a's and c's low nibbles,
    # the second their high ones
    qs = b[:, 16:].reshape(n, 4, 2, 16)
    a, c = qs[:, :, 0], qs[:, :, 1]
    blocks[:, :, 0, 4:] = (a & 15) | (c << 4)
    blocks[:, :, 1, 4:] = (a >> 4) | (c & 0xF0)
    return float(err.max(initial=0.0)), float(top.max(initial=0.0))


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

    def to_native(self) -> tuple[QMatrix, float]:
        """This matrix in a format the CPU kernels compute, and a bound on the conversion's
        error relative to the largest value (0.0 when it is one already)."""
        if self.qtype in NATIVE:
            return self, 0.0
        if self.qtype not in CONVERTED:
            raise ModelError(f"tensor type {self.qtype.name} is not supported (supported: "
                             f"{', '.join(sorted(t.name for t in NATIVE | CONVERTED))})")
        if self.qtype == QT.Q4_K:
            data, bound = q4_k_as_q4_1(self.data)
            return QMatrix(QT.Q4_1, self.shape, data), bound
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
        """The parts stacked by rows (all of one format and width)."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.shape[1] != first.shape[1] for p in parts):
            raise ValueError("concat needs matrices of one format and width")
        rows = sum(p.shape[0] for p in parts)
        return QMatrix(first.qtype, (rows, first.shape[1]),
                       np.concatenate([p.data for p in parts], axis=0))

    def __repr__(self) -> str:
        return f"QMatrix({self.qtype.name}, {self.shape[0]}x{self.shape[1]})"
