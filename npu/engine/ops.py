"""The engine's non-linear steps that a decode step repeats per layer (RMS norm, attention of
one new token per sequence), on a backend: numpy (the reference) or the compiled kernels.

At 135M-600M parameters a decode step is dominated by these small operations' fixed costs,
not by their arithmetic: numpy spends 30-60 us on each (temporaries, dispatch), the kernels
a few.
"""

from __future__ import annotations

import numpy as np


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
    """The reference: plain numpy."""

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return rms_norm(x, w, eps)

    def attend(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, slots: np.ndarray,
               lengths: np.ndarray, window: int, sinks: np.ndarray | None,
               scale: np.float32) -> np.ndarray:
        """Attention of one new token per sequence: q [B, nq, hd] against the cache
        K, V [slots, nkv, capacity, hd], sequence b in slot slots[b] seeing its first
        lengths[b] positions (the last `window` of them if window > 0); -> [B, nq * hd].

        One product over the range of the batch's slots (rows of slots outside the batch
        are computed and dropped)."""
        B, nq, hd = q.shape
        nkv = K.shape[1]
        group = nq // nkv
        first, end = int(slots.min()), int(slots.max()) + 1
        rows = slots - first
        span = int(lengths.max())
        if end - first == B:
            qr = np.empty((B, nkv, group, hd), dtype=np.float32)
            seen = np.empty(B, dtype=np.intp)
        else:  # slots in the range that are not in this batch: harmless filler rows
            qr = np.zeros((end - first, nkv, group, hd), dtype=np.float32)
            seen = np.ones(end - first, dtype=np.intp)
        qr[rows] = q.reshape(B, nkv, group, hd)
        seen[rows] = lengths
        scores = np.matmul(qr, K[first:end, :, :span].transpose(0, 1, 3, 2))  # [R,nkv,g,span]
        scores *= scale
        kpos = np.arange(span)
        valid = kpos[None, :] < seen[:, None]
        if window:
            valid &= kpos[None, :] > seen[:, None] - 1 - window
        if not valid.all():
            scores = np.where(valid[:, None, None, :], scores, np.float32(-np.inf))
        scores = softmax(scores, sinks.reshape(1, nkv, group, 1) if sinks is not None else None)
        out = np.matmul(scores, V[first:end, :, :span])  # [R, nkv, g, hd]
        return out[rows].reshape(B, nq * hd)


    def attend_prompt(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, slot: int, pos: int,
                      window: int, sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        """Causal attention of a prompt piece: q [n, nq, hd] are the queries at positions
        pos .. pos + n - 1 of the sequence in `slot` (whose keys and values up to there are
        in the cache); -> [n, nq * hd]."""
        n, nq, hd = q.shape
        nkv = K.shape[1]
        group = nq // nkv
        total = pos + n
        Ks, Vs = K[slot, :, :total], V[slot, :, :total]
        qs = q.transpose(1, 0, 2).reshape(nkv, group * n, hd)
        scores = (qs @ Ks.transpose(0, 2, 1)) * scale  # [nkv, g*n, total]
        scores = scores.reshape(nkv, group, n, total)
        qpos = np.arange(pos, total)[:, None]
        kpos = np.arange(total)[None, :]
        masked = kpos > qpos
        if window:
            masked = masked | (kpos <= qpos - window)
        scores = np.where(masked, np.float32(-np.inf), scores)
        probs = softmax(scores, sinks.reshape(nkv, group, 1, 1) if sinks is not None else None)
        o = probs.reshape(nkv, group * n, total) @ Vs  # [nkv, g*n, hd]
        return o.reshape(nq, n, hd).transpose(1, 0, 2).reshape(n, nq * hd)


class KernelOps(NumpyOps):
    """The compiled kernels (npu.engine.cpu_kernels), `threads` shared with the linear
    layers."""

    def __init__(self, lib, threads) -> None:
        self._lib, self.threads = lib, threads

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        n = x.shape[-1]
        self._lib.fk_rms_norm(x.ctypes.data, w.ctypes.data, x.size // n, n, eps,
                              out.ctypes.data)
        return out

    def attend(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, slots: np.ndarray,
               lengths: np.ndarray, window: int, sinks: np.ndarray | None,
               scale: np.float32) -> np.ndarray:
        B, nq, hd = q.shape
        q = np.ascontiguousarray(q, dtype=np.float32)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        out = np.empty((B, nq * hd), dtype=np.float32)
        if sinks is not None:
            sinks = np.ascontiguousarray(sinks, dtype=np.float32)  # held until the call ends
        sinks_ptr = None if sinks is None else sinks.ctypes.data
        if self._lib.fk_attend(q.ctypes.data, B, nq, K.shape[1], hd, K.ctypes.data,
                               V.ctypes.data, K.shape[2], slots.ctypes.data,
                               lengths.ctypes.data, window, sinks_ptr, float(scale),
                               out.ctypes.data, self.threads.n):
            raise MemoryError("fk_attend could not allocate its scores")
        return out

    def attend_prompt(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, slot: int, pos: int,
                      window: int, sinks: np.ndarray | None, scale: np.float32) -> np.ndarray:
        # each query is a row of one-token attention that sees the positions up to its own
        n = len(q)
        return self.attend(q, K, V, np.full(n, slot), np.arange(pos + 1, pos + n + 1), window,
                           sinks, scale)
