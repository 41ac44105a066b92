"""The Q8_0 KV cache (`kv_cache_type: q8_0`, llama.cpp's `--cache-type-k/v q8_0`): rows
written as 8-bit codes with an f16 scale per 32 values, read back by every attention kernel
(decode, prompt, the one-call step) as those values; an engine on it answers as on the f16
cache up to that rounding, in about half the memory; what cannot take it says so."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from npu import load_model
from npu.engine.kv_cache import BLOCK, kv_head_dim, kv_row
from npu.engine.ops import NumpyOps
from npu.errors import ModelError
from tests.npu.gguf_files import write_random_gguf

try:
    from npu.engine.cpu_kernels import kernels
    from npu.engine.linear import Threads
    from npu.engine.ops import KernelOps

    LIB = kernels()
except Exception:  # no C compiler here: the cache is the kernels' alone
    LIB = None
pytestmark = pytest.mark.skipif(
    LIB is None, reason="the Q8_0 KV cache is the compiled CPU kernels' format, and they cannot "
    "be built here (no C compiler): a model asked for it says so at load (test_config)")


def dequantized(cache: np.ndarray) -> np.ndarray:
    """A Q8_0 cache's values, float32, read the way its format is written down."""
    blocks = cache.reshape(*cache.shape[:3], -1, 34)
    scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    codes = blocks[..., 2:].view(np.int8).astype(np.float32)
    return (scale * codes).reshape(*cache.shape[:3], -1)


# query heads a key head: 2, 3, 2, and 4 and 6 (past the AVX-512 passes' 2 and 3); the last
# two, a cache block (key heads x 16 rows of 34 bytes per 32 values) that ends inside a
# 64-byte line, which the read-ahead of a row's next span once never got past (a hang)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("nq, nkv, hd", [(4, 2, 32), (9, 3, 64), (16, 8, 128), (8, 2, 128),
                                         (12, 2, 64), (2, 1, 32), (6, 3, 96)])
def test_q8_0_rows_are_written_and_attended_as_their_values(nq: int, nkv: int,
                                                            hd: int) -> None:
    rng = np.random.default_rng(hd)
    ops = KernelOps(LIB, Threads(2))
    n, blocks = 70, 6
    assert kv_row(np.uint8, hd) == hd // 32 * 34
    K = np.zeros((blocks, nkv, BLOCK, kv_row(np.uint8, hd)), np.uint8)
    V = np.zeros_like(K)
    assert kv_head_dim(K) == hd
    table = rng.permutation(blocks).astype(np.int64)  # blocks out of order
    qkv = (rng.standard_normal((n, (nq + 2 * nkv) * hd)) * 3).astype(np.float32)
    qkv[5, nq * hd: nq * hd + 32] = 0.0  # a block of zeros: scale 0
    ops.kv_write(qkv, nq, K, V, table, np.arange(n))
    k = qkv[:, nq * hd:(nq + nkv) * hd].reshape(n, nkv, hd)
    v = qkv[:, (nq + nkv) * hd:].reshape(n, nkv, hd)
    Kf, Vf = dequantized(K), dequantized(V)
    got_k = Kf[table[np.arange(n) // BLOCK], :, np.arange(n) % BLOCK]  # [n, nkv, hd]
    got_v = Vf[table[np.arange(n) // BLOCK], :, np.arange(n) % BLOCK]
    for got, want in ((got_k, k), (got_v, v)):
        amax = np.abs(want.reshape(n, nkv, -1, 32)).max(-1, keepdims=True)
        err = np.abs(got - want).reshape(n, nkv, -1, 32)
        assert (err <= amax / 127 * 0.501 + amax * 1e-3).all()  # half a step (and the f16 scale)
    assert (got_k[5, 0, :32] == 0).all()
    q = rng.standard_normal((n, nq, hd)).astype(np.float32)
    scale = np.float32(hd ** -0.5)
    ref = NumpyOps()
    lengths = np.arange(1, n + 1)
    want = ref.attend(q, Kf, Vf, table.reshape(1, -1), lengths, 0, None, scale)
    got = ops.attend(q, K, V, table.reshape(1, -1), lengths, 0, None, scale)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    # the last row alone: its spans' blocks read ahead (the rows above share them)
    got = ops.attend(q[-1:], K, V, table.reshape(1, -1), lengths[-1:], 0, None, scale)
    np.testing.assert_allclose(got, want[-1:], rtol=2e-4, atol=2e-5)
    got = ops.attend_prompt(q, K, V, table, 0, 0, None, scale)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    window = 20  # a sliding window: the same keys as the reference's
    want = ref.attend(q, Kf, Vf, table.reshape(1, -1), lengths, window, None, scale)
    np.testing.assert_allclose(ops.attend(q, K, V, table.reshape(1, -1), lengths, window,
                                          None, scale), want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(ops.attend_prompt(q, K, V, table, 0, window, None, scale),
                               want, rtol=2e-4, atol=2e-5)
    with pytest.raises(ValueError, match="whole blocks of 34 bytes"):  # not a Q8_0 row
        ops.attend(q, K[..., :-1].copy(), V[..., :-1].copy(), table.reshape(1, -1), lengths,
                   0, None, scale)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> str:
    return write_random_gguf(tmp_path_factory.mktemp("q8") / "qwen3.gguf", "qwen3", QT.Q8_0,
                             seed=5)


def test_an_engine_on_a_q8_0_cache_answers_as_on_f16_in_about_half_the_memory(qwen3) -> None:
    ids = np.random.default_rng(1).integers(0, 200, 100).tolist()
    out, sizes = {}, {}
    for kind in ("f16", "q8_0"):
        eng = load_model(qwen3, kv_cache_type=kind).engine
        got = [eng.prefill("a", ids), eng.decode(["a"], [5])]
        eng.fork("a", "b")
        got.append(eng.decode(["a", "b"], [6, 7]))
        out[kind], sizes[kind] = got, eng.kv.block_bytes
    assert sizes["q8_0"] / sizes["f16"] == 34 / 64  # head size 128: 136 bytes a row, not 256
    for f16, q8 in zip(out["f16"], out["q8_0"]):
        assert not np.array_equal(f16, q8)  # the cache's rounding is seen
        assert np.abs(f16 - q8).max() < 0.02 * np.abs(f16).max()
        assert (f16.argmax(-1) == q8.argmax(-1)).all()


def test_what_cannot_take_a_q8_0_cache_says_why(tmp_path, qwen3) -> None:
    llama = write_random_gguf(tmp_path / "llama.gguf", "llama", QT.Q8_0)  # head size 16
    with pytest.raises(ModelError, match="multiple of 32"):
        load_model(llama, kv_cache_type="q8_0")
    with pytest.raises(ModelError, match="compiled CPU kernels"):
        load_model(qwen3, kv_cache_type="q8_0", backend="reference")
    with pytest.raises(ModelError, match="not one of f16, q8_0"):
        load_model(qwen3, kv_cache_type="q4_0")
