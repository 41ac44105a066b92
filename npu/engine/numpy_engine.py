"""NumpyEngine: the CPU engine for Llama, Qwen2/3, Gemma 3, LFM2 and gpt-oss (experts stored
unquantized). Activations are float32; every linear layer is a `Linear` (npu.engine.linear)
over a weight held in its block format (F32, F16, BF16, Q8_0, Q4_0, ...), on the compiled
kernels or the numpy reference.

Tokens from several sequences go through one forward together: every linear layer is one
matrix product over all of them (one pass over the weights per step, whatever the batch).
The KV cache is one pool per layer with a slot per sequence, so a decode step's attention is
also one batched product over the batch's slots; prefill attention and LFM2's short
convolution run per sequence. Prefill is chunked so a long prompt is matrix-matrix work of
bounded size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from npu.engine import rope as rope_mod
from npu.engine.linear import Linear, LinearFactory, Threads
from npu.engine.quant import INTEGER, QMatrix
from npu.errors import ContextLengthError, ModelError
from npu.load.config import ModelConfig

PREFILL_CHUNK = 512


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


class _Layer:
    __slots__ = ("index", "kind", "norm_in", "norm_post_attn", "norm_pre_ff", "norm_post_ff",
                 "wqkv", "bqkv", "wo", "q_norm", "k_norm", "in_proj", "conv", "out_proj",
                 "w_gate_up", "w_down", "inv_freq", "window", "rope_scale", "bo", "sinks",
                 "router_w", "router_b", "experts_gu", "experts_gu_b", "experts_down",
                 "experts_down_b")


class _Seq:
    __slots__ = ("pos", "slot", "conv")

    def __init__(self, n_layers: int, slot: int) -> None:
        self.pos = 0
        self.slot = slot
        self.conv: list[np.ndarray | None] = [None] * n_layers


class _KVPool:
    """Every sequence's keys and values: per attention layer one array
    [slots, kv_heads, capacity, head_dim] for K and one for V.

    A sequence owns a slot (the lowest free one, so the slots in use stay a compact range),
    which lets a decode batch's attention be one product over that range. Capacity grows by
    doubling to the longest sequence, so memory is (highest slot in use + 1) x the longest
    sequence; it is all returned when the last sequence is released.
    """

    def __init__(self, layers: list[int], n_layers: int, kv_heads: int, head_dim: int,
                 max_context: int, dtype=np.float32) -> None:
        self.layers = layers
        self.dtype = dtype
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.max_context = max_context
        self.k: list[np.ndarray | None] = [None] * n_layers
        self.v: list[np.ndarray | None] = [None] * n_layers
        self.slots = 0
        self.capacity = 0
        self.live: set[int] = set()

    def alloc(self) -> int:
        slot = 0
        while slot in self.live:
            slot += 1
        self.live.add(slot)
        return slot

    def free(self, slot: int) -> None:
        self.live.discard(slot)
        if not self.live:
            self.k = [None] * len(self.k)
            self.v = [None] * len(self.v)
            self.slots = self.capacity = 0

    def reserve(self, top_slot: int, need: int) -> None:
        """Room for slot `top_slot` and `need` positions in every slot."""
        if top_slot < self.slots and need <= self.capacity:
            return
        slots = self.slots if top_slot < self.slots else max(top_slot + 1, 2 * self.slots)
        cap = self.capacity
        if need > cap:
            cap = max(need, 2 * cap, 16)
            cap = min(cap, self.max_context) if need <= self.max_context else need
        for li in self.layers:
            for store in (self.k, self.v):
                # zeros, not empty: a decode batch reads past shorter sequences' ends (their
                # weights there are 0, but 0 * NaN from uninitialised memory would be NaN)
                new = np.zeros((slots, self.kv_heads, cap, self.head_dim), dtype=self.dtype)
                old = store[li]
                if old is not None:
                    new[: self.slots, :, : self.capacity] = old
                store[li] = new
        self.slots, self.capacity = slots, cap


class NumpyEngine:
    """Engine interface: prefill(seq_id, ids) -> logits[V]; decode(seq_ids, tokens) ->
    logits[B, V]; release(seq_id). Logits are float32 and owned by the caller.

    Args:
        config: the model's config.
        weights: name -> float32 array or `QMatrix` (a matrix in a block format), Hugging
            Face names; consumed (entries are removed as they are repacked, so peak memory
            stays near one copy of the weights).
        backend: the linear layers' backend ("cpu": the compiled kernels, "reference":
            numpy; see npu.engine.linear).
        threads: the kernels' thread count (default: every core).
    """

    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray | QMatrix], *,
                 backend: str = "cpu", threads: int | None = None) -> None:
        self.config = c = config
        self.vocab_size = c.vocab_size
        self.max_context = c.max_position
        self._seqs: dict[object, _Seq] = {}
        self.linears = LinearFactory(backend, threads or os.cpu_count() or 1)
        self.ops = self.linears.ops()

        def pop(name: str) -> np.ndarray | QMatrix:
            arr = weights.pop(name, None)
            if arr is None:
                raise ModelError(f"the weights lack tensor {name!r} (architecture {c.arch})")
            return arr

        def take(name: str) -> np.ndarray:
            """A vector or small tensor, used as float32."""
            arr = pop(name)
            return arr.dequantize() if isinstance(arr, QMatrix) else arr

        def mat(name: str) -> QMatrix:
            arr = pop(name)
            return arr if isinstance(arr, QMatrix) else QMatrix.from_float(arr)

        def linear(*names: str) -> Linear:
            return self.linears.linear([mat(n) for n in names])

        gemma = c.arch == "gemma3"
        lfm2 = c.arch == "lfm2"

        def norm(name: str) -> np.ndarray:
            w = take(name)
            return np.ascontiguousarray(w + np.float32(1.0) if gemma else w, dtype=np.float32)

        embed = mat("model.embed_tokens.weight")
        self.embed = self.linears.embedding(embed)
        self.embed_scale = np.float32(math.sqrt(c.hidden_size)) if gemma else None
        self.final_norm = norm("model.embedding_norm.weight" if lfm2 else "model.norm.weight")
        if "lm_head.weight" in weights:
            self.lm_head = linear("lm_head.weight")
        elif c.tie_embeddings:
            self.lm_head = self.linears.linear([embed])
        else:
            raise ModelError("the weights lack tensor 'lm_head.weight' and the config does "
                             "not tie it to the embeddings")
        self.layers: list[_Layer] = []
        inv_cache: dict[tuple, np.ndarray] = {}
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            L = _Layer()
            L.index = i
            L.kind = c.layer_types[i]
            L.window = c.sliding_window if L.kind == "sliding_attention" else 0
            if lfm2:
                L.norm_in = norm(p + "operator_norm.weight")
                L.norm_pre_ff = norm(p + "ffn_norm.weight")
                L.norm_post_attn = L.norm_post_ff = None
            else:
                L.norm_in = norm(p + "input_layernorm.weight")
                if gemma:
                    L.norm_post_attn = norm(p + "post_attention_layernorm.weight")
                    L.norm_pre_ff = norm(p + "pre_feedforward_layernorm.weight")
                    L.norm_post_ff = norm(p + "post_feedforward_layernorm.weight")
                else:
                    L.norm_post_attn = L.norm_post_ff = None
                    L.norm_pre_ff = norm(p + "post_attention_layernorm.weight")
            L.wqkv = L.bqkv = L.wo = L.q_norm = L.k_norm = None
            L.in_proj = L.conv = L.out_proj = None
            L.inv_freq = None
            L.rope_scale = 1.0
            L.bo = L.sinks = L.router_w = L.router_b = None
            L.experts_gu = L.experts_gu_b = L.experts_down = L.experts_down_b = None
            if L.kind == "conv":
                L.in_proj = linear(p + "conv.in_proj.weight")
                conv = take(p + "conv.conv.weight")
                L.conv = np.ascontiguousarray(conv.reshape(conv.shape[0], conv.shape[-1]))
                L.out_proj = linear(p + "conv.out_proj.weight")
            else:
                a = p + "self_attn."
                L.wqkv = linear(*(a + n + "_proj.weight" for n in ("q", "k", "v")))
                if c.attention_bias:
                    L.bqkv = np.concatenate([take(a + n + "_proj.bias") for n in ("q", "k", "v")])
                L.wo = linear(a + ("out_proj.weight" if lfm2 else "o_proj.weight"))
                if c.arch == "gpt_oss":
                    L.bo = take(a + "o_proj.bias")
                if c.attention_sinks:
                    L.sinks = take(a + "sinks").astype(np.float32)
                if c.qk_norm:
                    qn, kn = ("q_layernorm", "k_layernorm") if lfm2 else ("q_norm", "k_norm")
                    L.q_norm = norm(a + qn + ".weight")
                    L.k_norm = norm(a + kn + ".weight")
                r = c.rope_for(i)
                key = (r, c.head_dim)
                if key not in inv_cache:
                    inv_cache[key] = rope_mod.inv_freq(r, c.head_dim)
                L.inv_freq = inv_cache[key]
                L.rope_scale = rope_mod.attention_scale(r)
            if c.num_experts:
                m = p + "mlp."
                if m + "experts.gate_up_proj_blocks" in weights:
                    raise ModelError("gpt-oss experts stored as MXFP4 blocks are not supported; "
                                     "dequantize the checkpoint to bf16/fp32 first")
                L.router_w, L.router_b = take(m + "router.weight"), take(m + "router.bias")
                L.experts_gu = take(m + "experts.gate_up_proj")  # [E, H, 2I], used as x @ W
                L.experts_gu_b = take(m + "experts.gate_up_proj_bias")
                L.experts_down = take(m + "experts.down_proj")  # [E, I, H]
                L.experts_down_b = take(m + "experts.down_proj_bias")
                L.w_gate_up = L.w_down = None
            else:
                f = p + ("feed_forward." if lfm2 else "mlp.")
                gate, up, down = (("w1", "w3", "w2") if lfm2 else
                                  ("gate_proj", "up_proj", "down_proj"))
                L.w_gate_up = linear(f + gate + ".weight", f + up + ".weight")
                L.w_down = linear(f + down + ".weight")
            self.layers.append(L)
        self.activation = "silu" if c.activation == "silu" else "gelu_tanh"
        self.scale = np.float32(c.query_scale or c.head_dim ** -0.5)
        # the kernels' f16 cache for a model in integer formats (whose activations are
        # rounded to 8 bits already); a float checkpoint keeps float32 all the way
        integer = self._integer_weights()
        kv_dtype = self.ops.kv_dtype if integer else np.float32
        if not integer:
            # a float model's products run on OpenBLAS's threads, which spin a while after
            # each product: OpenMP threads of the other kernels beside them oversubscribe 2
            # cores (measured: fp32 decode 3x slower), so those kernels take one thread
            self.ops.threads = Threads(1)
        self._kv = _KVPool([L.index for L in self.layers if L.kind != "conv"], len(self.layers),
                           c.num_kv_heads, c.head_dim, self.max_context, kv_dtype)

    def _integer_weights(self) -> bool:
        linears = [L.wqkv for L in self.layers] + [L.w_gate_up for L in self.layers]
        parts = [p for lin in linears if lin is not None
                 for p in getattr(lin, "parts", [lin])]
        return any(p.matrix.qtype in INTEGER for p in parts)

    def _weights(self) -> list:
        """The weights as held (a tied head and its embedding listed once)."""
        arrays = [self.embed.matrix, self.final_norm]
        if self.lm_head is not None and self.lm_head.matrix is not self.embed.matrix:
            arrays.append(self.lm_head)
        for L in self.layers:
            arrays += [a for a in (L.wqkv, L.wo, L.in_proj, L.conv, L.out_proj, L.w_gate_up,
                                   L.w_down, L.router_w, L.experts_gu, L.experts_down)
                       if a is not None]
        return arrays

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as held (a tied head and its embedding counted once)."""
        return sum(a.nbytes for a in self._weights())

    def weight_summary(self) -> dict[str, Any]:
        """`parameters`: the weights' values (norms and embedding included; a tied head
        once); `quantization`: the block format holding most of the layers' matrices
        ("Q4_1", "F32", ...), as Ollama and llama.cpp name a model's quantization."""
        count, by_format = 0, {}
        for a in self._weights():
            parts = getattr(a, "parts", None) or [a]
            for p in parts:
                size = int(np.prod(p.shape))
                count += size
                m = getattr(p, "matrix", p)
                name = getattr(getattr(m, "qtype", None), "name", None)
                if name is not None and a is not self.embed.matrix:
                    by_format[name] = by_format.get(name, 0) + size
        quant = max(by_format, key=by_format.get) if by_format else "F32"
        return {"parameters": count, "quantization": quant}

    def set_threads(self, n: int) -> None:
        """The compiled kernels' thread count (BLAS has its own: threadpoolctl)."""
        self.linears.threads.n = max(1, int(n))

    # -- public interface -------------------------------------------------------------------
    def prefill(self, seq_id: object, ids: Sequence[int]) -> np.ndarray:
        """Run a prompt (or more of it) for `seq_id`; returns the next-token logits [V]."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        seq = self._seq(seq_id)
        self._check_room(seq, ids.size)  # the whole prompt, before any of it runs
        self._kv.reserve(seq.slot, seq.pos + ids.size)
        for start in range(0, ids.size, PREFILL_CHUNK):
            logits = self.prefill_many([(seq_id, ids[start : start + PREFILL_CHUNK])])
        return logits[0]

    def prefill_many(self, items: Sequence[tuple[object, Sequence[int]]]) -> np.ndarray:
        """Prompt pieces of several sequences in one forward (one pass over the weights for
        all of them); returns each one's next-token logits [len(items), V]. Each piece
        should be at most PREFILL_CHUNK tokens."""
        if len({sid for sid, _ in items}) != len(items):
            raise ValueError("prefill_many takes each sequence once")
        segments, ids = [], []
        for sid, piece in items:
            if len(piece) == 0:
                raise ValueError("prefill needs at least one token")
            seq = self._seq(sid)
            self._check_room(seq, len(piece))
            segments.append((seq, len(piece)))
            ids.extend(piece)
        self._kv.reserve(max(s.slot for s, _ in segments), max(s.pos + n for s, n in segments))
        return self._forward(np.asarray(ids, dtype=np.int64), segments)

    def _seq(self, seq_id: object) -> _Seq:
        """The sequence `seq_id`, started (with a cache slot) if it is new."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = self._seqs[seq_id] = _Seq(len(self.layers), self._kv.alloc())
        return seq

    def decode(self, seq_ids: Sequence[object], tokens: Sequence[int]) -> np.ndarray:
        """One token for each sequence, all in one forward; returns logits [B, V]."""
        seqs = []
        for sid in seq_ids:
            seq = self._seqs.get(sid)
            if seq is None:
                raise KeyError(f"unknown sequence {sid!r}: prefill it first")
            self._check_room(seq, 1)
            seqs.append(seq)
        self._kv.reserve(max(s.slot for s in seqs), max(s.pos for s in seqs) + 1)
        return self._forward(np.asarray(tokens, dtype=np.int64), [(s, 1) for s in seqs])

    def fork(self, src: object, dst: object) -> None:
        """Start `dst` as a copy of `src`'s state (n choices share one prefill)."""
        seq = self._seqs[src]
        new = _Seq(len(self.layers), self._kv.alloc())
        new.pos = seq.pos
        self._kv.reserve(new.slot, seq.pos)
        for li in self._kv.layers:
            for store in (self._kv.k, self._kv.v):
                store[li][new.slot, :, : seq.pos] = store[li][seq.slot, :, : seq.pos]
        new.conv = [None if a is None else a.copy() for a in seq.conv]
        self._seqs[dst] = new

    def release(self, seq_id: object) -> None:
        """Free a sequence's caches (unknown ids are ignored)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            self._kv.free(seq.slot)

    def length(self, seq_id: object) -> int:
        seq = self._seqs.get(seq_id)
        return seq.pos if seq else 0

    def kv_usage(self) -> dict[str, int]:
        """What the KV cache holds now: live sequences, KV slots in use, bytes allocated."""
        held = sum(a.nbytes for a in (*self._kv.k, *self._kv.v) if a is not None)
        return {"sequences": len(self._seqs), "kv_slots": len(self._kv.live),
                "kv_bytes": held}

    def _check_room(self, seq: _Seq, n: int) -> None:
        if seq.pos + n > self.max_context:
            raise ContextLengthError(
                f"{seq.pos + n} tokens exceed the model's context length of {self.max_context}",
                limit=self.max_context, requested=seq.pos + n)

    # -- the forward pass -------------------------------------------------------------------
    def _forward(self, ids: np.ndarray, segments: list[tuple[_Seq, int]]) -> np.ndarray:
        c = self.config
        x = self.embed(ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        positions = np.concatenate([np.arange(s.pos, s.pos + n) for s, n in segments])
        tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for li, L in enumerate(self.layers):
            h = self.ops.rms_norm(x, L.norm_in, c.rms_eps)
            if L.kind == "conv":
                h = self._conv(li, L, h, segments)
            else:
                key = (id(L.inv_freq), L.rope_scale)
                if key not in tables:
                    tables[key] = rope_mod.cos_sin(L.inv_freq, positions, L.rope_scale)
                h = self._attention(li, L, h, segments, *tables[key])
            if L.norm_post_attn is not None:
                h = self.ops.rms_norm(h, L.norm_post_attn, c.rms_eps)
            x = x + h
            h = self.ops.rms_norm(x, L.norm_pre_ff, c.rms_eps)
            if L.router_w is not None:
                h = self._experts(L, h)
            else:
                gu = self._mm(h, L, "w_gate_up")
                h = self._mm(self.ops.gated(gu, self.activation), L, "w_down")
            if L.norm_post_ff is not None:
                h = self.ops.rms_norm(h, L.norm_post_ff, c.rms_eps)
            x = x + h
        for seq, n in segments:
            seq.pos += n
        ends = np.cumsum([n for _, n in segments]) - 1
        last = self.ops.rms_norm(x[ends], self.final_norm, c.rms_eps)
        return np.ascontiguousarray(self._mm(last, None, "lm_head"), dtype=np.float32)

    def _mm(self, x: np.ndarray, layer: _Layer | None, name: str) -> np.ndarray:
        """x @ W.T for the named weight of a layer (or the lm_head): the one place a
        linear layer is computed (a `Linear` of the engine's backend), which other engines
        replace."""
        w = self.lm_head if layer is None else getattr(layer, name)
        return w(x)

    def _attention(self, li: int, L: _Layer, h: np.ndarray, segments, cos, sin) -> np.ndarray:
        c = self.config
        nq, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        qkv = self._mm(h, L, "wqkv")
        if L.bqkv is not None:
            qkv = qkv + L.bqkv
        qkv = self.ops.qk_rope(qkv, nq, nkv, L.q_norm, L.k_norm, c.rms_eps, cos, sin)
        T = h.shape[0]
        K, V = self._kv.k[li], self._kv.v[li]
        if len(segments) == T:  # decode: one token per sequence, the batch in one call
            slots = np.fromiter((s.slot for s, _ in segments), dtype=np.int64, count=T)
            pos = np.fromiter((s.pos for s, _ in segments), dtype=np.int64, count=T)
            return self._out_proj(L, self.ops.attend_new(qkv, nq, K, V, slots, pos, L.window,
                                                         L.sinks, self.scale))
        q = qkv[:, : nq * hd].reshape(T, nq, hd)
        k = qkv[:, nq * hd : (nq + nkv) * hd].reshape(T, nkv, hd)
        v = qkv[:, (nq + nkv) * hd :].reshape(T, nkv, hd)
        out = np.empty((T, nq * hd), dtype=np.float32)
        start = 0
        for seq, n in segments:
            total = seq.pos + n
            K[seq.slot, :, seq.pos : total] = k[start : start + n].transpose(1, 0, 2)
            V[seq.slot, :, seq.pos : total] = v[start : start + n].transpose(1, 0, 2)
            out[start : start + n] = self.ops.attend_prompt(
                q[start : start + n], K, V, seq.slot, seq.pos, L.window, L.sinks, self.scale)
            start += n
        return self._out_proj(L, out)

    def _out_proj(self, L: _Layer, out: np.ndarray) -> np.ndarray:
        y = self._mm(out, L, "wo")
        return y + L.bo if L.bo is not None else y

    def _experts(self, L: _Layer, h: np.ndarray) -> np.ndarray:
        """gpt-oss's mixture of experts: each token goes to its top-k experts by the router,
        weighted by the softmax of their router logits; each expert is a clamped SwiGLU
        (gate and up interleaved in its columns, `up + 1`)."""
        c = self.config
        logits = h @ L.router_w.T + L.router_b  # [T, E]
        k = c.experts_per_token
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(logits, top, axis=-1)
        weights = np.exp(weights - weights.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        limit, alpha = np.float32(c.swiglu_limit), np.float32(c.swiglu_alpha)
        out = np.zeros_like(h)
        for e in np.unique(top):
            rows, which = np.nonzero(top == e)  # a token picks an expert at most once
            gu = h[rows] @ L.experts_gu[e] + L.experts_gu_b[e]
            gate = np.minimum(gu[:, ::2], limit)
            up = np.clip(gu[:, 1::2], -limit, limit)
            y = ((up + 1) * (gate * sigmoid(gate * alpha))) @ L.experts_down[e]
            out[rows] += (y + L.experts_down_b[e]) * weights[rows, which][:, None]
        return out

    def _conv(self, li: int, L: _Layer, h: np.ndarray, segments) -> np.ndarray:
        H = self.config.hidden_size
        width = L.conv.shape[1]
        bcx = self._mm(h, L, "in_proj")
        b, cgate, xin = bcx[:, :H], bcx[:, H : 2 * H], bcx[:, 2 * H :]
        bx = b * xin
        if len(segments) == len(bx) > 1:  # decode: one token per sequence, all at once
            zeros = np.zeros((width - 1, H), dtype=np.float32)
            window = np.concatenate(
                [np.stack([zeros if s.conv[li] is None else s.conv[li] for s, _ in segments]),
                 bx[:, None, :]], axis=1)  # [B, w, H]
            acc = np.zeros_like(bx)
            for j in range(width):  # the order of the one-sequence sum below
                acc += window[:, j] * L.conv[:, j]
            for row, (seq, _) in enumerate(segments):
                seq.conv[li] = window[row, 1:]
            return self._mm(cgate * acc, L, "out_proj")
        out = np.empty_like(bx)
        start = 0
        for seq, n in segments:
            state = seq.conv[li]
            if state is None:
                state = np.zeros((width - 1, H), dtype=np.float32)
            window = np.concatenate([state, bx[start : start + n]], axis=0)  # [w-1+n, H]
            acc = np.zeros((n, H), dtype=np.float32)
            for j in range(width):
                acc += window[j : j + n] * L.conv[:, j]
            out[start : start + n] = acc
            seq.conv[li] = window[-(width - 1) :].copy()
            start += n
        return self._mm(cgate * out, L, "out_proj")
