"""The k-quant conversion at load in C (cpu_convert.c, built into the kernels' library):
`QMatrix.to_native`'s fast path, bit for bit its numpy reference, on every core, reading
the blocks where they lie (a memory-mapped file's pages) and writing only the result.

`convert(qtype, data)` returns None where the kernels cannot be built (the caller keeps the
numpy reference then).
"""

from __future__ import annotations

import ctypes
import mmap
from functools import cache

import numpy as np
from gguf import GGMLQuantizationType as QT

from npu.engine.cores import default_threads


@cache
def _threads() -> int:
    """default_threads() once (it reads sysfs and the cgroup files; a load converts hundreds
    of tensors)."""
    return default_threads()


@cache
def _lib() -> ctypes.CDLL | None:
    from npu.engine.cpu_kernels import kernels_or_none

    lib = kernels_or_none()
    return None if lib is None else declared(lib)


def declared(lib: ctypes.CDLL) -> ctypes.CDLL:
    """A build of the kernels with the conversion's functions declared."""
    lib.fc_convert_rows.restype = ctypes.c_int
    lib.fc_convert_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.fc_out_bytes.restype = ctypes.c_int64
    lib.fc_out_bytes.argtypes = [ctypes.c_int]
    lib.fc_target.restype = ctypes.c_int
    lib.fc_target.argtypes = [ctypes.c_int]
    lib.fc_half_soft_n.restype = None
    lib.fc_half_soft_n.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.fc_strings_joined.restype = ctypes.c_int64
    lib.fc_strings_joined.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def fresh(shape: tuple[int, ...]) -> np.ndarray:
    """New uint8 memory in a mapping of its own, which the kernel fills with 4 KB pages as
    they are written. numpy asks for huge pages on large arrays; where memory is fragmented
    (the page cache full of the model file) the kernel compacts memory to find them, which
    measured 25-58 s of an 8B file's load here against 8-13 s without (and 1.5 s for 96 MB
    in a fresh process)."""
    n = int(np.prod(shape))
    if n == 0:
        return np.empty(shape, dtype=np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # not mmap's default shared memory
    return np.frombuffer(mmap.mmap(-1, n, flags=flags), dtype=np.uint8).reshape(shape)


def available() -> bool:
    return _lib() is not None


def convert(qtype: QT, data: np.ndarray, n_threads: int | None = None,
            out: np.ndarray | None = None, order: np.ndarray | None = None,
            packed: bool = False,
            lib: ctypes.CDLL | None = None) -> tuple[QT, np.ndarray, float, float] | None:
    """`data` (uint8 [rows, row bytes] of super-blocks, C-contiguous; read only) converted:
    (the format, uint8 [rows, its row bytes], stat 0, stat 1) with the stats of
    cpu_convert.c; None: no kernels here, or not a type converted in C. `out`: where to
    write it (uint8 [rows, its row bytes], C-contiguous), else new memory. `order`: row i of
    the result is row order[i] of `data`. `packed`: the result in the kernels' packed layout
    (npu.engine.linear.PackedMatrix's bytes; rows a multiple of `packed_rows()`), each group
    of rows packed as it is converted. `lib`: another build of the kernels, `declared`
    (default: this process's)."""
    lib = lib if lib is not None else _lib()
    if lib is None:
        return None
    out_size = lib.fc_out_bytes(int(qtype))
    if out_size < 0:
        return None
    rows = data.shape[0]
    data = np.ascontiguousarray(data)
    blocks = data.size // _IN_BYTES[qtype] // max(rows, 1)  # super-blocks a row
    shape = (rows, blocks * out_size)
    if out is None or out.shape != shape or out.dtype != np.uint8 \
            or not out.flags.c_contiguous:
        out = fresh(shape)
    if order is not None:
        order = np.ascontiguousarray(order, dtype=np.int64)
        if order.shape != (rows,) or (rows and (order.min() < 0 or order.max() >= rows)):
            raise ValueError("order must be a permutation's worth of row indices")
    stats = np.zeros(2, dtype=np.float32)
    failed = lib.fc_convert_rows(int(qtype), data.ctypes.data, rows, blocks * 256,
                                 None if order is None else order.ctypes.data,
                                 out.ctypes.data, int(packed), n_threads or _threads(),
                                 stats.ctypes.data)
    if failed:
        raise RuntimeError(f"fc_convert_rows failed ({failed}) for {qtype.name}"
                           f"{' packed' if packed else ''}")
    return QT(lib.fc_target(int(qtype))), out, float(stats[0]), float(stats[1])


def packed_rows() -> int:
    """Rows a group of the kernels' packed layout (0: none here, or no kernels)."""
    lib = _lib()
    return 0 if lib is None else int(lib.fk_packed_rows())


def strings_joined(buf: bytes, at: int, count: int) -> tuple[bytes, int] | None:
    """`count` GGUF strings from `buf[at]` (each a u64 length and its bytes): their bytes
    joined by NULs, and the offset after the last; None without the kernels. Raises
    ValueError where they run past the end of `buf`."""
    lib = _lib()
    if lib is None:
        return None
    out = fresh((max(len(buf) - at, 1),))  # its pages made as written: a few of 8 MB
    written = ctypes.c_int64(0)
    end = lib.fc_strings_joined(buf, len(buf), at, count, out.ctypes.data,
                                ctypes.byref(written))
    if end < 0:
        raise ValueError("the strings run past the bytes read")
    return out[: written.value].tobytes(), int(end)


def half_soft(x: np.ndarray) -> np.ndarray | None:
    """float32 -> float16 bits by cpu_convert.c's software rounding (builds without F16C);
    None without the kernels. For the tests."""
    lib = _lib()
    if lib is None:
        return None
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.shape, dtype=np.uint16)
    lib.fc_half_soft_n(x.ctypes.data, x.size, out.ctypes.data)
    return out


_IN_BYTES = {QT.Q2_K: 84, QT.Q3_K: 110, QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}
