"""NumpyEngine: the CPU engine for Llama, Qwen2/3, Gemma 3, LFM2 and gpt-oss (experts stored
unquantized), for generation and for embeddings (`embed`: pooled hidden states, without the
KV cache). Activations are float32; every linear layer is a `Linear` (npu.engine.linear)
over a weight held in its block format (F32, F16, BF16, Q8_0, Q4_0, ...), on the compiled
kernels or the numpy reference.

Tokens from several sequences go through one forward together: every linear layer is one
matrix product over all of them (one pass over the weights per step, whatever the batch).
The KV cache is paged (npu.engine.kv_cache): blocks of 16 positions, a block table per
sequence, full blocks named by the tokens they cover and shared by every sequence that starts
with those tokens (`reuse_prefix`), so a decode step's attention is one kernel call over the
batch's tables and a prompt that repeats an earlier one computes only its new tokens; prefill
attention and LFM2's short convolution run per sequence. Prefill is chunked so a long prompt
is matrix-matrix work of bounded size.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from npu.config import ModelConfig
from npu.engine import rope as rope_mod
from npu.engine.attention import PackedAttention, embed_inputs, row_spans
from npu.engine.cores import default_threads
from npu.engine.fused import FusedLayers
from npu.engine.kv_cache import KV_TYPES, BlockPool, SeqBlocks, kv_row
from npu.engine.linear import Linear, LinearFactory, PackedMatrix, Threads
from npu.engine.ops import KernelOps
from npu.engine.pooling import RANK, Pooling, pool
from npu.engine.quant import INTEGER, QMatrix
from npu.engine.roles import Roles, roles_for
from npu.engine.steps import Steps, run_steps
from npu.errors import ContextLengthError, KVCacheFull, ModelError

log = logging.getLogger(__name__)
PREFILL_CHUNK = 512
# rows of packed inputs an `embed_steps` step computes at most (a layer's work before or after
# its attention): about 10-100 ms of a 135M-0.6B model on 2 cores
EMBED_TILE = 256
# `pack_later`: the packed weights' last bytes left for `pack` (about 0.1-0.2 s of packing on
# 2 cores, the tokenizer's build; those before are packed as made, each batch in one call)
PACK_LATER = 256 << 20


def default_kv_budget(bytes_per_token: int, max_context: int) -> int:
    """A KV cache budget that fits the host: eight full contexts, at most a quarter of the
    physical memory."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        memory = 8 << 30
    return max(1 << 20, min(8 * max_context * bytes_per_token, memory // 4))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


class Layer:
    __slots__ = ("index", "kind", "norm_in", "norm_post_attn", "norm_pre_ff", "norm_post_ff",
                 "wqkv", "bqkv", "wo", "q_norm", "k_norm", "in_proj", "conv", "out_proj",
                 "w_gate_up", "w_down", "inv_freq", "window", "rope_scale", "bo", "sinks",
                 "router_w", "router_b", "experts_gu", "experts_gu_b", "experts_down",
                 "experts_down_b")


class Seq:
    __slots__ = ("kv", "conv")

    def __init__(self, n_layers: int, kv: SeqBlocks | None = None) -> None:
        self.kv = kv if kv is not None else SeqBlocks()
        self.conv: list[np.ndarray | None] = [None] * n_layers

    @property
    def pos(self) -> int:
        return self.kv.pos


class _Row:
    """One verified token of a sequence: its blocks, at one position (`NumpyEngine.verify`)."""

    __slots__ = ("kv", "pos", "conv")

    def __init__(self, seq: Seq, pos: int) -> None:
        self.kv, self.pos, self.conv = seq.kv, pos, seq.conv


class Tensors:
    """A checkpoint's tensors taken by name (each taken once: the dict shrinks as the
    engine takes them): small tensors as float32, matrices in their block formats, linear
    layers of the engine's backend."""

    def __init__(self, weights: dict[str, np.ndarray | QMatrix], linears: LinearFactory,
                 arch: str) -> None:
        self.weights, self.linears, self.arch = weights, linears, arch

    def pop(self, name: str) -> np.ndarray | QMatrix:
        arr = self.weights.pop(name, None)
        if arr is None:
            raise ModelError(f"the weights lack tensor {name!r} (architecture {self.arch})")
        return arr

    def take(self, name: str) -> np.ndarray:
        """A vector or small tensor, used as float32."""
        arr = self.pop(name)
        arr = arr.dequantize() if isinstance(arr, QMatrix) else arr
        return np.ascontiguousarray(arr, dtype=np.float32)

    def mat(self, name: str) -> QMatrix | PackedMatrix:
        arr = self.pop(name)
        return arr if isinstance(arr, (QMatrix, PackedMatrix)) else QMatrix.from_float(arr)

    def linear(self, *names: str) -> Linear:
        return self.linears.linear([self.mat(n) for n in names])


class _Weights(Tensors):
    """A decoder's tensors, norms read by the architecture's roles."""

    def __init__(self, weights: dict[str, np.ndarray | QMatrix], linears: LinearFactory,
                 roles: Roles, arch: str) -> None:
        super().__init__(weights, linears, arch)
        self.roles = roles

    def norm(self, name: str) -> np.ndarray:
        w = self.take(name)
        return np.ascontiguousarray(w + np.float32(1.0) if self.roles.norm_offset else w,
                                    dtype=np.float32)


def _layer(c: ModelConfig, i: int, w: _Weights, inv_cache: dict[tuple, np.ndarray]) -> Layer:
    """Decoder layer i, its tensors taken from `w` by their roles."""
    R, p = w.roles, f"model.layers.{i}."
    L = Layer()
    L.index = i
    L.kind = c.layer_types[i]
    L.window = c.sliding_window if L.kind == "sliding_attention" else 0
    L.norm_in = w.norm(p + R.norm_in + ".weight")
    L.norm_pre_ff = w.norm(p + R.norm_pre_ff + ".weight")
    L.norm_post_attn = w.norm(p + R.norm_post_attn + ".weight") if R.norm_post_attn else None
    L.norm_post_ff = w.norm(p + R.norm_post_ff + ".weight") if R.norm_post_ff else None
    L.wqkv = L.bqkv = L.wo = L.q_norm = L.k_norm = None
    L.in_proj = L.conv = L.out_proj = None
    L.inv_freq = None
    L.rope_scale = 1.0
    L.bo = L.sinks = L.router_w = L.router_b = None
    L.experts_gu = L.experts_gu_b = L.experts_down = L.experts_down_b = None
    if L.kind == "conv":
        L.in_proj = w.linear(p + "conv.in_proj.weight")
        conv = w.take(p + "conv.conv.weight")
        L.conv = np.ascontiguousarray(conv.reshape(conv.shape[0], conv.shape[-1]))
        L.out_proj = w.linear(p + "conv.out_proj.weight")
    else:
        a = p + "self_attn."
        L.wqkv = w.linear(*(a + n + "_proj.weight" for n in ("q", "k", "v")))
        if c.attention_bias:
            L.bqkv = np.concatenate([w.take(a + n + "_proj.bias") for n in ("q", "k", "v")])
        L.wo = w.linear(a + R.attn_out + ".weight")
        if c.arch == "gpt_oss":
            L.bo = w.take(a + "o_proj.bias")
        if c.attention_sinks:
            L.sinks = w.take(a + "sinks").astype(np.float32)
        if c.qk_norm:
            L.q_norm = w.norm(a + R.q_norm + ".weight")
            L.k_norm = w.norm(a + R.k_norm + ".weight")
        r = c.rope_for(i)
        key = (r, c.head_dim)
        if key not in inv_cache:
            inv_cache[key] = rope_mod.inv_freq(r, c.head_dim)
        L.inv_freq = inv_cache[key]
        L.rope_scale = rope_mod.attention_scale(r)
    if c.num_experts:
        m = p + "mlp."
        if m + "experts.gate_up_proj_blocks" in w.weights:
            raise ModelError("gpt-oss experts stored as MXFP4 blocks are not supported; "
                             "dequantize the checkpoint to bf16/fp32 first")
        L.router_w, L.router_b = w.take(m + "router.weight"), w.take(m + "router.bias")
        L.experts_gu = w.take(m + "experts.gate_up_proj")  # [E, H, 2I], used as x @ W
        L.experts_gu_b = w.take(m + "experts.gate_up_proj_bias")
        L.experts_down = w.take(m + "experts.down_proj")  # [E, I, H]
        L.experts_down_b = w.take(m + "experts.down_proj_bias")
        L.w_gate_up = L.w_down = None
    else:
        f = p + R.mlp + "."
        L.w_gate_up = w.linear(f + R.gate + ".weight", f + R.up + ".weight")
        L.w_down = w.linear(f + R.down + ".weight")
    return L


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
        threads: the kernels' thread count (default: one per physical core, npu.engine.cores).
        kv_cache_bytes: the KV cache's budget (default: `default_kv_budget`).
        prefix_cache: keep finished prompts' KV for later ones that start alike (models with
            state outside the KV, LFM2's convolutions, never do).
        kv_cache_type: the kernels' KV cache format for a model in integer block formats:
            "f16" (the default), or "q8_0" (8-bit codes with an f16 scale per 32 values: about
            half the memory and the bytes a decode step reads at long contexts; a head size
            that is a multiple of 32). A float checkpoint's cache is float32.
        pooling: how `embed` pools a token list's hidden states (default: mean).
        pack_later: the last packed weights (those made since the last PACK_LATER bytes were
            passed) are written by `pack()`, which the caller runs (on a thread of its own)
            before any forward pass; matrices in writable memory (a k-quant's conversion)
            are packed in place (`weights` are the engine's alone: a loader's).
    """

    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray | QMatrix], *,
                 backend: str = "cpu", threads: int | None = None,
                 kv_cache_bytes: int | None = None, prefix_cache: bool = True,
                 kv_cache_type: str = "f16", pooling: Pooling | None = None,
                 pack_later: bool = False) -> None:
        self.config = c = config
        self.pooling = pooling or Pooling()
        self.pooling.dims(c.hidden_size)  # a Dense layer of the wrong width fails here
        self.vocab_size = c.vocab_size
        self.max_context = c.max_position
        self._seqs: dict[object, Seq] = {}
        self.linears = LinearFactory(backend, threads or default_threads(),
                                     later=PACK_LATER if pack_later else 0)
        self.ops = self.linears.ops()

        w = _Weights(weights, self.linears, roles_for(c.arch), c.arch)
        tied = "lm_head.weight" not in weights and c.tie_embeddings
        self.embed_tokens = self.linears.embedding(w.mat("model.embed_tokens.weight"), head=tied)
        self.embed_scale = (np.float32(math.sqrt(c.hidden_size)) if w.roles.scaled_embedding
                            else None)
        self.final_norm = w.norm(w.roles.final_norm)
        if "lm_head.weight" in weights:
            self.lm_head = w.linear("lm_head.weight")
        elif tied:
            self.lm_head = self.linears.tied_head(self.embed_tokens)
        elif self.pooling.mode == RANK:  # a decoder reranker: its pooling's head scores
            self.lm_head = None
        else:
            raise ModelError("the weights lack tensor 'lm_head.weight' and the config does "
                             "not tie it to the embeddings")
        inv_cache: dict[tuple, np.ndarray] = {}
        self.layers: list[Layer] = [_layer(c, i, w, inv_cache) for i in range(c.num_layers)]
        self.activation = "silu" if c.activation == "silu" else "gelu_tanh"
        self.scale = np.float32(c.query_scale or c.head_dim ** -0.5)
        # the kernels' f16 cache for a model in integer formats (whose activations are
        # rounded to 8 bits already); a float checkpoint keeps float32 all the way
        integer = self._integer_weights()
        kv_dtype = self.ops.kv_dtype if integer else np.float32
        if kv_cache_type not in KV_TYPES:
            raise ModelError(f"kv_cache_type {kv_cache_type!r} is not one of "
                             f"{', '.join(KV_TYPES)}")
        if kv_cache_type == "q8_0":
            if not integer or not isinstance(self.ops, KernelOps):
                raise ModelError("kv_cache_type q8_0 needs a model in integer block formats "
                                 "(a GGUF file, or `quantize`) on the compiled CPU kernels")
            if c.head_dim % 32:
                raise ModelError(f"kv_cache_type q8_0 needs a head size that is a multiple of "
                                 f"32 (this model's: {c.head_dim})")
            kv_dtype = np.uint8
        if not integer:
            # a float model's products run on OpenBLAS's threads, which spin a while after
            # each product: OpenMP threads of the other kernels beside them oversubscribe 2
            # cores (measured: fp32 decode 3x slower), so those kernels take one thread
            self.ops.threads = Threads(1)
        attention = [L.index for L in self.layers if L.kind != "conv"]
        # a conv layer's state is not per-token KV: such a model (LFM2) recomputes prompts
        self.prefix_cache = prefix_cache and len(attention) == len(self.layers)
        if prefix_cache and not self.prefix_cache:
            log.info("Prefix caching is off for %s: its convolution layers keep a state that "
                     "is not in the KV cache", c.arch)
        per_token = (2 * len(attention) * c.num_kv_heads * kv_row(kv_dtype, c.head_dim)
                     * np.dtype(kv_dtype).itemsize)
        self.kv = BlockPool(attention, len(self.layers), c.num_kv_heads, c.head_dim,
                            kv_cache_bytes or default_kv_budget(per_token, self.max_context),
                            kv_dtype, caching=self.prefix_cache)
        # a step's layers in one call of the kernels where they apply (integer formats); an
        # engine that replaces the products or the layers keeps its own path
        own = type(self)._mm is NumpyEngine._mm and type(self)._layers is NumpyEngine._layers
        self.fused: FusedLayers | None = FusedLayers.of(self) if own and integer else None

    def pack(self, threads: int | None = None) -> None:
        """Writes the packed weights that `pack_later` left (those made since the last
        PACK_LATER bytes were passed), in one call that lets the GIL go, on `threads`
        threads (default: one per physical core): a loader builds the tokenizer meanwhile. A forward
        pass (or `embed`) before it, or after it failed, raises RuntimeError."""
        self.linears.pack(threads)

    def _check_packed(self) -> None:
        if self.linears.unpacked:
            raise RuntimeError("the engine was made with pack_later: its pack() has not "
                               "written every weight")

    def _integer_weights(self) -> bool:
        linears = [L.wqkv for L in self.layers] + [L.w_gate_up for L in self.layers]
        parts = [p for lin in linears if lin is not None
                 for p in getattr(lin, "parts", [lin])]
        return any(p.matrix.qtype in INTEGER for p in parts)

    def _weights(self) -> list:
        """The weights as held (a tied head and its embedding listed once)."""
        arrays = [self.embed_tokens.matrix, self.final_norm]
        if self.lm_head is not None and self.lm_head.matrix is not self.embed_tokens.matrix:
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

    @property
    def kv_max_blocks(self) -> int:
        """The most KV blocks the cache may hold."""
        return self.kv.max_blocks

    def check_device(self) -> None:
        """The CPU is always there."""

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
                if name is not None and a is not self.embed_tokens.matrix:
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
        self.kv.reserve(seq.kv, seq.pos + ids.size)
        for start in range(0, ids.size, PREFILL_CHUNK):
            logits = self.prefill_many([(seq_id, ids[start : start + PREFILL_CHUNK])])
        return logits[0]

    def reuse_prefix(self, seq_id: object, ids: Sequence[int]) -> int:
        """Start the new sequence `seq_id` on the cached KV of the longest prefix of its
        prompt `ids` that an earlier sequence computed (whole blocks, at least one token
        left to compute); returns how many tokens that covers: prefill the rest."""
        seq = self._seq(seq_id)
        return self.kv.adopt(seq.kv, ids) if seq.pos == 0 else 0

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """How many tokens of the prompt `ids` `reuse_prefix` would take from the cache
        now (nothing is taken)."""
        return self.kv.cached(ids)

    def prefill_many(self, items: Sequence[tuple[object, Sequence[int]]], *,
                     every_row: bool = False) -> np.ndarray:
        """Prompt pieces of several sequences in one forward (one pass over the weights for
        all of them); returns each one's next-token logits [len(items), V] (`every_row`:
        the logits after every token of the pieces, [sum of their lengths, V], the pieces'
        rows one after another: a prompt's own logprobs). Each piece should be at most
        PREFILL_CHUNK tokens.

        Raises:
            KVCacheFull: the pieces' KV does not fit (nothing has run; blocks reserved for
                the pieces so far stay with their sequences).
        """
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
        for seq, n in segments:
            self.kv.reserve(seq.kv, seq.pos + n)
        return self._forward(np.asarray(ids, dtype=np.int64), segments, every_row=every_row)

    @property
    def can_rewind(self) -> bool:
        """Whether `rewind` can take tokens back (all state is in the KV cache: not for a
        model with convolution layers, whose state is not per token)."""
        return len(self.kv.layers) == len(self.layers)

    def verify(self, items: Sequence[tuple[object, Sequence[int]]]) -> np.ndarray:
        """Tokens of several running sequences in one forward (speculative decoding: each
        sequence's next token and the tokens drafted after it), with the logits after
        every token: [sum of the pieces' lengths, V], the pieces' rows one after another.
        A one-token piece gets the logits `decode` would give it. Take back the tokens not
        kept with `rewind`.

        Raises:
            KVCacheFull: the pieces' KV does not fit (nothing has run).
        """
        if len({sid for sid, _ in items}) != len(items):
            raise ValueError("verify takes each sequence once")
        segments, ids = [], []
        for sid, piece in items:
            seq = self._seqs.get(sid)
            if seq is None:
                raise KeyError(f"unknown sequence {sid!r}: prefill it first")
            if len(piece) == 0:
                raise ValueError("verify needs at least one token per sequence")
            self._check_room(seq, len(piece))
            segments.append((seq, len(piece)))
            ids.extend(piece)
        if self.blocks_needed([(sid, len(p)) for sid, p in items]) > self.kv.available():
            raise KVCacheFull("the KV cache cannot hold the drafted tokens")
        for seq, n in segments:
            self.kv.reserve(seq.kv, seq.pos + n)
        # each row as its own one-token piece, so the forward takes the decode path (the
        # keys and values of every row written first, then each row attending up to its
        # own position): the same attention kernel, and so the same bits, as `decode`
        # (the prompt path's blocked attention sums in another order, and a near-tie of
        # greedy decoding would then go the other way with drafts than without)
        rows = [(_Row(seq, seq.pos + i), 1) for seq, n in segments for i in range(n)]
        return self._forward(np.asarray(ids, dtype=np.int64), rows)

    def rewind(self, seq_id: object, length: int) -> None:
        """Take `seq_id` back to its first `length` tokens (drafted tokens not kept): the
        KV past them is dropped, and a cached block that named them is forgotten before
        the sequence writes other tokens over it (blocks other sequences share, whole ones
        before `length`, are never written).

        Raises:
            ModelError: the model keeps state outside the KV cache (`can_rewind` is False).
        """
        seq = self._seqs[seq_id]
        if length >= seq.pos:
            return
        if not self.can_rewind:
            raise ModelError("this model keeps state outside the KV cache: it cannot rewind")
        self.kv.truncate(seq.kv, length)

    def _seq(self, seq_id: object) -> Seq:
        """The sequence `seq_id`, started (with no blocks yet) if it is new."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = self._seqs[seq_id] = Seq(len(self.layers))
        return seq

    def decode(self, seq_ids: Sequence[object], tokens: Sequence[int]) -> np.ndarray:
        """One token for each sequence, all in one forward; returns logits [B, V].

        Raises:
            KVCacheFull: a sequence needs a new block and none is left (nothing has run).
        """
        seqs = []
        for sid in seq_ids:
            seq = self._seqs.get(sid)
            if seq is None:
                raise KeyError(f"unknown sequence {sid!r}: prefill it first")
            self._check_room(seq, 1)
            seqs.append(seq)
        for seq in seqs:
            self.kv.reserve(seq.kv, seq.pos + 1)
        return self._forward(np.asarray(tokens, dtype=np.int64), [(s, 1) for s in seqs])

    def blocks_needed(self, items: Sequence[tuple[object, int]]) -> int:
        """KV blocks the sequences need to take the given numbers of tokens more (a new
        sequence starts empty)."""
        total = 0
        for sid, tokens in items:
            seq = self._seqs.get(sid)
            kv = seq.kv if seq is not None else SeqBlocks()
            total += self.kv.blocks_needed(kv, kv.pos + tokens)
        return total

    def blocks_available(self) -> int:
        """KV blocks free, evictable, or still within the budget."""
        return self.kv.available()

    def fork(self, src: object, dst: object) -> None:
        """Start `dst` as a copy of `src`'s state (n choices share one prefill: the full
        blocks are shared, the partial last one copied)."""
        seq = self._seqs[src]
        new = Seq(len(self.layers), self.kv.fork(seq.kv))
        new.conv = [None if a is None else a.copy() for a in seq.conv]
        self._seqs[dst] = new

    def release(self, seq_id: object) -> None:
        """End a sequence: its KV blocks go back to the cache (unknown ids are ignored)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            self.kv.release(seq.kv)

    def length(self, seq_id: object) -> int:
        seq = self._seqs.get(seq_id)
        return seq.pos if seq else 0

    def kv_usage(self) -> dict[str, int]:
        """What the KV cache holds now: live sequences, blocks they hold, blocks kept only
        for reuse, bytes allocated."""
        return {"sequences": len(self._seqs), **self.kv.usage()}

    def embed(self, items: Sequence[Sequence[int]]) -> np.ndarray:
        """Embedding vectors of several token lists in one forward: float32
        [len(items), dims], each row the pooled last hidden states of one list (after the
        final norm and the pooling's Dense layers; not normalized). `embed_steps`, run to
        its end.

        Causal attention, over each list's own tokens only: the KV cache is not read,
        written or evicted, and no sequence is left behind. A row is the same whatever else
        is in the batch (bit for bit with integer block formats).

        Raises:
            ValueError: a list is empty, or has an id outside the vocabulary.
            ContextLengthError: a list is longer than the model's context.
        """
        return run_steps(self.embed_steps(items))

    def embed_steps(self, items: Sequence[Sequence[int]]) -> Steps[np.ndarray]:
        """`embed` in steps (the vectors are the generator's value): a step is one layer's
        work before or after its attention for a span of at most EMBED_TILE packed rows
        (`row_spans`), or a convolution layer; the numbers do not depend on the steps."""
        if not items:
            return np.zeros((0, self.embedding_dims), dtype=np.float32)
        self._check_packed()
        lengths, ids = embed_inputs(items, self.max_context, self.vocab_size)
        positions = np.concatenate([np.arange(n) for n in lengths])
        x = yield from self._embed_hidden(ids, lengths, positions)
        x = self.ops.rms_norm(x, self.final_norm, self.config.rms_eps)
        return pool(x, lengths, self.pooling)

    def _embed_hidden(self, ids: np.ndarray, lengths: list[int],
                      positions: np.ndarray) -> Steps[np.ndarray]:
        """The last layer's hidden states of `embed`'s packed inputs, in steps (an engine
        that runs its layers elsewhere replaces this). `_layers` in spans of rows: every
        layer's norms, products and feed-forward are row by row; its attention waits for
        the keys of all rows."""
        c = self.config
        nq, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        x = self.embed_tokens(ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = np.ascontiguousarray(x, dtype=np.float32)
        spans = row_spans(lengths, EMBED_TILE)
        rope_tables: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        qkv: np.ndarray | None = None
        for li, L in enumerate(self.layers):
            if L.kind == "conv":  # across rows: the whole layer in one step
                segments = [(Seq(len(self.layers)), n) for n in lengths]
                h = self._conv(li, L, self.ops.rms_norm(x, L.norm_in, c.rms_eps), segments)
                x = self._feed_forward(L, x, h)
                yield
                continue
            key = (id(L.inv_freq), L.rope_scale)
            if key not in rope_tables:
                rope_tables[key] = rope_mod.cos_sin(L.inv_freq, positions, L.rope_scale)
            cos, sin = rope_tables[key]
            width = (nq + 2 * nkv) * hd
            if qkv is None or qkv.shape[1] != width:
                qkv = np.empty((len(x), width), dtype=np.float32)
            for a, b in spans:
                qkv[a:b] = self._qkv(L, self.ops.rms_norm(x[a:b], L.norm_in, c.rms_eps),
                                     cos[a:b], sin[a:b])
                yield
            att = PackedAttention(self.ops, qkv, nq, nkv, hd, lengths, causal=True,
                                  window=L.window, sinks=L.sinks, scale=self.scale)
            for a, b in spans:
                x[a:b] = self._feed_forward(L, x[a:b], self._out_proj(L, att.rows(a, b)))
                yield
        return x

    @property
    def embedding_dims(self) -> int:
        """The width of `embed`'s vectors."""
        return self.pooling.dims(self.config.hidden_size)

    def _check_room(self, seq: Seq, n: int) -> None:
        if seq.pos + n > self.max_context:
            raise ContextLengthError(
                f"{seq.pos + n} tokens exceed the model's context length of {self.max_context}",
                limit=self.max_context, requested=seq.pos + n)

    # -- the forward pass -------------------------------------------------------------------
    def _forward(self, ids: np.ndarray, segments: list[tuple[Seq, int]], *,
                 every_row: bool = False) -> np.ndarray:
        """The logits after each segment's last token (`every_row`: after every token)."""
        self._check_packed()
        decoding = len(segments) == len(ids)  # one token per sequence: batched attention
        if not self.kv.layers:
            tables = None
        elif decoding:
            tables = self.kv.tables([s.kv for s, _ in segments])
        else:
            tables = [np.asarray(s.kv.table, dtype=np.int64) for s, _ in segments]

        def attention(li: int, L: Layer, h: np.ndarray, cos, sin) -> np.ndarray:
            return self._attention(li, L, h, segments, tables, cos, sin)

        x = self._fused_layers(ids, segments, tables, decoding)  # final-normed
        normed = x is not None
        if x is None:
            positions = (np.array([s.pos for s, _ in segments], dtype=np.int64) if decoding
                         else np.concatenate([np.arange(s.pos, s.pos + n) for s, n in segments]))
            x = self._layers(ids, segments, positions, attention)
        start, tokens = 0, ids.tolist()
        for seq, n in segments:
            self.kv.written(seq.kv, tokens[start : start + n])
            start += n
        if not (decoding or every_row):  # each segment's last row (decoding: every row is)
            x = x[[end - 1 for end in itertools.accumulate(n for _, n in segments)]]
        last = x if normed else self.ops.rms_norm(x, self.final_norm, self.config.rms_eps)
        return np.ascontiguousarray(self._mm(last, None, "lm_head"), dtype=np.float32)

    def _fused_layers(self, ids: np.ndarray, segments: list[tuple[Seq, int]], tables,
                      decoding: bool) -> np.ndarray | None:
        """`_layers` in one kernel call (npu.engine.fused) and the final norm, or None where
        it does not apply."""
        if self.fused is None or not self.kv.layers:
            return None
        x = self.embed_tokens(ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        pieces, start, top = [], 0, 0
        for seq, n in segments:
            pieces.append((start, n, seq.pos))
            start += n
            top = max(top, seq.pos + n)
        return self.fused.run(x, pieces, tables, top, decoding)

    def _layers(self, ids: np.ndarray, segments: list[tuple[Seq, int]], positions: np.ndarray,
                attention) -> np.ndarray:
        """The hidden states [T, H] after the last layer (before the final norm) of the
        packed tokens `ids` at `positions`; `attention(li, L, h, cos, sin)` is a layer's
        self-attention over the KV cache (`embed` runs the same layers in spans of rows:
        `_embed_hidden`)."""
        c = self.config
        x = self.embed_tokens(ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rope_tables: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        for li, L in enumerate(self.layers):
            h = self.ops.rms_norm(x, L.norm_in, c.rms_eps)
            if L.kind == "conv":
                h = self._conv(li, L, h, segments)
            else:
                key = (id(L.inv_freq), L.rope_scale)
                if key not in rope_tables:
                    rope_tables[key] = rope_mod.cos_sin(L.inv_freq, positions, L.rope_scale)
                h = attention(li, L, h, *rope_tables[key])
            x = self._feed_forward(L, x, h)
        return x

    def _feed_forward(self, L: Layer, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        """The rest of layer L after its attention (or convolution) `h` of the rows x: the
        residuals, the norms around them and the feed-forward (or the experts)."""
        c = self.config
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
        return x + h

    def _mm(self, x: np.ndarray, layer: Layer | None, name: str) -> np.ndarray:
        """x @ W.T for the named weight of a layer (or the lm_head): the one place a
        linear layer is computed (a `Linear` of the engine's backend), which other engines
        replace."""
        if layer is not None:
            return getattr(layer, name)(x)
        if self.lm_head is None:
            raise ModelError("this model is a reranker without an LM head: it scores pairs "
                             "(embed), it has no logits")
        return self.lm_head(x)

    def _attention(self, li: int, L: Layer, h: np.ndarray, segments, tables,
                   cos, sin) -> np.ndarray:
        """Self-attention of the forward's tokens; `tables`: the batch's block tables
        [B, n] when every segment is one token (decode), else one table per segment."""
        c = self.config
        nq, hd = c.num_heads, c.head_dim
        qkv = self._qkv(L, h, cos, sin)
        T = h.shape[0]
        K, V = self.kv.k[li], self.kv.v[li]
        if len(segments) == T:  # decode: one token per sequence, the batch in one call
            pos = np.fromiter((s.pos for s, _ in segments), dtype=np.int64, count=T)
            return self._out_proj(L, self.ops.attend_new(qkv, nq, K, V, tables, pos, L.window,
                                                         L.sinks, self.scale))
        q = qkv[:, : nq * hd].reshape(T, nq, hd)
        out = np.empty((T, nq * hd), dtype=np.float32)
        start = 0
        for (seq, n), table in zip(segments, tables):
            rows = qkv[start : start + n]
            self.ops.kv_write(rows, nq, K, V, table, np.arange(seq.pos, seq.pos + n))
            out[start : start + n] = self.ops.attend_prompt(
                q[start : start + n], K, V, table, seq.pos, L.window, L.sinks, self.scale)
            start += n
        return self._out_proj(L, out)

    def _qkv(self, L: Layer, h: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Layer L's queries, keys and values of the normed rows h: the product, its bias,
        the per-head norms and the rotation."""
        c = self.config
        qkv = self._mm(h, L, "wqkv")
        if L.bqkv is not None:
            qkv = qkv + L.bqkv
        return self.ops.qk_rope(qkv, c.num_heads, c.num_kv_heads, L.q_norm, L.k_norm,
                                c.rms_eps, cos, sin)

    def _out_proj(self, L: Layer, out: np.ndarray) -> np.ndarray:
        y = self._mm(out, L, "wo")
        return y + L.bo if L.bo is not None else y

    def _experts(self, L: Layer, h: np.ndarray) -> np.ndarray:
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

    def _conv(self, li: int, L: Layer, h: np.ndarray, segments) -> np.ndarray:
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
