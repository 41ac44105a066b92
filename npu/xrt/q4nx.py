"""FastFlowLM's 4-bit weight format Q4NX, as its dequant kernel reads it (file order).

From the published description (amd/IRON iron/operators/flm/q4nx.py and the dequant
operator's reference at 10c81afd / 6570447d), in our words:

- W [N, K] (out, in) is cut into blocks of 32 out-features by 256 in-features, stored
  block row by block row (N / 32), each row's blocks along K in order.
- A block is 5120 bytes: 8 x 32 bf16 scales (group-major: the scale of group g, 32
  in-features wide, of out-feature m at index g * 32 + m), the 8 x 32 bf16 minima in the
  same order, then 4096 bytes of 4-bit codes as [2 halves of 16 out-features][256
  in-features][8 bytes], byte j holding out-feature 16 h + 2 j in its low nibble and
  16 h + 2 j + 1 in its high nibble.
- A weight is min + scale * code (the minimum is added: an offset, not a zero point).

FastFlowLM's engine reorders blocks when it reads a file (pairs of block rows
interleaved); this module writes and reads the file order. Packing quantises each group
of 32 in-features to 16 levels between its minimum (stored rounded toward minus infinity,
so no weight lies below it) and maximum (the scale rounded to nearest even); a code is the
nearest level under the stored bf16 scale and minimum. As a manifest layout (`flm.q4nx`,
w dtype `q4nx`, gemv / gemm) the whole padded weight is one Q4NX file; the simulated kernel
rounds each dequantised weight to bf16 in the op's rounding (`npu.xrt.packing`).
"""

from __future__ import annotations

import numpy as np

from npu.errors import ModelError
from npu.xrt.bf16 import from_bf16, to_bf16

M_TILE, K_TILE, GROUP, HALF = 32, 256, 32, 16
GROUPS = K_TILE // GROUP
PLANE = GROUPS * M_TILE * 2  # bytes of a block's scales (and of its minima)
BLOCK_BYTES = 2 * PLANE + M_TILE * K_TILE // 2


def padded(n: int, k: int) -> tuple[int, int]:
    return -(-n // M_TILE) * M_TILE, -(-k // K_TILE) * K_TILE


def pack_q4nx(w: np.ndarray) -> np.ndarray:
    """W [N, K] float -> the Q4NX bytes (uint8), zero-padded to whole blocks."""
    n, k = w.shape
    np_, kp = padded(n, k)
    full = np.zeros((np_, kp), dtype=np.float32)
    full[:n, :k] = w
    g = full.reshape(np_, kp // GROUP, GROUP)
    lo = from_bf16(to_bf16(g.min(axis=-1), "floor"))
    scale = from_bf16(to_bf16((g.max(axis=-1) - lo) / 15))
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.rint((g - lo[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    codes = codes.reshape(np_, kp)
    rows, cols = np_ // M_TILE, kp // K_TILE
    out = np.empty((rows, cols, BLOCK_BYTES), dtype=np.uint8)
    for plane, values in ((0, scale), (PLANE, lo)):
        v = to_bf16(values).reshape(rows, M_TILE, cols, GROUPS).transpose(0, 2, 3, 1)
        out[..., plane : plane + PLANE] = np.ascontiguousarray(v).view(np.uint8).reshape(
            rows, cols, PLANE)
    c = codes.reshape(rows, 2, HALF // 2, 2, cols, K_TILE)  # row, h, j, nibble, col, k
    c = c.transpose(0, 4, 1, 5, 2, 3)  # row, col, h, k, j, nibble
    out[..., 2 * PLANE :] = (c[..., 0] | (c[..., 1] << 4)).reshape(rows, cols, -1)
    return out.reshape(-1)


def unpack_q4nx(blob: np.ndarray, n: int, k: int) -> np.ndarray:
    """Q4NX bytes -> W [N, K] float32 (min + scale * code)."""
    np_, kp = padded(n, k)
    rows, cols = np_ // M_TILE, kp // K_TILE
    if blob.size != rows * cols * BLOCK_BYTES:
        raise ModelError(f"a Q4NX weight [{n}, {k}] is {rows * cols * BLOCK_BYTES} bytes, "
                         f"not {blob.size}")
    b = np.asarray(blob, dtype=np.uint8).reshape(rows, cols, BLOCK_BYTES)

    def plane(at: int) -> np.ndarray:  # -> [rows, cols, m, groups]
        v = from_bf16(np.ascontiguousarray(b[..., at : at + PLANE]).view(np.uint16))
        return v.reshape(rows, cols, GROUPS, M_TILE).transpose(0, 1, 3, 2)

    scale, lo = plane(0), plane(PLANE)
    q = b[..., 2 * PLANE :].reshape(rows, cols, 2, K_TILE, HALF // 2)
    codes = np.stack([q & 0xF, q >> 4], axis=-1)  # row, col, h, k, j, nibble
    codes = codes.transpose(0, 1, 2, 4, 5, 3).reshape(rows, cols, M_TILE, K_TILE)
    group = np.arange(K_TILE) // GROUP
    vals = lo[..., group] + scale[..., group] * codes.astype(np.float32)
    return vals.transpose(0, 2, 1, 3).reshape(np_, kp)[:n, :k]
