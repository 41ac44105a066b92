"""attend_packed: self-attention of packed inputs over their own keys and values only (no KV
cache): causal for a decoder's `embed`, bidirectional for an encoder. It runs on the engine's
ops (the compiled attention kernel where built), each input on its own, so a row's result
does not depend on the rest of the batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npu.engine.kv_cache import BLOCK
from npu.engine.ops import NumpyOps


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
