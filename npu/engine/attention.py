"""embed_inputs, attend_packed / PackedAttention and row_spans: the checked, packed token
lists of an `embed` call; self-attention of packed inputs over their own keys and values only
(no KV cache), causal for a decoder's `embed`, bidirectional for an encoder, for all rows or
any span of them; and the spans an `embed` forward is computed in, step by step. It runs on
the engine's ops (the compiled attention kernel where built), each input on its own, so a
row's result does not depend on the rest of the batch."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import numpy as np

from npu.engine.kv_cache import BLOCK
from npu.engine.ops import NumpyOps
from npu.errors import ContextLengthError


def embed_inputs(items: Sequence[Sequence[int]], context: int,
                 vocab: int) -> tuple[list[int], np.ndarray]:
    """The lengths of `items` and their ids packed one after another (int64).

    Raises:
        ValueError: an item is empty, or has an id outside 0 .. vocab - 1.
        ContextLengthError: an item is longer than `context`.
    """
    lengths = [len(item) for item in items]
    for n in lengths:
        if n == 0:
            raise ValueError("embed needs at least one token per input")
        if n > context:
            raise ContextLengthError(f"{n} tokens exceed the model's context length of "
                                     f"{context}", limit=context, requested=n)
    ids = np.asarray([t for item in items for t in item], dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must be in 0..{vocab - 1}")
    return lengths, ids


def _blocks(x: np.ndarray, nkv: int, dim: int) -> np.ndarray:
    """Rows x [n, nkv * dim] in the cache's layout [blocks, nkv, BLOCK, dim] (float32; the
    last block padded with zeros)."""
    n = len(x)
    nb = -(-n // BLOCK)
    padded = np.zeros((nb * BLOCK, nkv, dim), dtype=np.float32)
    padded[:n] = x.reshape(n, nkv, dim)
    return np.ascontiguousarray(padded.reshape(nb, BLOCK, nkv, dim).transpose(0, 2, 1, 3))


def attend_packed(ops: NumpyOps, qkv: np.ndarray, nq: int, nkv: int, dim: int,
                  lengths: Sequence[int], *, causal: bool, window: int = 0,
                  sinks: np.ndarray | None = None,
                  scale: np.float32 | float | None = None) -> np.ndarray:
    """Attention of packed inputs: qkv [sum(lengths), (nq + 2 nkv) * dim] holds input i's
    queries, keys and values after input i-1's (positions from 0); each input's queries see
    its own keys only (the ones before them if `causal`, the last `window` of those if
    window > 0; all of them if not causal). Returns [sum(lengths), nq * dim] float32.
    """
    return PackedAttention(ops, qkv, nq, nkv, dim, lengths, causal=causal, window=window,
                           sinks=sinks, scale=scale).rows(0, len(qkv))


def row_spans(lengths: Sequence[int], tile: int) -> list[tuple[int, int]]:
    """Spans [start, end) of packed rows, in order, covering inputs of `lengths` rows each,
    at most `tile` rows a span: whole inputs together while they fit, an input longer than
    `tile` in pieces of `tile` rows from its own start (so how an input is cut does not
    depend on the inputs before it)."""
    if tile < 1:
        raise ValueError("tile must be at least 1")
    spans: list[tuple[int, int]] = []
    start = pos = 0
    for n in lengths:
        for off in range(0, n, tile):
            piece = min(tile, n - off)
            if pos - start + piece > tile:
                spans.append((start, pos))
                start = pos
            pos += piece
    if pos > start:
        spans.append((start, pos))
    return spans


class PackedAttention:
    """`attend_packed` for any span of query rows: each input's keys and values laid out
    once (on first use), its queries attended piece by piece. A row's result does not
    depend on how the rows are split (bit for bit on the compiled kernel).

    Args:
        qkv: [sum(lengths), (nq + 2 nkv) * dim], as `attend_packed` takes it (not copied:
            leave it unchanged while rows are asked for).
    """

    def __init__(self, ops: NumpyOps, qkv: np.ndarray, nq: int, nkv: int, dim: int,
                 lengths: Sequence[int], *, causal: bool, window: int = 0,
                 sinks: np.ndarray | None = None,
                 scale: np.float32 | float | None = None) -> None:
        self.ops, self.qkv, self.nq, self.nkv, self.dim = ops, qkv, nq, nkv, dim
        self.causal, self.sinks = causal, sinks
        self.window = window if causal else 0
        self.scale = np.float32(dim ** -0.5 if scale is None else scale)
        self.starts = list(itertools.accumulate(lengths, initial=0))
        self._kv: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def rows(self, a: int, b: int) -> np.ndarray:
        """The attention output of packed rows a .. b - 1: [b - a, nq * dim] float32. An
        input's keys are dropped once its last row is asked for (ask in order)."""
        nq, dim = self.nq, self.dim
        out = np.empty((b - a, nq * dim), dtype=np.float32)
        i = bisect.bisect_right(self.starts, a) - 1
        lo = a
        while lo < b:
            s, e = self.starts[i], self.starts[i + 1]
            hi = min(b, e)
            if hi > lo:
                K, V, table = self._keys(i)
                q = self.qkv[lo:hi, : nq * dim].reshape(hi - lo, nq, dim)
                # the prompt kernels: each key read once per block of rows, not once a row
                out[lo - a : hi - a] = (
                    self.ops.attend_prompt(q, K, V, table, lo - s, self.window, self.sinks,
                                           self.scale) if self.causal else
                    self.ops.attend_all(q, K, V, table, e - s, self.sinks, self.scale))
                if hi == e:
                    del self._kv[i]
                lo = hi
            i += 1
        return out

    def _keys(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Input i's keys and values in the cache's block layout, and its block table."""
        held = self._kv.get(i)
        if held is None:
            nq, nkv, dim = self.nq, self.nkv, self.dim
            rows = self.qkv[self.starts[i] : self.starts[i + 1]]
            K = _blocks(rows[:, nq * dim : (nq + nkv) * dim], nkv, dim)
            V = _blocks(rows[:, (nq + nkv) * dim :], nkv, dim)
            held = self._kv[i] = (K, V, np.arange(len(K), dtype=np.int64).reshape(1, -1))
        return held
