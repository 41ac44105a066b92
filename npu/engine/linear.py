"""The linear-layer seam: y = x @ W.T for a weight held in a block format, on a backend.

- "reference": numpy; blocks are expanded a slice of rows at a time (gguf's own
  dequantizers) and multiplied with BLAS. Exact and slow: the oracle for the others.
- "cpu": the compiled kernels (cpu_kernels.c). The integer formats (Q8_0, Q4_0, Q4_1, Q5_0,
  Q5_1) multiply straight from the blocks with x rounded to 8 bits per block of 32, as
  llama.cpp does (about 0.5% of the largest output; the reference keeps float32). Where the
  CPU has AVX2 (VNNI or not), they are first repacked in groups of 16 or 8 rows
  (`PackedMatrix`: as many bytes, one copy; 2-4x faster products). F16 / BF16
  multiply a few rows (decode) from the blocks in float32 and many rows (prefill) with BLAS
  on float32 slices the kernels expand. Falls back to "reference" when the kernels cannot be
  built.

Float32 weights take numpy's BLAS on either backend. The XRT engine replaces the whole seam.
"""

from __future__ import annotations

import logging

import numpy as np

from npu.engine.convert import fresh
from npu.engine.cores import default_threads as cores
from npu.engine.ops import KernelOps, NumpyOps
from npu.engine.quant import INTEGER, QT, QMatrix, adjacent, release_pages, row_bytes

log = logging.getLogger(__name__)

BACKENDS = ("cpu", "reference")
# rows of x up to which the kernels multiply from the blocks; above, BLAS on expanded slices
KERNEL_ROWS = 8
# float32 values expanded at a time for BLAS (4 MB: stays in the L2/L3 caches)
SLICE_VALUES = 1 << 20


class Threads:
    """The thread count the kernels use, shared by an engine's linear layers."""

    __slots__ = ("n",)

    def __init__(self, n: int = 1) -> None:
        self.n = n


