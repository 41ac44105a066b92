"""exp and 1/x as an AIE2P core computes them: from lookup tables, not in f32.

AIE2P has no f32 multiplier; its runtime library computes exp and the reciprocal from tables
(`getExpBf16` and `getInvBf16` in Xilinx/mlir-aie aie_runtime_lib/AIE2P/lut_based_ops.h at
0e3f42d6; amd/IRON's flm operators model them in iron/operators/flm/aie2p_math_emulation.py
at 072d3995). Written here from those descriptions, in our words:

- exp(x), x a bf16 value: x in fixed point with 8 fractional bits (rounded toward minus
  infinity, as the core's power-up mode converts), a 16-bit word. Its high byte, read as a
  signed integer n, indexes a table of e^n (n capped at 88), its low byte f a table of
  e^(f / 256); both tables are bf16 (computed on the host, rounded to nearest even). The
  result is their product in f32: a step function with steps of 1/256 in x. A word outside
  16 bits saturates (our assumption where the published model wraps: both agree on the
  documented domain [-87, 88]); an input below -128 gives 0.
- 1/x, x a positive f32: x's bits plus 0x8000 (rounding to 7 mantissa bits), its exponent
  e and 7-bit mantissa m; the result is the bf16 with exponent 253 - e (one more when
  m = 0) and mantissa table[m], table[m] = the low 7 bits of round(256 / (1 + m / 128)).
  The input's and the table's 7-bit roundings leave it up to about 0.6% off (IRON's model
  says up to 0.4% against the rounded input); positive normal inputs only.

A layer op declaring `math: "aie2p"` computes its softmax and SiLU with these
(`npu.xrt.layer_pack`): the simulator then gives the numbers such a kernel gives, not f32's.
"""

from __future__ import annotations

import numpy as np

from npu.xrt.bf16 import from_bf16, round_bf16


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = np.minimum(np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float64), 88)
    with np.errstate(under="ignore"):
        whole = round_bf16(np.exp(n).astype(np.float32))
    fraction = round_bf16(np.exp(np.arange(256) / 256).astype(np.float32))
    inverse = np.round(256 / (1 + np.arange(128) / 128)).astype(np.uint32) & 0x7F
    return whole, fraction, inverse


EXP_WHOLE, EXP_FRACTION, INV_MANTISSA = _tables()


def exp_lut(x: np.ndarray) -> np.ndarray:
    """e^x for bf16 values x (float32 arrays holding bf16 values), as f32."""
    fixed = np.floor(np.asarray(x, dtype=np.float64) * 256)
    word = np.clip(np.nan_to_num(fixed, nan=0.0), -32768, 32767).astype(np.int64) & 0xFFFF
    return (EXP_WHOLE[word >> 8] * EXP_FRACTION[word & 0xFF]).astype(np.float32)


def inv_lut(x: np.ndarray) -> np.ndarray:
    """1 / x for positive f32 x, as bf16 values (float32)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64) + 0x8000
    exponent = (bits & 0x7F800000) >> 23
    mantissa = (bits & 0x007FFFFF) >> 16
    inv_exp = (mantissa == 0) + (253 - exponent)
    return from_bf16((((inv_exp << 7) + INV_MANTISSA[mantissa]) & 0xFFFF).astype(np.uint16))


def softmax(scores: np.ndarray, masked: np.ndarray, rounding: str) -> np.ndarray:
    """Softmax over the last axis, the kernel's way: s - max to bf16 (the op's rounding),
    exp from the tables, an f32 sum, its reciprocal from the table, one product. `masked`
    (broadcast to scores): positions that get 0."""
    s = np.where(masked, np.float32(0), scores).astype(np.float32)
    peak = np.where(masked, -np.inf, s).max(axis=-1, keepdims=True)
    e = np.where(masked, np.float32(0), exp_lut(round_bf16(s - peak, rounding)))
    total = e.sum(axis=-1, keepdims=True, dtype=np.float32)
    return (e * inv_lut(total)).astype(np.float32)


def silu(g: np.ndarray, rounding: str) -> np.ndarray:
    """g * sigmoid(g), sigmoid = 1 / (1 + e^-g) from the tables (-g to bf16 in the op's
    rounding, capped at 80, past which sigmoid is 0 to bf16's precision and 1 + e^-g would
    leave the reciprocal table's range)."""
    e = exp_lut(np.minimum(round_bf16(-np.asarray(g, dtype=np.float32), rounding), 80))
    return (g * inv_lut(np.float32(1) + e)).astype(np.float32)
