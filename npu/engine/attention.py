"""embed_inputs and attend_packed: the checked, packed token lists of an `embed` call, and
self-attention of packed inputs over their own keys and values only (no KV
cache): causal for a decoder's `embed`, bidirectional for an encoder. It runs on the engine's
ops (the compiled attention kernel where built), each input on its own, so a row's result
does not depend on the rest of the batch."""

from __future__ import annotations

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
    scale = np.float32(dim ** -0.5 if scale is None else scale)
    out = np.empty((len(qkv), nq * dim), dtype=np.float32)
    start = 0
    for n in lengths:
        rows = qkv[start : start + n]
        q = rows[:, : nq * dim].reshape(n, nq, dim)
        K = _blocks(rows[:, nq * dim : (nq + nkv) * dim], nkv, dim)
        V = _blocks(rows[:, (nq + nkv) * dim :], nkv, dim)
        table = np.arange(len(K), dtype=np.int64).reshape(1, -1)
        seen = np.arange(1, n + 1) if causal else np.full(n, n)
        out[start : start + n] = ops.attend(q, K, V, table, seen.astype(np.int64),
                                            window if causal else 0, sinks, scale)
        start += n
    return out