def float_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T with BLAS, in the faster orientation for the row count."""
    if 1 < len(x) <= 32:
        # OpenBLAS computes x @ w.T for a few rows at 3-4x the cost of one row; w @ x.T is
        # 20-40% faster for 2-32 rows of a cache-sized weight (batched decode, short
        # prompts); one row is a matrix-vector product either way
        return (w @ x.T).T
    return x @ w.T


class Linear:
    """A weight [out, in] and the product with it; `matrix` is the weight's blocks."""

    def __init__(self, matrix: QMatrix) -> None:
        self.matrix = matrix
        self.shape = matrix.shape

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def dequantize(self) -> np.ndarray:
        """The weight as a new float32 array [out, in] (for engines that repack it)."""
        return self.matrix.dequantize()

    def blocks(self) -> QMatrix | None:
        """The weight in its block format's own layout (for engines that repack it)."""
        return self.matrix

    def _sliced(self, x: np.ndarray, expand) -> np.ndarray:
        rows, cols = self.shape
        step = max(1, SLICE_VALUES // cols)
        out = np.empty((len(x), rows), dtype=np.float32)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            out[:, start:stop] = x @ expand(start, stop).T
        return out


class ReferenceLinear(Linear):
    """numpy's BLAS on the float32 values; `keep`: expand a block format once, on first use,
    and keep the float32 copy (the "reference" backend: fast enough for an oracle, at 4 bytes
    a weight), else slice by slice on every call (the fallback when the kernels are missing:
    memory stays at the blocks)."""

    def __init__(self, matrix: QMatrix, keep: bool = False) -> None:
        super().__init__(matrix)
        self._keep = keep
        self._floats: np.ndarray | None = matrix.floats

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self._floats is None and self._keep:
            self._floats = self.matrix.dequantize()
        if self._floats is not None:
            return float_matmul(x, self._floats)
        return self._sliced(x, self.matrix.dequantize)


class PackedMatrix:
    """A Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 matrix in the kernels' packed layout (cpu_kernels.c,
    "rows interleaved"): per block of 32 columns, a group of rows' scales side by side and
    their codes interleaved 4 by 4 (16 rows with AVX512-VNNI, 8 with AVX-VNNI or AVX2 alone;
    Q5's fifth bits in one more vector), the layout their integer products read fastest. As
    many bytes as the blocks (the last group's rows padded); `blocks()` gives back the file's
    layout byte for byte."""

    __slots__ = ("qtype", "shape", "data", "_lib", "_ptr")
    floats = None

    def __init__(self, qtype: QT, shape: tuple[int, int], data: np.ndarray, lib) -> None:
        self.qtype, self.shape, self.data, self._lib = qtype, shape, data, lib
        self._ptr = data.ctypes.data  # looked up once: a decode step's lookup is ~15 us

    @classmethod
    def of(cls, m: QMatrix, lib) -> PackedMatrix | None:
        """`m` repacked, or None when this build or this format has no packed layout."""
        p = cls.room(m, lib)
        if p is not None:
            pack_all([(m, p)], lib)
        return p

    @classmethod
    def room(cls, m: QMatrix, lib, in_place: bool = False) -> PackedMatrix | None:
        """A packed matrix of `m`'s format and shape whose bytes `pack_all` writes later
        (zeros till then), or None when this build or this format has no packed layout.
        `in_place`: in `m`'s own bytes where they are writable and of the same size (`m`
        is not read after: a k-quant's conversion, not a file's view)."""
        rows, cols = m.shape
        size = lib.fk_packed_bytes(int(m.qtype), rows, cols)
        if size < 0:
            return None
        d = m.data
        if (in_place and d.flags.writeable and d.flags.c_contiguous and d.nbytes == size
                and rows % lib.fk_packed_rows() == 0):
            return cls(m.qtype, m.shape, d.reshape(-1), lib)
        return cls(m.qtype, m.shape, fresh((size,)), lib)

    @classmethod
    def concat(cls, parts: list[PackedMatrix]) -> PackedMatrix:
        """The parts stacked by rows (each of whole groups: the result's bytes are theirs one
        after the other): a view where they lie so in one buffer (a loader's), else a copy."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.shape[1] != first.shape[1]
               or p.shape[0] % first._lib.fk_packed_rows() for p in parts):
            raise ValueError("concat needs packed matrices of one format and width, each of "
                             "whole groups of rows")
        data = adjacent([p.data for p in parts])
        if data is None:
            data = np.concatenate([p.data.reshape(-1) for p in parts])
        return cls(first.qtype, (sum(p.shape[0] for p in parts), first.shape[1]),
                   data.reshape(-1), first._lib)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def blocks(self) -> QMatrix:
        """The matrix in its block format's own layout (a new copy)."""
        rows, cols = self.shape
        out = np.empty((rows, row_bytes(self.qtype, cols)), dtype=np.uint8)
        self._lib.fk_unpack(int(self.qtype), self.data.ctypes.data, rows, cols,
                            out.ctypes.data)
        return QMatrix(self.qtype, self.shape, out)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows `ids` as float32 [len(ids), cols]."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.shape[1]), dtype=np.float32)
        rc = self._lib.fk_packed_lookup(int(self.qtype), self._ptr, self.shape[0],
                                        self.shape[1], ids.ctypes.data, len(ids),
                                        out.ctypes.data)
        if rc == -2:
            raise IndexError(f"row ids outside 0..{self.shape[0] - 1}")
        if rc:
            raise RuntimeError(f"the kernels cannot read {self.qtype.name} rows packed")
        return out

    def dequantize(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows start .. stop as a new float32 array."""
        return self.rows(np.arange(self.shape[0])[start:stop])

    def __repr__(self) -> str:
        return f"PackedMatrix({self.qtype.name}, {self.shape[0]}x{self.shape[1]})"


def pack_all(jobs: list[tuple[QMatrix, PackedMatrix]], lib, threads: int | None = None) -> None:
    """Each matrix written into its `PackedMatrix.room`, in one call of the kernels (which
    lets the GIL go for the whole of it), on `threads` threads (default: one per physical core)."""
    if not jobs:
        return
    n = len(jobs)
    types = np.array([int(m.qtype) for m, _ in jobs], dtype=np.int32)
    rows = np.array([m.shape[0] for m, _ in jobs], dtype=np.int64)
    cols = np.array([m.shape[1] for m, _ in jobs], dtype=np.int64)
    srcs = np.array([m.data.ctypes.data for m, _ in jobs], dtype=np.uint64)
    dsts = np.array([p.data.ctypes.data for _, p in jobs], dtype=np.uint64)
    failed = lib.fk_pack_many(n, types.ctypes.data, srcs.ctypes.data, rows.ctypes.data,
                              cols.ctypes.data, dsts.ctypes.data, threads or cores())
    if failed:
        raise RuntimeError(f"fk_pack_many failed for {jobs[failed - 1][0]!r}")
    # the copies made: a mapped file's pages under them leave resident memory now, so a
    # load's peak is the packed bytes plus the file's pages, not the file on top of them
    for m, _ in jobs:
        release_pages(m.data)


class CpuLinear(Linear):
    """A weight in a block format other than F32 (those take `ReferenceLinear`'s BLAS), or
    a `PackedMatrix`."""

    def __init__(self, matrix: QMatrix | PackedMatrix, threads: Threads, lib) -> None:
        super().__init__(matrix)
        self.threads = threads
        self._lib = lib
        self._ptr = matrix.data.ctypes.data
        self._type = int(matrix.qtype)
        self._matmul = lib.fk_matmul_packed if isinstance(matrix, PackedMatrix) else lib.fk_matmul
        # integer formats: the kernels for every row count (their tiled product beats BLAS
        # on expanded slices); float formats: BLAS above KERNEL_ROWS
        self._direct = matrix.qtype in INTEGER
        self._buf: np.ndarray | None = None

    def blocks(self) -> QMatrix:
        m = self.matrix
        return m.blocks() if isinstance(m, PackedMatrix) else m

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = self.shape
        if self._direct or len(x) <= KERNEL_ROWS:
            out = np.empty((len(x), rows), dtype=np.float32)
            if self._matmul(self._type, self._ptr, rows, cols, x.ctypes.data, len(x),
                            out.ctypes.data, self.threads.n):
                raise RuntimeError(f"the product failed for {self.matrix!r}")
            return out
        return self._sliced(x, self._expand)

    def _expand(self, start: int, stop: int) -> np.ndarray:
        cols = self.shape[1]
        if self._buf is None:
            self._buf = np.empty(max(1, SLICE_VALUES // cols) * cols, dtype=np.float32)
        buf = self._buf[: (stop - start) * cols]
        self._lib.fk_dequant(self._type, self._ptr, cols, start, stop - start,
                             buf.ctypes.data, self.threads.n)
        return buf.reshape(stop - start, cols)


class SplitLinear(Linear):
    """Several weights of different formats side by side (a fused projection whose parts
    a file stores in different formats): their outputs concatenated."""

    def __init__(self, parts: list[Linear]) -> None:
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        self.matrix = None

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([p(x) for p in self.parts], axis=-1)

    def dequantize(self) -> np.ndarray:
        return np.concatenate([p.dequantize() for p in self.parts], axis=0)

    def blocks(self) -> None:
        return None


class Embedding:
    """Rows of a weight in a block format, looked up by token id."""

    def __init__(self, matrix: QMatrix | PackedMatrix, lib=None,
                 threads: Threads | None = None) -> None:
        self.matrix = matrix
        self._lib, self.threads = lib, threads

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32 [len(ids), cols].

        Raises:
            ValueError: an id outside the rows (the kernels would read past the weight).
        """
        m = self.matrix
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = m.shape[0]
        if isinstance(m, PackedMatrix):  # the kernels check the ids
            try:
                return m.rows(ids)
            except IndexError:
                raise _outside(ids, rows) from None
        if m.floats is not None or self._lib is None:  # numpy's indexing: -1 is the last row
            if ids.size and not (0 <= ids.min() and ids.max() < rows):
                raise _outside(ids, rows)
            return m.floats[ids] if m.floats is not None else m.rows(ids)
        out = np.empty((len(ids), m.shape[1]), dtype=np.float32)
        rc = self._lib.fk_rows(int(m.qtype), m.data.ctypes.data, rows, m.shape[1],
                               ids.ctypes.data, len(ids), out.ctypes.data, self.threads.n)
        if rc == -2:
            raise _outside(ids, rows)
        if rc:
            raise RuntimeError(f"the kernels cannot read {m.qtype.name} rows")
        return out


def _outside(ids: np.ndarray, rows: int) -> ValueError:
    bad = ids[(ids < 0) | (ids >= rows)].flat[0]
    return ValueError(f"token id {bad} is outside the vocabulary (0..{rows - 1})")


def _lib_for(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if backend == "reference":
        return None
    from npu.engine.cpu_kernels import KernelUnavailable, kernels

    try:
        return kernels()
    except KernelUnavailable as exc:
        log.warning("CPU kernels unavailable, using the numpy reference (slow): %s", exc)
        return None


class LinearFactory:
    """Makes an engine's linear layers and embedding on one backend, sharing `threads`."""

    def __init__(self, backend: str = "cpu", threads: int = 1, pack: bool = True,
                 later: int = 0) -> None:
        """`later`: packed matrices are made empty and written by `pack`, in one call: those
        made since `later` bytes of them were last passed (then those made so far are
        written at once: a matrix's source stays in memory until its packed copy is
        written; one larger than `later` alone waits for `pack`); and matrices in
        memory of their own (a k-quant's conversion) are packed in place: the weights given
        are the factory's, not read by anyone after."""
        self.threads = Threads(threads)
        self._lib = _lib_for(backend)
        self._keep = backend == "reference"
        self._pack = pack and self._lib is not None
        self._later = later
        self._pending: list[tuple[QMatrix, PackedMatrix]] = []
        self._pending_bytes = 0

    @property
    def unpacked(self) -> int:
        """Matrices made whose bytes `pack` has yet to write."""
        return len(self._pending)

    def pack(self, threads: int | None = None) -> None:
        """Writes the packed matrices left by `later` (one call: the GIL let go meanwhile),
        on `threads` threads (default: one per physical core). Where it fails they stay
        `unpacked`."""
        pack_all(self._pending, self._lib, threads)
        self._pending, self._pending_bytes = [], 0

    def linear(self, parts: list[QMatrix | PackedMatrix]) -> Linear:
        """One linear layer over `parts` stacked by rows (the fused projections); a part may
        come packed already (a loader's k-quant, converted into the packed layout)."""
        groups: list[list[QMatrix | PackedMatrix]] = []
        for p in parts:
            if groups and groups[-1][0].qtype == p.qtype and type(groups[-1][0]) is type(p):
                groups[-1].append(p)
            else:
                groups.append([p])
        made = [self._one(g[0] if len(g) == 1 else type(g[0]).concat(g)) for g in groups]
        return made[0] if len(made) == 1 else SplitLinear(made)

    def _one(self, m: QMatrix | PackedMatrix) -> Linear:
        if isinstance(m, PackedMatrix):  # a loader's, packed already (the reference: unpacked)
            return (CpuLinear(m, self.threads, self._lib) if self._lib is not None
                    else ReferenceLinear(m.blocks(), keep=self._keep))
        if self._lib is None or m.qtype == QT.F32:
            return ReferenceLinear(m, keep=self._keep)
        return CpuLinear(self._packed(m), self.threads, self._lib)

    def _packed(self, m: QMatrix | PackedMatrix) -> QMatrix | PackedMatrix:
        if not self._pack or isinstance(m, PackedMatrix):
            return m
        if not self._later:
            return PackedMatrix.of(m, self._lib) or m
        p = PackedMatrix.room(m, self._lib, in_place=True)
        if p is None:
            return m
        if self._pending_bytes + p.nbytes > self._later:
            self.pack()
        self._pending.append((m, p))
        self._pending_bytes += p.nbytes
        return p

    def embedding(self, m: QMatrix, head: bool = False) -> Embedding:
        """`head`: the embedding is also the output head (tied): held in the head's layout,
        one copy for both (`tied_head`)."""
        return Embedding(self._packed(m) if head else m, self._lib, self.threads)

    def tied_head(self, embedding: Embedding) -> Linear:
        """The output head over `embedding`'s own weight."""
        return self._one(embedding.matrix)

    def ops(self) -> NumpyOps:
        """The norms and attention on the same backend and threads."""
        return NumpyOps() if self._lib is None else KernelOps(self._lib, self.threads)
