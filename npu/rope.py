"""Rotary position embeddings: inverse frequencies (default, linear, llama3) and the
rotate-half application Hugging Face models use."""

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
    return inv


def cos_sin(inv: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [n, dim] for integer positions [n]."""
    freqs = positions.astype(np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x [n, heads, dim] by position tables [n, dim]."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
