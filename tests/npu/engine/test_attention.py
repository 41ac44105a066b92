"""attend_packed (cache-free attention of packed inputs) against the paged-cache attention
the decoders run (NumpyOps.attend_prompt): causal, windowed, with sinks, grouped heads, on
numpy and on the compiled kernels; bidirectional against its definition; the same rows
asked for in spans (PackedAttention); the spans `embed` is computed in (row_spans)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu.engine.attention import PackedAttention, attend_packed, row_spans
from npu.engine.kv_cache import BLOCK
from npu.engine.linear import LinearFactory
from npu.engine.ops import NumpyOps

OPS = {"numpy": NumpyOps(), "kernels": LinearFactory("cpu", 2).ops()}


def _paged(qkv: np.ndarray, nq: int, nkv: int, dim: int, n: int, window: int, sinks):
    """One input through the decoders' prompt attention over a block cache."""
    blocks = -(-n // BLOCK)
    K = np.zeros((blocks, nkv, BLOCK, dim), np.float32)
    V = np.zeros_like(K)
    table = np.arange(blocks)
    ops = NumpyOps()
    ops.kv_write(qkv, nq, K, V, table, np.arange(n))
    q = qkv[:, : nq * dim].reshape(n, nq, dim)
    return ops.attend_prompt(q, K, V, table, 0, window, sinks, np.float32(dim ** -0.5))


@pytest.mark.parametrize("ops", list(OPS))
@pytest.mark.parametrize("window,with_sinks", [(0, False), (5, False), (0, True)])
def test_causal_attention_is_the_paged_caches(ops: str, window: int, with_sinks: bool) -> None:
    nq, nkv, dim, lengths = 4, 2, 8, [7, 1, 20]
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((sum(lengths), (nq + 2 * nkv) * dim)).astype(np.float32)
    sinks = rng.standard_normal(nq).astype(np.float32) if with_sinks else None
    got = attend_packed(OPS[ops], qkv, nq, nkv, dim, lengths, causal=True, window=window,
                        sinks=sinks)
    start = 0
    for n in lengths:
        want = _paged(qkv[start : start + n], nq, nkv, dim, n, window, sinks)
        assert np.allclose(got[start : start + n], want, atol=1e-5)
        start += n


@pytest.mark.parametrize("ops", list(OPS))
def test_bidirectional_attention_sees_every_key(ops: str) -> None:
    nq, dim, n = 2, 4, 19
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((n, 3 * nq * dim)).astype(np.float32)
    got = attend_packed(OPS[ops], qkv, nq, nq, dim, [n], causal=False)
    q, k, v = (qkv[:, i * nq * dim : (i + 1) * nq * dim].reshape(n, nq, dim) for i in range(3))
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(dim)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v).reshape(n, nq * dim)
    assert np.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("ops", list(OPS))
@pytest.mark.parametrize("causal,window", [(True, 0), (True, 6), (False, 0)])
def test_rows_asked_for_in_spans_are_the_rows_of_all(ops: str, causal: bool,
                                                     window: int) -> None:
    nq, nkv, dim, lengths = 4, 2, 8, [40, 3, 1, 70]
    rng = np.random.default_rng(2)
    qkv = rng.standard_normal((sum(lengths), (nq + 2 * nkv) * dim)).astype(np.float32)
    whole = attend_packed(OPS[ops], qkv, nq, nkv, dim, lengths, causal=causal, window=window)
    for tile in (1, 7, 16, 64):
        att = PackedAttention(OPS[ops], qkv, nq, nkv, dim, lengths, causal=causal,
                              window=window)
        got = np.concatenate([att.rows(a, b) for a, b in row_spans(lengths, tile)])
        if ops == "kernels":  # the compiled kernel: bit for bit, however the rows are cut
            assert np.array_equal(got, whole)
        else:  # numpy's products over longer or shorter spans: float rounding
            assert np.allclose(got, whole, rtol=0, atol=1e-5)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(1, 16))
def test_row_spans_cover_the_rows_and_cut_an_input_from_its_own_start(lengths: list[int],
                                                                      tile: int) -> None:
    spans = row_spans(lengths, tile)
    assert spans[0][0] == 0 and spans[-1][1] == sum(lengths)
    assert all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))  # in order, no gap
    assert all(0 < b - a <= tile for a, b in spans)
    cuts = {a for a, _ in spans}
    start = 0
    for n in lengths:
        inside = sorted(c - start for c in cuts if start < c < start + n)
        assert all(c % tile == 0 for c in inside)  # where it is cut: its own multiples
        if n <= tile:
            assert not inside  # an input that fits one span is never cut
        start += n
