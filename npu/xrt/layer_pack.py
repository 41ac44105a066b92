"""The buffers of the layer ops (`attn`, `mlp`, `layer`): one Llama / Qwen3 decoder layer
for m consecutive tokens of one sequence (m = 1: a decoded token; more: a prompt's tile) with
its KV cache on the device. Written once, read by the engine (which packs)
and the simulator (which computes what a kernel built to this contract computes).

Weight buffer `w` of a layer, `layer_pack.v1` (the `layer` op takes attn then mlp):

    attn: f32 norm_in[hidden] | f32 q_norm[head_dim] | f32 k_norm[head_dim]
          | f32 inv_freq[head_dim / 2] | f32 rope_scale, scale, eps, 0
          | wqkv [(heads + 2 kv_heads) * head_dim, hidden] | wo [hidden, heads * head_dim]
    mlp:  f32 norm_pre_ff[hidden] | f32 eps, 0, 0, 0
          | w_gate_up [2 ffn, hidden] | w_down [hidden, ffn]

(the matrices in the op's layout and tiling, `npu.xrt.packing`; q_norm / k_norm are ones when
the model has none). Other buffers:

    x      the residual stream [m, hidden] (the op's x dtype), updated in place
           (x += attention; x += mlp)
    kv     the sequence's cache, bf16 [2, kv_heads, ctx, head_dim] (keys after RoPE)
    rtp    int32 [4]: the first token's position p (runtime data, not a shape), 0, 0, 0;
           row r is the token at p + r, attends to positions <= p + r, and p + m <= ctx
           (an op with scalars "insts" has no rtp: p and the KV length are words of its
           instruction stream, set per launch; see npu.xrt.manifest)
    kvnew  bf16 [m, 2, kv_heads, head_dim]: the keys and values the kernel wrote at p..p+m-1
           (read back so the host's paged cache mirrors the device's)

All m rows are computed (a tile the host fills partly leaves rows it does not read: their
keys and values land at positions that the real tokens there overwrite before anything
attends to them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npu.xrt import aie2p_math, packing
from npu.xrt.packing import Tiling


@dataclass(frozen=True)
class LayerDims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    ctx: int
    qk_norm: bool
    m: int = 1

    @property
    def qkv(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


def attn_tilings(d: LayerDims, layout: str, tn: int, tk: int) -> tuple[Tiling, Tiling]:
    return (packing.tiling(layout, d.qkv, d.hidden, tn, tk),
            packing.tiling(layout, d.hidden, d.heads * d.head_dim, tn, tk))


def mlp_tilings(d: LayerDims, layout: str, tn: int, tk: int) -> tuple[Tiling, Tiling]:
    return (packing.tiling(layout, 2 * d.ffn, d.hidden, tn, tk),
            packing.tiling(layout, d.hidden, d.ffn, tn, tk))


def attn_header_floats(d: LayerDims) -> int:
    return d.hidden + 2 * d.head_dim + d.head_dim // 2 + 4


def mlp_header_floats(d: LayerDims) -> int:
    return d.hidden + 4


def attn_bytes(d: LayerDims, layout: str, tn: int, tk: int) -> int:
    a, b = attn_tilings(d, layout, tn, tk)
    return 4 * attn_header_floats(d) + a.nbytes + b.nbytes


def mlp_bytes(d: LayerDims, layout: str, tn: int, tk: int) -> int:
    a, b = mlp_tilings(d, layout, tn, tk)
    return 4 * mlp_header_floats(d) + a.nbytes + b.nbytes


def kv_bytes(d: LayerDims) -> int:
    return 2 * d.kv_heads * d.ctx * d.head_dim * 2


def kvnew_bytes(d: LayerDims) -> int:
    return d.m * 2 * d.kv_heads * d.head_dim * 2


def pack_attn(d: LayerDims, layout: str, tn: int, tk: int, *, norm_in: np.ndarray,
              q_norm: np.ndarray | None, k_norm: np.ndarray | None, inv_freq: np.ndarray,
              rope_scale: float, scale: float, eps: float, wqkv, wo) -> np.ndarray:
    """`wqkv`, `wo`: float32 arrays, or callables that pack themselves given a Tiling."""
    ones = np.ones(d.head_dim, dtype=np.float32)
    head = np.concatenate([norm_in, ones if q_norm is None else q_norm,
                           ones if k_norm is None else k_norm, inv_freq,
                           [rope_scale, scale, eps, 0.0]]).astype(np.float32)
    t_qkv, t_o = attn_tilings(d, layout, tn, tk)
    return np.concatenate([head.view(np.uint8), _packed(wqkv, t_qkv), _packed(wo, t_o)])


def pack_mlp(d: LayerDims, layout: str, tn: int, tk: int, *, norm_pre_ff: np.ndarray,
             eps: float, w_gate_up, w_down) -> np.ndarray:
    head = np.concatenate([norm_pre_ff, [eps, 0.0, 0.0, 0.0]]).astype(np.float32)
    t_gu, t_d = mlp_tilings(d, layout, tn, tk)
    return np.concatenate([head.view(np.uint8), _packed(w_gate_up, t_gu), _packed(w_down, t_d)])


def _packed(w, t: Tiling) -> np.ndarray:
    return w(t) if callable(w) else packing.pack(w, t)


# -- what a kernel computes (the simulator's side) ---------------------------------------------
def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w


Unpack = Callable[[int, Tiling], np.ndarray]


def unpacker(w: np.ndarray, rounding: str) -> Unpack:
    """The values of the matrix at byte `offset` of a layer's weight buffer `w`."""
    return lambda offset, t: packing.unpack(w[offset : offset + t.nbytes], t, rounding)


