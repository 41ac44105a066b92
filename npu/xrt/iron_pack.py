"""The weight order amd/IRON's flm GEMM reads (its `pack_b`), in bf16 and bfp16ebs8.

IRON's flm.GEMM takes B = W.T ([K, N], in-features by out-features) reordered on the host
into the order its compute tiles consume, so that every B transfer is one linear run. The
order, from the published description (iron/operators/flm/packing.py, amd/IRON at
2e1711ef), written here in our words:

- B is cut into column stripes of `n_tile` out-features (outermost), each stripe into
  K blocks of `k_tile`, each block into slices of `ct_k` (what one compute tile holds), each
  slice into `t`-wide groups of out-features; within that, `ct_k / s` register rows `i`,
  then `s` in-features, then `t` out-features (bf16: a row-major s x t block).
- bfp16ebs8 swaps the two innermost (t out-features, then s in-features), so with s = 8 the
  8 consecutive in-features of one out-feature that share an exponent are adjacent; each
  group of 8 is 9 bytes: the largest biased f32 exponent of the 8, then 8 two's-complement
  mantissas, the 24-bit magnitude (implicit bit made explicit) shifted right by
  17 + (shared - own exponent), rounded to nearest even (the operators' `conv_even`) or
  toward minus infinity (`floor`, the cores' power-up mode), saturated to [-128, 127]; a
  value whose own exponent is 32 or more below the shared one (zero and negative zero
  included) is 0 when positive and -1 when negative, in either mode, as IRON's model of the
  hardware's `to_v64bfp16ebs8` (its `f32_to_bfp16ebs8`) has it. A block decodes as
  mantissa * 2^(shared - 133).

A wrong s, t or ct_k gives a buffer of the right size in the wrong order, which computes
wrong numbers silently: the geometry is named, and the tests' expected bytes are worked
out by hand from the description above, not from this code.

As manifest layouts, `iron.pack_b` (w bf16: NPU1's flm.GEMM; not FastFlowLM's shipped
overlay, whose `overlay_order` swaps i and s_in) and `iron.pack_b.bfp16ebs8` (w bfp16ebs8: NPU2's flm.GEMM, whose `pack_B` quantizes
B in the core's rounding mode, the op's `rounding`) are this order with the op's granules as
k_tile and n_tile and its `mmul` as [s, t, ct_k] (`npu.xrt.packing.pack` / `unpack` call
this module). `quantize_bfp16` is what an AIE2P bf16 matmul built with
AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 does to its operands (blocks of 8 along K).
"""

from __future__ import annotations

import msgspec
import numpy as np

from npu.errors import ModelError
from npu.xrt.bf16 import from_bf16, to_bf16


class IronGeometry(msgspec.Struct, frozen=True, kw_only=True):
    """flm.GEMM's B tiling: K block, N stripe, the mmul's s x t, a compute tile's K slice."""

    k_tile: int
    n_tile: int
    s: int
    t: int
    ct_k: int

    def check(self) -> None:
        if self.k_tile % self.ct_k or self.ct_k % self.s or self.n_tile % self.t:
            raise ModelError(f"IRON B geometry {self}: k_tile must be a multiple of ct_k, "
                             "ct_k of s, n_tile of t")


