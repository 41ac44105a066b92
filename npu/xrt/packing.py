"""Weight packers for NPU kernels: named, versioned, written once in numpy, shared by the
engine (which packs at load) and the simulator (which unpacks what a kernel would read).

A weight W [N, K] (out, in) is padded with zeros to [Np, Kp] (the op's granules) and cut
into tiles of `n` rows by `k` columns, stored tile by tile `[Np/n][Kp/k][n][k-bytes]`: a
kernel streams one tile of n output rows over k inputs at a time. Within a tile each row's k
values are encoded by the format:

- `bf16.v1`: k bfloat16 values (round to nearest even).
- `bfp16ebs8.v1`: blocks of 8 values along K sharing one 8-bit exponent (the biased float32
  exponent of the block's largest magnitude), each value an 8-bit two's-complement mantissa:
  value = m * 2^(e - 127 - 6); 9 bytes per 8 values (XDNA2's block floating point).
- `q4g32.v1`: groups of 32 along K: bf16 scale d, bf16 min m, 16 bytes of 4-bit codes (the
  low nibble of byte j is value j, the high nibble value j + 16): value = d * code + m; 20
  bytes per 32 values. GGUF Q4_1 is the same group-32 asymmetric int4 with fp16 d and m: its
  codes are copied as they are and its d, m converted to bf16 (`from_q4_1`).

Layouts named after the kernels that read them, each in its own order rather than tiles:

- `iron.pack_b` / `iron.pack_b.bfp16ebs8`: amd/IRON flm.GEMM's pre-packed B, bf16 (NPU1) or
  bfp16ebs8 (NPU2, packed in the op's rounding mode), `npu.xrt.iron_pack`.
- `iron.rows`: W [N, K] row-major bf16 (rows padded to the K granule, N to the N granule):
  what IRON's GEMV reads as its matrix A (C = A @ B, M = our N) and its GEMM with
  `b_col_maj` reads as B (amd/IRON iron/operators/gemv/op.py, gemm/op.py at 00802545).
- `flm.q4nx`: FastFlowLM's Q4NX blocks, `npu.xrt.q4nx`.

Activations cross as bf16 (`to_bf16`, round to nearest even); K padding is zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu.errors import ModelError
from npu.xrt import iron_pack, q4nx
from npu.xrt.bf16 import from_bf16, round_bf16, to_bf16

IRON_B = ("iron.pack_b", "iron.pack_b.bfp16ebs8")  # the layouts with an mmul geometry
LAYOUTS = ("bf16.v1", "bfp16ebs8.v1", "q4g32.v1", *IRON_B, "iron.rows", "flm.q4nx")
# values a format encodes together along K, and their bytes
GROUP = {"bf16.v1": (1, 2), "bfp16ebs8.v1": (8, 9), "q4g32.v1": (32, 20),
         "iron.pack_b": (1, 2), "iron.pack_b.bfp16ebs8": (8, 9), "iron.rows": (1, 2),
         "flm.q4nx": (32, 20)}  # q4nx: 5 bits a weight
# the weight dtype each layout stores
DTYPE_OF_LAYOUT = {"bf16.v1": "bf16", "bfp16ebs8.v1": "bfp16ebs8", "q4g32.v1": "q4g32",
                   "iron.pack_b": "bf16", "iron.pack_b.bfp16ebs8": "bfp16ebs8",
                   "iron.rows": "bf16", "flm.q4nx": "q4nx"}
# what a weight's dtype in a manifest names
LAYOUT_OF_DTYPE = {"bf16": "bf16.v1", "bfp16ebs8": "bfp16ebs8.v1", "q4g32": "q4g32.v1",
                   "q4nx": "flm.q4nx"}


# -- tiles ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiling:
    """A packed weight's geometry: real [n, k], padded [np_, kp], tile [tn, tk]."""

    layout: str
    n: int
    k: int
    tn: int
    tk: int
    mmul: tuple[int, ...] = ()  # IRON_B layouts: IRON flm.GEMM's (s, t, ct_k)
    rounding: str = "conv_even"  # "iron.pack_b.bfp16ebs8": the mode B is quantized in

    @property
    def np_(self) -> int:
        return -(-self.n // self.tn) * self.tn

    @property
    def kp(self) -> int:
        return -(-self.k // self.tk) * self.tk

    @property
    def row_bytes(self) -> int:
        group, size = GROUP[self.layout]
        return self.kp // group * size

    @property
    def nbytes(self) -> int:
        return self.np_ * self.row_bytes


def _geometry(t: Tiling) -> iron_pack.IronGeometry:
    s, tt, ct_k = t.mmul
    return iron_pack.IronGeometry(k_tile=t.tk, n_tile=t.tn, s=s, t=tt, ct_k=ct_k)


def tiling(layout: str, n: int, k: int, tn: int, tk: int, *,
           mmul: tuple[int, ...] = (), rounding: str = "conv_even") -> Tiling:
    if layout not in LAYOUTS:
        raise ModelError(f"weight layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if layout in IRON_B:
        if len(mmul) != 3:
            raise ModelError(f"layout {layout} needs the op's mmul: [s, t, ct_k]")
        if layout == "iron.pack_b.bfp16ebs8" and mmul[0] != 8:
            raise ModelError("layout iron.pack_b.bfp16ebs8 needs s = 8 (a block is 8 "
                             "in-features)")
        return Tiling(layout, n, k, tn, tk, tuple(mmul),
                      rounding if layout == "iron.pack_b.bfp16ebs8" else "conv_even")
    if layout == "flm.q4nx" and (tn % q4nx.M_TILE or tk % q4nx.K_TILE):
        raise ModelError(f"layout flm.q4nx needs N and K granules that are multiples of "
                         f"{q4nx.M_TILE} and {q4nx.K_TILE} (its blocks), not {tn} and {tk}")
    group = GROUP[layout][0]
    if tk % group:
        raise ModelError(f"layout {layout} needs a K granule that is a multiple of {group}, "
                         f"not {tk}")
    return Tiling(layout, n, k, tn, tk)


def _tile(rows: np.ndarray, t: Tiling) -> np.ndarray:
    """Per-row encodings [Np, Kp/tk, bytes per tk] -> the tiled byte stream."""
    tk_bytes = t.row_bytes // (t.kp // t.tk)
    r = rows.reshape(t.np_ // t.tn, t.tn, t.kp // t.tk, tk_bytes).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(r).reshape(-1)


def _untile(buf: np.ndarray, t: Tiling) -> np.ndarray:
    tk_bytes = t.row_bytes // (t.kp // t.tk)
    r = np.asarray(buf[: t.nbytes]).reshape(t.np_ // t.tn, t.kp // t.tk, t.tn, tk_bytes)
    return np.ascontiguousarray(r.transpose(0, 2, 1, 3)).reshape(t.np_, t.row_bytes)


def _padded(w: np.ndarray, t: Tiling) -> np.ndarray:
    out = np.zeros((t.np_, t.kp), dtype=np.float32)
    out[: t.n, : t.k] = w
    return out


# -- the formats ------------------------------------------------------------------------------
def _enc_bf16(w: np.ndarray) -> np.ndarray:
    return to_bf16(w).view(np.uint8).reshape(len(w), -1)


def _dec_bf16(rows: np.ndarray, kp: int, rounding: str) -> np.ndarray:
    return from_bf16(np.ascontiguousarray(rows).view(np.uint16)).reshape(len(rows), kp)


def _enc_bfp(w: np.ndarray) -> np.ndarray:
    blocks = w.reshape(len(w), -1, 8)
    peak = np.abs(blocks).max(axis=-1)
    exp = np.where(peak > 0, (peak.view(np.uint32) >> 23) & 0xFF, 0).astype(np.int32)
    scale = np.ldexp(np.float32(1.0), exp - 127 - 6).astype(np.float32)
    mant = np.clip(np.rint(blocks / np.where(peak > 0, scale, 1.0)[..., None]), -128, 127)
    out = np.empty(blocks.shape[:2] + (9,), dtype=np.uint8)
    out[..., 0] = exp.astype(np.uint8)
    out[..., 1:] = mant.astype(np.int8).view(np.uint8)
    return out.reshape(len(w), -1)


def _dec_bfp(rows: np.ndarray, kp: int, rounding: str) -> np.ndarray:
    b = rows.reshape(len(rows), -1, 9)
    scale = np.ldexp(np.float32(1.0), b[..., 0].astype(np.int32) - 127 - 6)
    mant = b[..., 1:].view(np.int8).astype(np.float32)
    return (mant * scale[..., None].astype(np.float32)).reshape(len(rows), kp)


def _enc_q4(w: np.ndarray) -> np.ndarray:
    g = w.reshape(len(w), -1, 32)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    d = round_bf16((hi - lo) / 15.0)
    m = round_bf16(lo)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    codes = np.clip(np.rint((g - m[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    out = np.empty(g.shape[:2] + (20,), dtype=np.uint8)
    out[..., 0:2] = to_bf16(d)[..., None].view(np.uint8).reshape(*d.shape, 2)
    out[..., 2:4] = to_bf16(m)[..., None].view(np.uint8).reshape(*m.shape, 2)
    out[..., 4:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(len(w), -1)


def _dec_q4(rows: np.ndarray, kp: int, rounding: str) -> np.ndarray:
    """What a kernel computes from the blocks: bf16(d * code + m) (the dequantised weight is
    rounded to bf16 in the kernel's rounding mode before it meets the activations)."""
    b = rows.reshape(len(rows), -1, 20)
    d = from_bf16(np.ascontiguousarray(b[..., 0:2]).view(np.uint16)[..., 0])
    m = from_bf16(np.ascontiguousarray(b[..., 2:4]).view(np.uint16)[..., 0])
    q = b[..., 4:]
    codes = np.concatenate([q & 0xF, q >> 4], axis=-1).astype(np.float32)
    vals = codes * d[..., None] + m[..., None]
    return round_bf16(vals.reshape(len(rows), kp), rounding)


ENCODE = {"bf16.v1": _enc_bf16, "bfp16ebs8.v1": _enc_bfp, "q4g32.v1": _enc_q4}
DECODE = {"bf16.v1": _dec_bf16, "bfp16ebs8.v1": _dec_bfp, "q4g32.v1": _dec_q4}


def pack(w: np.ndarray, t: Tiling) -> np.ndarray:
    """A float32 weight [n, k] packed as uint8 in the tiling's layout."""
    if t.layout == "iron.pack_b":  # IRON's own order, not tiles of rows
        w = _padded(np.asarray(w, dtype=np.float32), t)
        return iron_pack.pack_b_bf16(w, _geometry(t)).view(np.uint8)
    if t.layout == "iron.pack_b.bfp16ebs8":
        w = _padded(np.asarray(w, dtype=np.float32), t)
        return iron_pack.pack_b_bfp16ebs8(w, _geometry(t), t.rounding)
    if t.layout == "iron.rows":  # one row after another: no tiles
        return to_bf16(_padded(np.asarray(w, dtype=np.float32), t)).view(np.uint8).ravel()
    if t.layout == "flm.q4nx":  # FastFlowLM's blocks, in file order
        return q4nx.pack_q4nx(_padded(np.asarray(w, dtype=np.float32), t))
    rows = ENCODE[t.layout](_padded(np.asarray(w, dtype=np.float32), t))
    return _tile(rows, t)


def from_q4_1(blocks: np.ndarray, shape: tuple[int, int], t: Tiling) -> np.ndarray:
    """GGUF Q4_1 rows (uint8 [n, k/32 * 20]: fp16 d, fp16 m, 16 code bytes per group) packed
    as q4g32.v1: the codes unchanged, d and m rounded to bf16. Padding groups are zero."""
    if t.layout != "q4g32.v1":
        raise ModelError(f"a Q4_1 weight packs as q4g32.v1, not {t.layout}")
    n, k = shape
    g = np.asarray(blocks).reshape(n, k // 32, 20)
    out = np.zeros((t.np_, t.kp // 32, 20), dtype=np.uint8)
    d = np.ascontiguousarray(g[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    m = np.ascontiguousarray(g[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
    out[:n, : k // 32, 0:2] = to_bf16(d)[..., None].view(np.uint8).reshape(n, k // 32, 2)
    out[:n, : k // 32, 2:4] = to_bf16(m)[..., None].view(np.uint8).reshape(n, k // 32, 2)
    out[:n, : k // 32, 4:] = g[..., 4:]
    return _tile(out.reshape(t.np_, -1), t)


def unpack(buf: np.ndarray, t: Tiling, rounding: str = "conv_even") -> np.ndarray:
    """The float32 values [np_, kp] a kernel reads from a packed weight (padding included)."""
    if t.layout == "iron.pack_b":
        return iron_pack.unpack_b_bf16(np.asarray(buf[: t.nbytes]), t.np_, t.kp, _geometry(t))
    if t.layout == "iron.pack_b.bfp16ebs8":
        return iron_pack.unpack_b_bfp16ebs8(np.asarray(buf[: t.nbytes]), t.np_, t.kp,
                                            _geometry(t))
    if t.layout == "iron.rows":
        raw = np.ascontiguousarray(buf[: t.nbytes]).view(np.uint16)
        return from_bf16(raw).reshape(t.np_, t.kp)
    if t.layout == "flm.q4nx":  # min + scale * code, rounded to bf16 as the kernel does
        return round_bf16(q4nx.unpack_q4nx(np.asarray(buf[: t.nbytes]), t.np_, t.kp),
                          rounding)
    return DECODE[t.layout](_untile(buf, t), t.kp, rounding)
