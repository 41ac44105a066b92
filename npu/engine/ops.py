"""The engine's non-linear steps that a decode step repeats per layer (RMS norm, attention of
one new token per sequence), on a backend: numpy (the reference) or the compiled kernels.

At 135M-600M parameters a decode step is dominated by these small operations' fixed costs,
not by their arithmetic: numpy spends 30-60 us on each (temporaries, dispatch), the kernels
a few.
"""

from __future__ import annotations

import math

import numpy as np

from npu.engine import rope as rope_mod
from npu.engine.kv_cache import kv_head_dim


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi))
                                    * (x + np.float32(0.044715) * x * x * x)))


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in float32 (Abramowitz and Stegun 7.1.26: |error| below 1.5e-7,
    4e-7 with float32's rounding; numpy has none), computed in place in two temporaries (a
    BERT layer's GELU runs it over tokens x 3072 values)."""
    a = np.abs(x).astype(np.float32, copy=False)
    t = a * np.float32(0.3275911)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):  # Horner, inwards out
        poly += np.float32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(np.float32(1.0), poly, out=poly)
    return np.copysign(poly, x, out=poly)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU with the error function (BERT's "gelu"), not the tanh approximation."""
    return 0.5 * x * (1.0 + erf(x * np.float32(math.sqrt(0.5))))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh, "gelu": gelu}
GATED = {"silu": 0, "gelu_tanh": 1}  # the activations cpu_kernels.c's fk_gated computes


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (BERT's norms: centred, then scaled and shifted)."""
    centred = x - x.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(centred), axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * w + b


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))) * w


def softmax(scores: np.ndarray, sinks: np.ndarray | None) -> np.ndarray:
    """Softmax over the last axis, in place; with `sinks` (gpt-oss: a learned logit per head
    that takes part in the normalisation and is then dropped)."""
    if sinks is None:
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores
    top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
    scores -= top
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True) + np.exp(sinks - top)
    return scores