def _matmul(x: np.ndarray, weight: np.ndarray, t: Tiling, rounding: str) -> np.ndarray:
    """bf16(x) @ W.T with f32 accumulation over the decoded weight (real outputs only)."""
    xp = np.zeros((len(x), t.kp), dtype=np.float32)
    xp[:, : t.k] = packing.round_bf16(x, rounding)
    return (xp @ weight.T)[:, : t.n].astype(np.float32)


def run_attn(d: LayerDims, layout: str, tn: int, tk: int, rounding: str, w: np.ndarray,
             x: np.ndarray, kv: np.ndarray, pos: int, kvnew: np.ndarray,
             unpack: Unpack | None = None, math: str = "exact") -> None:
    """x [m, hidden] f32 (in place), kv bf16 bits [2, kv_heads, ctx, head_dim] (in place),
    kvnew bf16 bits [m, 2, kv_heads, head_dim] (out); `unpack(offset, tiling)` decodes a
    matrix of `w` (default: `unpacker(w)`; a caller may cache); `math` "aie2p": the
    softmax's exp and 1/x from AIE2P's tables (`npu.xrt.aie2p_math`)."""
    unpack = unpack or unpacker(w, rounding)
    H, nq, nkv, hd, m = d.hidden, d.heads, d.kv_heads, d.head_dim, len(x)
    head = w[: 4 * attn_header_floats(d)].view(np.float32)
    norm_in, q_norm, k_norm = head[:H], head[H : H + hd], head[H + hd : H + 2 * hd]
    inv = head[H + 2 * hd : H + 2 * hd + hd // 2]
    rope_scale, scale, eps = (float(v) for v in head[H + 2 * hd + hd // 2 :][:3])
    t_qkv, t_o = attn_tilings(d, layout, tn, tk)
    at = 4 * attn_header_floats(d)
    qkv = _matmul(_rms(x, norm_in, eps), unpack(at, t_qkv), t_qkv, rounding)
    q = qkv[:, : nq * hd].reshape(m, nq, hd)
    k = qkv[:, nq * hd : (nq + nkv) * hd].reshape(m, nkv, hd)
    v = qkv[:, (nq + nkv) * hd :].reshape(m, nkv, hd)
    if d.qk_norm:
        q, k = _rms(q, q_norm, eps), _rms(k, k_norm, eps)
    positions = pos + np.arange(m)
    freqs = positions.astype(np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos = (np.cos(emb) * np.float32(rope_scale))[:, None, :]
    sin = (np.sin(emb) * np.float32(rope_scale))[:, None, :]

    def rope(a: np.ndarray) -> np.ndarray:
        half = hd // 2
        return a * cos + np.concatenate([-a[..., half:], a[..., :half]], axis=-1) * sin

    q, k = rope(q), rope(k)
    kv[0, :, pos : pos + m] = packing.to_bf16(k, rounding).transpose(1, 0, 2)
    kv[1, :, pos : pos + m] = packing.to_bf16(v, rounding).transpose(1, 0, 2)
    kvnew[:, 0] = kv[0, :, pos : pos + m].transpose(1, 0, 2)
    kvnew[:, 1] = kv[1, :, pos : pos + m].transpose(1, 0, 2)
    keys = packing.from_bf16(kv[0, :, : pos + m])  # [nkv, T, hd]
    vals = packing.from_bf16(kv[1, :, : pos + m])
    group = nq // nkv
    qg = packing.round_bf16(q, rounding).reshape(m, nkv, group, hd)
    scores = np.einsum("mhgd,htd->mhgt", qg, keys) * np.float32(scale)
    future = np.arange(pos + m)[None, :] > positions[:, None]  # [m, T]
    if math == "aie2p":
        probs = aie2p_math.softmax(scores, future[:, None, None, :], rounding)
    else:
        scores = np.where(future[:, None, None, :], np.float32(-np.inf), scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
    out = np.einsum("mhgt,htd->mhgd", probs, vals).reshape(m, nq * hd)
    o = _matmul(out, unpack(at + t_qkv.nbytes, t_o), t_o, rounding)
    x += o


def run_mlp(d: LayerDims, layout: str, tn: int, tk: int, rounding: str, w: np.ndarray,
            x: np.ndarray, unpack: Unpack | None = None, math: str = "exact") -> None:
    """x [m, hidden] f32, in place; `math` "aie2p": SiLU's exp and 1/x from the tables."""
    unpack = unpack or unpacker(w, rounding)
    H = d.hidden
    head = w[: 4 * mlp_header_floats(d)].view(np.float32)
    norm, eps = head[:H], float(head[H])
    t_gu, t_d = mlp_tilings(d, layout, tn, tk)
    at = 4 * mlp_header_floats(d)
    gu = _matmul(_rms(x, norm, eps), unpack(at, t_gu), t_gu, rounding)
    g, u = gu[:, : d.ffn], gu[:, d.ffn :]
    a = (aie2p_math.silu(g, rounding) if math == "aie2p" else g / (1.0 + np.exp(-g))) * u
    x += _matmul(a.astype(np.float32), unpack(at + t_gu.nbytes, t_d), t_d, rounding)