def _blocked(w: np.ndarray, g: IronGeometry) -> np.ndarray:
    """W [N, K] -> B zero-padded to the tiles, as (cb, kb, kslice, tb, i, s_in, t_in)."""
    g.check()
    n, k = w.shape
    kp, np_ = -(-k // g.k_tile) * g.k_tile, -(-n // g.n_tile) * g.n_tile
    w = np.asarray(w)
    b = np.zeros((kp, np_), dtype=np.float32 if w.dtype.kind == "f" else w.dtype)
    b[:k, :n] = w.T
    b = b.reshape(kp // g.k_tile, g.k_tile // g.ct_k, g.ct_k // g.s, g.s,
                  np_ // g.n_tile, g.n_tile // g.t, g.t)  # kb, kslice, i, s_in, cb, tb, t_in
    return b.transpose(4, 0, 1, 5, 2, 3, 6)


def pack_b_bf16(w: np.ndarray, g: IronGeometry) -> np.ndarray:
    """W [N, K] float -> flm.GEMM's bf16 B stream (uint16 bits, round to nearest even)."""
    return to_bf16(np.ascontiguousarray(_blocked(w, g)).reshape(-1))


def unpack_b_bf16(buf: np.ndarray, np_: int, kp: int, g: IronGeometry) -> np.ndarray:
    """A packed bf16 B stream -> W [np_, kp] float32 (the order inverted; np_ and kp whole
    tiles)."""
    index = np.arange(np_ * kp, dtype=np.int64).reshape(np_, kp)
    order = np.ascontiguousarray(_blocked(index, g)).reshape(-1)
    out = np.empty(np_ * kp, dtype=np.float32)
    out[order] = from_bf16(np.ascontiguousarray(buf).view(np.uint16))
    return out.reshape(np_, kp)


def pack_b_bfp16ebs8(w: np.ndarray, g: IronGeometry, rounding: str = "conv_even"
                     ) -> np.ndarray:
    """W [N, K] float -> flm.GEMM's bfp16ebs8 B stream (uint8, 9 bytes per 8 values)."""
    if g.s != 8:
        raise ModelError(f"bfp16ebs8 B needs s = 8 (a block is 8 in-features), not {g.s}")
    groups = np.ascontiguousarray(_blocked(w, g).swapaxes(-1, -2)).reshape(-1, 8)
    return encode_bfp16ebs8(groups, rounding).reshape(-1)


def encode_bfp16ebs8(groups: np.ndarray, rounding: str = "conv_even") -> np.ndarray:
    """[G, 8] float32 -> [G, 9] bytes: the shared exponent, then 8 mantissas."""
    if rounding not in ("conv_even", "floor"):
        raise ModelError(f"rounding {rounding!r} is not 'floor' or 'conv_even'")
    bits = np.ascontiguousarray(groups, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int64)
    magnitude = (bits & 0x7FFFFF).astype(np.int64) | np.where(exp > 0, 1 << 23, 0)
    signed = np.where(bits >> 31 != 0, -magnitude, magnitude)
    shared = exp.max(axis=1, keepdims=True)
    shift = np.minimum(17 + shared - exp, 62)
    if rounding == "floor":
        mant = signed >> shift  # an arithmetic shift: toward minus infinity
    else:
        mant = np.rint(signed / np.exp2(shift)).astype(np.int64)  # exact, ties to even
    # 32 or more exponents below the block's: only the sign is left (-0.0 included)
    mant = np.where(shared - exp >= 32, np.where(bits >> 31 != 0, -1, 0), mant)
    out = np.empty((len(groups), 9), dtype=np.uint8)
    out[:, 0] = shared[:, 0]
    out[:, 1:] = np.clip(mant, -128, 127).astype(np.int8).view(np.uint8)
    return out


def decode_bfp16ebs8(groups: np.ndarray) -> np.ndarray:
    """[G, 9] bytes -> [G, 8] float32: each mantissa times 2^(shared exponent - 133)."""
    g = np.asarray(groups, dtype=np.uint8).reshape(-1, 9)
    scale = np.ldexp(np.float32(1.0), g[:, :1].astype(np.int32) - 133).astype(np.float32)
    return np.ascontiguousarray(g[:, 1:]).view(np.int8).astype(np.float32) * scale


def quantize_bfp16(x: np.ndarray, rounding: str = "conv_even") -> np.ndarray:
    """x [..., K] (K a multiple of 8) through bfp16ebs8 in blocks of 8 along K and back: the
    values an AIE2P bf16 matmul emulated with bfp16 multiplies."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % 8:
        raise ModelError(f"bfp16 blocks of 8 along K: K = {x.shape[-1]}")
    groups = x.reshape(-1, 8)
    out = np.empty_like(groups)
    for start in range(0, len(groups), 1 << 20):  # in pieces: the encoder's int64 temporaries
        piece = groups[start : start + (1 << 20)]
        out[start : start + len(piece)] = decode_bfp16ebs8(encode_bfp16ebs8(piece, rounding))
    return out.reshape(x.shape)


def unpack_b_bfp16ebs8(buf: np.ndarray, np_: int, kp: int, g: IronGeometry) -> np.ndarray:
    """A packed bfp16ebs8 B stream -> W [np_, kp] float32 (the order inverted)."""
    index = np.arange(np_ * kp, dtype=np.int64).reshape(np_, kp)
    order = np.ascontiguousarray(_blocked(index, g).swapaxes(-1, -2)).reshape(-1)
    out = np.empty(np_ * kp, dtype=np.float32)
    out[order] = decode_bfp16ebs8(np.asarray(buf[: np_ * kp // 8 * 9])).reshape(-1)
    return out.reshape(np_, kp)