class NumpyOps:
    """The reference: plain numpy; its KV cache is float32."""

    kv_dtype = np.float32

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return rms_norm(x, w, eps)

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x [n, heads, dim] rotated by the position tables cos, sin [n, dim]."""
        return rope_mod.apply(x, cos, sin)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """BERT's GELU (with the error function) of x [n, I] (may be computed in place)."""
        return gelu(x)

    def gated(self, gu: np.ndarray, activation: str) -> np.ndarray:
        """act(gate) * up for gu = [gate | up] [n, 2I] (SwiGLU, GeGLU)."""
        inter = gu.shape[-1] // 2
        return ACTIVATIONS[activation](gu[:, :inter]) * gu[:, inter:]

    def qk_rope(self, qkv: np.ndarray, nq: int, nkv: int, q_norm: np.ndarray | None,
                k_norm: np.ndarray | None, eps: float, cos: np.ndarray,
                sin: np.ndarray) -> np.ndarray:
        """The query and key heads of qkv [n, (nq + 2 nkv) * dim] RMS-normed per head (when
        q_norm / k_norm are given) and rotated by cos, sin [n, dim]; returns qkv with them
        in place (the same array when it is float32 and contiguous)."""
        n, dim = len(qkv), cos.shape[-1]
        qk = qkv[:, : (nq + nkv) * dim].reshape(n, nq + nkv, dim)
        q, k = qk[:, :nq], qk[:, nq:]
        if q_norm is not None:
            q, k = self.rms_norm(q, q_norm, eps), self.rms_norm(k, k_norm, eps)
        qk[:, :nq] = self.rope(q, cos, sin)
        qk[:, nq:] = self.rope(k, cos, sin)
        return qkv

    def kv_write(self, qkv: np.ndarray, nq: int, K: np.ndarray, V: np.ndarray,
                 tables: np.ndarray, positions: np.ndarray) -> None:
        """Row b of qkv's key and value heads into the cache K, V [blocks, nkv, BLOCK, dim]
        at position positions[b] of the sequence whose block table is tables[b] (or
        `tables` itself when it is one row, shared by every row)."""
        B = len(qkv)
        nkv, bs, dim = K.shape[1], K.shape[2], K.shape[3]
        tables = tables.reshape(-1, tables.shape[-1])
        rows = np.arange(B) if len(tables) > 1 else np.zeros(B, dtype=np.intp)
        blocks = tables[rows, positions // bs]
        K[blocks, :, positions % bs] = qkv[:, nq * dim : (nq + nkv) * dim].reshape(B, nkv, dim)
        V[blocks, :, positions % bs] = qkv[:, (nq + nkv) * dim :].reshape(B, nkv, dim)

    def attend_new(self, qkv: np.ndarray, nq: int, K: np.ndarray, V: np.ndarray,
                   tables: np.ndarray, positions: np.ndarray, window: int,
                   sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        """Decode: row b of qkv is sequence b's new token; its key and value join the cache
        at positions[b] of its block table tables[b], then its query attends (`attend`);
        -> [B, nq * dim]."""
        B = len(qkv)
        dim = K.shape[3]
        self.kv_write(qkv, nq, K, V, tables, positions)
        q = qkv[:, : nq * dim].reshape(B, nq, dim)
        return self.attend(q, K, V, tables, positions + 1, window, sinks, scale)

    @staticmethod
    def _gather(store: np.ndarray, tables: np.ndarray, span: int) -> np.ndarray:
        """The first `span` positions of each row's blocks: [B, nkv, span, dim]."""
        B, nkv, bs, dim = len(tables), store.shape[1], store.shape[2], store.shape[3]
        n = -(-span // bs)
        g = store[tables[:, :n]]  # [B, n, nkv, bs, dim]
        return g.transpose(0, 2, 1, 3, 4).reshape(B, nkv, n * bs, dim)[:, :, :span]

    def attend(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, tables: np.ndarray,
               lengths: np.ndarray, window: int, sinks: np.ndarray | None,
               scale: np.float32) -> np.ndarray:
        """Attention of one new token per sequence: q [B, nq, hd] against the cache
        K, V [blocks, nkv, BLOCK, hd], sequence b's positions in the blocks tables[b] (one
        row: shared by all), seeing its first lengths[b] positions (the last `window` of
        them if window > 0); -> [B, nq * hd]."""
        B, nq, hd = q.shape
        nkv = K.shape[1]
        group = nq // nkv
        tables = tables.reshape(-1, tables.shape[-1])
        span = int(lengths.max())
        Ks = self._gather(K, tables, span).astype(np.float32)
        Vs = self._gather(V, tables, span).astype(np.float32)
        qr = q.reshape(B, nkv, group, hd)
        scores = np.matmul(qr, Ks.transpose(0, 1, 3, 2))  # [B or 1, ...] -> [B, nkv, g, span]
        scores *= scale
        kpos = np.arange(span)
        valid = kpos[None, :] < lengths[:, None]
        if window:
            valid &= kpos[None, :] > lengths[:, None] - 1 - window
        if not valid.all():
            scores = np.where(valid[:, None, None, :], scores, np.float32(-np.inf))
        scores = softmax(scores, sinks.reshape(1, nkv, group, 1) if sinks is not None else None)
        out = np.matmul(scores, Vs)  # [B, nkv, g, hd]
        return out.reshape(B, nq * hd).astype(np.float32, copy=False)

    def attend_prompt(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, table: np.ndarray,
                      pos: int, window: int, sinks: np.ndarray | None,
                      scale: np.float32) -> np.ndarray:
        """Causal attention of a prompt piece: q [n, nq, hd] are the queries at positions
        pos .. pos + n - 1 of the sequence whose blocks are `table` (its keys and values up
        to there in the cache); -> [n, nq * hd]."""
        n = len(q)
        return self.attend(q, K, V, table.reshape(1, -1), np.arange(pos + 1, pos + n + 1),
                           window, sinks, scale)

    def attend_all(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, table: np.ndarray,
                   keys: int, sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        """Bidirectional attention (an encoder's input): every query of q [n, nq, hd] over
        all `keys` keys and values of the blocks `table`; -> [n, nq * hd]."""
        return self.attend(q, K, V, table.reshape(1, -1), np.full(len(q), keys), 0, sinks,
                           scale)


# the kernels' KV cache formats (cpu_kernels.c's KV_F32, KV_F16, KV_Q8) by the arrays' dtype
KV_KINDS = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint8): 2}


class KernelOps(NumpyOps):
    """The compiled kernels (npu.engine.cpu_kernels), `threads` shared with the linear
    layers. The KV cache is f16 (as llama.cpp's default: half the memory and the bytes a
    decode step reads), converted in hardware where the CPU has F16C, else in plain C; or,
    where the engine is made so (`kv_cache_type` q8_0), Q8_0 bytes (uint8: `KV_KINDS`)."""

    kv_dtype = np.float16

    def __init__(self, lib, threads) -> None:
        self._lib, self.threads = lib, threads
        self._weights: dict[int, tuple[np.ndarray, int]] = {}

    def _weight(self, w: np.ndarray | None) -> int | None:
        """The address of a long-lived array (a norm's weights), looked up once: numpy's
        `.ctypes.data` costs 1.5 us a call, a few percent of a small model's decode step."""
        if w is None:
            return None
        held = self._weights.get(id(w))
        if held is None or held[0] is not w:
            if w.dtype != np.float32 or not w.flags.c_contiguous:
                raise ValueError("kernel weights must be contiguous float32")
            held = self._weights[id(w)] = (w, w.ctypes.data)
        return held[1]

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        n = x.shape[-1]
        self._lib.fk_rms_norm(x.ctypes.data, self._weight(w), x.size // n, n, eps,
                              out.ctypes.data)
        return out

    def qk_rope(self, qkv: np.ndarray, nq: int, nkv: int, q_norm: np.ndarray | None,
                k_norm: np.ndarray | None, eps: float, cos: np.ndarray,
                sin: np.ndarray) -> np.ndarray:
        qkv = np.ascontiguousarray(qkv, dtype=np.float32)
        cos = np.ascontiguousarray(cos, dtype=np.float32)
        sin = np.ascontiguousarray(sin, dtype=np.float32)
        self._lib.fk_qk_rope(qkv.ctypes.data, qkv.shape[1], len(qkv), nq, nkv, cos.shape[-1],
                             self._weight(q_norm), self._weight(k_norm), eps, cos.ctypes.data,
                             sin.ctypes.data)
        return qkv

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """fk_gelu: the same formula as `gelu`'s, in place where x is float32 and
        contiguous, in one pass instead of numpy's twenty."""
        x = np.require(x, np.float32, ["C", "W"])
        self._lib.fk_gelu(x.ctypes.data, x.size // max(x.shape[-1], 1), x.shape[-1])
        return x

    def gated(self, gu: np.ndarray, activation: str) -> np.ndarray:
        act = GATED.get(activation)
        if act is None:
            return super().gated(gu, activation)
        gu = np.ascontiguousarray(gu, dtype=np.float32)
        out = np.empty((len(gu), gu.shape[1] // 2), dtype=np.float32)
        self._lib.fk_gated(gu.ctypes.data, len(gu), out.shape[1], out.ctypes.data, act)
        return out

    @staticmethod
    def _tables(tables: np.ndarray) -> tuple[np.ndarray, int]:
        """Block tables as the kernels take them: int64 rows and the stride between rows
        (0: one table that every row shares)."""
        tables = np.ascontiguousarray(tables, dtype=np.int64)
        return tables, tables.shape[-1] if tables.ndim == 2 and len(tables) > 1 else 0

    def _attend(self, q: np.ndarray, q_stride: int, B: int, nq: int, K: np.ndarray,
                V: np.ndarray, tables: np.ndarray, lengths: np.ndarray, window: int,
                sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        dim = kv_head_dim(K)
        tables, tstride = self._tables(tables)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        out = np.empty((B, nq * dim), dtype=np.float32)
        if sinks is not None:
            sinks = np.ascontiguousarray(sinks, dtype=np.float32)  # held until the call ends
        failed = self._lib.fk_attend(q.ctypes.data, q_stride, B, nq, K.shape[1], dim,
                                     K.ctypes.data, V.ctypes.data, K.shape[2],
                                     tables.ctypes.data, tstride, lengths.ctypes.data, window,
                                     None if sinks is None else sinks.ctypes.data,
                                     float(scale), out.ctypes.data, KV_KINDS[K.dtype],
                                     self.threads.n)
        if failed == -2:
            raise MemoryError("fk_attend could not allocate its scores")
        if failed:  # more query heads a key head than the kernel takes (64)
            if K.dtype == np.uint8:  # no float path reads a Q8_0 cache
                raise ValueError("a Q8_0 cache's attention takes at most 64 query heads a "
                                 "key head")
            rows = q.reshape(B, -1)[:, : nq * dim].reshape(B, nq, dim)
            return super().attend(rows, K, V, tables, lengths, window, sinks, scale)
        return out

    @staticmethod
    def _check_cache(K: np.ndarray, V: np.ndarray) -> None:
        if K.dtype not in KV_KINDS or V.dtype != K.dtype or not (
                K.flags.c_contiguous and V.flags.c_contiguous):
            raise ValueError("the KV cache must be contiguous float32, float16 or Q8_0 "
                             "bytes (uint8)")
        if K.dtype == np.uint8 and K.shape[3] % 34:
            raise ValueError("a Q8_0 cache's rows are whole blocks of 34 bytes (32 values)")

    def attend(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, tables: np.ndarray,
               lengths: np.ndarray, window: int, sinks: np.ndarray | None,
               scale: np.float32) -> np.ndarray:
        B, nq, dim = q.shape
        q = np.ascontiguousarray(q, dtype=np.float32)
        self._check_cache(K, V)
        return self._attend(q, nq * dim, B, nq, K, V, tables, lengths, window, sinks, scale)

    def kv_write(self, qkv: np.ndarray, nq: int, K: np.ndarray, V: np.ndarray,
                 tables: np.ndarray, positions: np.ndarray) -> None:
        qkv = np.ascontiguousarray(qkv, dtype=np.float32)
        self._check_cache(K, V)
        tables, tstride = self._tables(tables)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        self._lib.fk_kv_write(qkv.ctypes.data, qkv.shape[1], len(qkv), nq, K.shape[1],
                              kv_head_dim(K), K.ctypes.data, V.ctypes.data, K.shape[2],
                              tables.ctypes.data, tstride, positions.ctypes.data,
                              KV_KINDS[K.dtype])

    def attend_new(self, qkv: np.ndarray, nq: int, K: np.ndarray, V: np.ndarray,
                   tables: np.ndarray, positions: np.ndarray, window: int,
                   sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        qkv = np.ascontiguousarray(qkv, dtype=np.float32)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        self.kv_write(qkv, nq, K, V, tables, positions)
        return self._attend(qkv, qkv.shape[1], len(qkv), nq, K, V, tables, positions + 1,
                            window, sinks, scale)

    def attend_prompt(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, table: np.ndarray,
                      pos: int, window: int, sinks: np.ndarray | None,
                      scale: np.float32) -> np.ndarray:
        """The blocked kernel (fk_attend_prompt: each cached key read once per block of
        query rows, the softmax online); within float rounding of `NumpyOps`'."""
        self._check_cache(K, V)
        failed, out = self._blocked(self._lib.fk_attend_prompt, q, K, V, table, (pos, window),
                                    sinks, scale)
        if failed:
            if K.dtype == np.uint8:  # no float path reads a Q8_0 cache
                raise (MemoryError("fk_attend_prompt could not allocate its scratch")
                       if failed == -2 else ValueError(
                           "a Q8_0 cache's prompt attention takes at most 64 query heads a "
                           "key head"))
            return super().attend_prompt(q, K, V, table, pos, window, sinks, scale)
        return out

    def attend_all(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, table: np.ndarray,
                   keys: int, sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        """The blocked kernel with every row over all the keys (fk_attend_all: each key
        read once per block of query rows, not once per row); within float rounding of
        `NumpyOps`'."""
        self._check_cache(K, V)
        held = np.size(table) * K.shape[2]
        if not 1 <= keys <= held:
            raise ValueError(f"attend_all over {keys} keys: its blocks hold {held}, and it "
                             "needs at least one")
        failed, out = self._blocked(self._lib.fk_attend_all, q, K, V, table, (keys,), sinks,
                                    scale)
        if failed == -2:
            raise MemoryError("fk_attend_all could not allocate its scratch")
        if failed:  # more query heads a key head than it takes: the decode kernel's way
            return super().attend_all(q, K, V, table, keys, sinks, scale)
        return out

    def _blocked(self, kernel, q: np.ndarray, K: np.ndarray, V: np.ndarray,
                 table: np.ndarray, where: tuple[int, ...], sinks: np.ndarray | None,
                 scale: np.float32) -> tuple[int, np.ndarray]:
        """A blocked attention kernel (fk_attend_prompt, fk_attend_all: `where` its
        arguments between the table and the sinks) on the piece q [n, nq, hd]: its return
        code and output [n, nq * hd]."""
        n, nq, dim = q.shape
        q = np.ascontiguousarray(q, dtype=np.float32)
        table = np.ascontiguousarray(table, dtype=np.int64).reshape(-1)
        out = np.empty((n, nq * dim), dtype=np.float32)
        if sinks is not None:
            sinks = np.ascontiguousarray(sinks, dtype=np.float32)
        failed = kernel(q.ctypes.data, nq * dim, n, nq, K.shape[1], dim, K.ctypes.data,
                        V.ctypes.data, K.shape[2], table.ctypes.data, *where,
                        None if sinks is None else sinks.ctypes.data, float(scale),
                        out.ctypes.data, KV_KINDS[K.dtype], self.threads.n)
        return failed, out
