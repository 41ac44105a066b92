"""Rotary position embeddings: inverse frequencies (default, linear, llama3, yarn), the
scale yarn puts on cos/sin, and the rotate-half application Hugging Face models use."""

from __future__ import annotations

import math

import numpy as np

from npu.config import Rope


def inv_freq(rope: Rope, dim: int) -> np.ndarray:
    """Inverse frequencies (float32, dim // 2 of them) as transformers computes them."""
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv = (1.0 / (np.float32(rope.theta) ** exponent)).astype(np.float32)
    if rope.kind == "linear":
        inv = (inv / np.float32(rope.factor)).astype(np.float32)
    elif rope.kind == "llama3":
        factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
        old = rope.original_max_position
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    elif rope.kind == "yarn":
        inv = _yarn(rope, dim)
    if rope.freq_factors:
        if len(rope.freq_factors) != dim // 2:
            raise ValueError(f"{len(rope.freq_factors)} RoPE frequency factors for {dim // 2} "
                             "frequencies")
        inv = (inv / np.asarray(rope.freq_factors, dtype=np.float32)).astype(np.float32)
    return inv


def _yarn(rope: Rope, dim: int) -> np.ndarray:
    """YaRN: interpolated frequencies for the slow dimensions, the original ones for the
    fast, a linear ramp between (as transformers' `_compute_yarn_parameters`)."""
    base, factor = rope.theta, rope.factor

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(base)))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low))
                   / np.float32(high - low), 0, 1).astype(np.float32)
    extrapolation = (1 - ramp).astype(np.float32)
    pos_freqs = (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32)
                                      / np.float32(dim))).astype(np.float32)
    inv_extra = (np.float32(1.0) / pos_freqs).astype(np.float32)
    inv_inter = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
    return (inv_inter * (1 - extrapolation) + inv_extra * extrapolation).astype(np.float32)


def attention_scale(rope: Rope) -> float:
    """The factor on cos and sin (1 except for yarn)."""
    if rope.kind != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    return 1.0 if rope.factor <= 1 else 0.1 * math.log(rope.factor) + 1.0


def cos_sin(inv: np.ndarray, positions: np.ndarray, scale: float = 1.0
            ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [n, dim] for integer positions [n], times `scale`."""
    freqs = positions.astype(np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    if scale == 1.0:
        return np.cos(emb), np.sin(emb)
    return np.cos(emb) * np.float32(scale), np.sin(emb) * np.float32(scale)


def apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x [n, heads, dim] by position tables [n, dim]."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
