"""bfloat16 as bit patterns (uint16) in numpy: rounding from float32 and widening back."""

from __future__ import annotations

import numpy as np

from npu.errors import ModelError


def to_bf16(x: np.ndarray, rounding: str = "conv_even") -> np.ndarray:
    """float32 -> bfloat16 bits (uint16): "conv_even" rounds to nearest even, "floor" rounds
    toward minus infinity as the AIE cores do (a positive value loses its low 16 bits, an
    inexact negative one steps down one bf16 unit: -1.0039 -> -1.0078, not -1.0; amd/IRON's
    `f32_to_bf16_floor` in its flm operators' references). NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if rounding == "floor":
        inexact_negative = ((bits & np.uint32(0xFFFF)) != 0) & ((bits >> 31) != 0)
        rounded = (bits >> 16) + inexact_negative.astype(np.uint32)
    elif rounding == "conv_even":
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    else:
        raise ModelError(f"rounding {rounding!r} is not 'floor' or 'conv_even'")
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray, rounding: str = "conv_even") -> np.ndarray:
    """x rounded to the nearest bfloat16, as float32."""
    return from_bf16(to_bf16(x, rounding))
