"""The compiled CPU kernels against the numpy reference, format by format and shape by shape:
the integer formats compute with 8-bit activations (their error is that rounding's, and
nothing else), the float formats exactly; the norm and the attention kernels as numpy."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from npu.engine.linear import CpuLinear, LinearFactory, PackedMatrix
from npu.engine.ops import KernelOps, NumpyOps
from npu.engine.quant import INTEGER, QMatrix

try:
    from npu.engine.cpu_kernels import kernels

    LIB = kernels()
except Exception as exc:  # no C compiler on this machine: the fallback is tested elsewhere
    LIB, WHY = None, str(exc)
pytestmark = pytest.mark.skipif(LIB is None, reason="the CPU kernels cannot be built here")

ROWS = (1, 2, 3, 8, 9, 33)  # decode, batched decode (tiles of 2 and their edges), prompts


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def rounded_activations(x: np.ndarray) -> np.ndarray:
    """x as the kernels see it: per block of 32, codes round(x * 127 / max|x|) times the
    scale max|x| / 127 stored in f16 (llama.cpp's q8_0)."""
    blocks = x.reshape(len(x), -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    codes = np.rint(blocks * inv)
    return (codes * _f16(amax / np.float32(127))).reshape(x.shape)


def _matrix(rng: np.random.Generator, qtype: QT, rows: int, cols: int) -> QMatrix:
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[:, :32] += 0.5  # a block with an offset (Q4_1 / Q5_1's m away from 0)
    return QMatrix.from_float(w, qtype)


# the formats with a packed layout where the CPU has AVX2 (else none: PackedMatrix.of is None),
# in groups of GROUP rows (16 with AVX512-VNNI, 8 with AVX-VNNI or AVX2 alone)
PACKED = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0}
GROUP = LIB.fk_packed_rows() if LIB is not None else 0
# tests comparing this machine's build with one made for AVX2 alone (x86-64-v3): on a build
# without AVX2 (FLM_KERNEL_FLAGS=-march=x86-64, or a CPU without it) there is no AVX2 build
# to run or whose bits to match, and `test_the_portable_build_...` checks that build instead
SAME_BITS_AS_AVX2 = pytest.mark.skipif(
    GROUP == 0, reason="this build has no AVX2: there is no AVX2 build here to compare with")


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "blocks"])
@pytest.mark.parametrize("qtype", sorted(INTEGER), ids=lambda q: q.name)
@pytest.mark.parametrize("cols", [96, 576])
def test_integer_formats_are_the_product_with_8_bit_activations(qtype: QT, cols: int,
                                                                 pack: bool) -> None:
    rng = np.random.default_rng(int(qtype) * 1000 + cols)
    m = _matrix(rng, qtype, 37, cols)  # 37 rows: tiles of 4 and of 8, and a remainder
    lin = LinearFactory("cpu", threads=2, pack=pack).linear([m])
    assert isinstance(lin, CpuLinear)
    assert isinstance(lin.matrix, PackedMatrix) == (pack and GROUP > 0 and qtype in PACKED)
    w = m.dequantize().astype(np.float64)
    for T in ROWS:
        x = rng.standard_normal((T, cols)).astype(np.float32) * 3
        got = lin(x)
        exact = x.astype(np.float64) @ w.T
        emulated = rounded_activations(x).astype(np.float64) @ w.T
        scale = np.abs(exact).max()
        # the rounding's own bound: each activation moves by at most half a step (plus the
        # f16 scale's 2^-11), times the weights it meets
        steps = np.abs(x).reshape(T, -1, 32).max(-1) / 127  # [T, blocks]
        bound = (steps * 0.57) @ np.abs(w).reshape(len(w), -1, 32).sum(-1).T
        assert np.abs(got - emulated).max() <= 1e-3 * scale, (qtype.name, T)
        assert np.all(np.abs(got - exact) <= bound + 1e-3 * scale), (qtype.name, T)


@pytest.mark.skipif(GROUP == 0, reason="this build has no AVX2: no packed layout")
@pytest.mark.parametrize("qtype", sorted(PACKED), ids=lambda q: q.name)
def test_the_packed_layout_keeps_every_byte_and_every_sum(qtype: QT) -> None:
    """Packed, the blocks come back byte for byte and the rows read the same; a token's
    outputs are the same bits alone as among others (decode and prompts agree), and the
    product is the exact one on the 8-bit activations up to float rounding."""
    rng = np.random.default_rng(int(qtype))
    m = _matrix(rng, qtype, 21, 96)  # whole groups and a partial one
    packed = PackedMatrix.of(m, LIB)
    assert packed.nbytes == -(-21 // GROUP) * GROUP * m.data.shape[1]
    assert np.array_equal(packed.blocks().data, m.data)
    ids = np.array([20, 0, 7, 8, 13])
    assert np.array_equal(packed.rows(ids), m.rows(ids))
    assert np.array_equal(packed.dequantize(3, 11), m.dequantize(3, 11))
    with pytest.raises(IndexError):
        packed.rows(np.array([21]))
    lin = LinearFactory("cpu", threads=2).linear([m])
    x = rng.standard_normal((13, 96)).astype(np.float32)
    together = lin(x)
    for t in (0, 5, 12):
        assert np.array_equal(lin(x[t:t + 1])[0], together[t])
    assert np.array_equal(lin(x[4:9]), together[4:9])
    # each block's integer sum is exact: the float arithmetic on the rounded activations,
    # but Q4_1's and Q5_1's offsets, which meet the activations' sums rounded to f16
    # (llama.cpp's q8_1) as the unpacked product does
    if qtype in (QT.Q4_1, QT.Q5_1):
        want = LinearFactory("cpu", threads=2, pack=False).linear([m])(x)
    else:
        want = rounded_activations(x).astype(np.float64) @ m.dequantize().astype(np.float64).T
    assert np.abs(together - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.skipif(GROUP == 0, reason="this build has no AVX2: no packed layout")
@pytest.mark.parametrize("threads", [1, 16])  # 16: more threads than matrices and groups
def test_matrices_packed_later_are_written_in_one_call_as_packed_at_once(threads: int) -> None:
    """A factory that packs `later` makes empty packed matrices and writes them in one call
    (`pack`); past its budget those made before are written at once. A matrix in writable
    memory of its own with whole groups of rows is packed in place."""
    rng = np.random.default_rng(7)
    shapes = ((QT.Q4_0, 21), (QT.Q8_0, 5 * GROUP), (QT.Q5_1, 9))
    ms = [_matrix(rng, q, r, 96) for q, r in shapes]
    now = [PackedMatrix.of(m, LIB) for m in ms]
    ms[0].data.flags.writeable = False  # as a file's view is
    factory = LinearFactory("cpu", threads=2, later=now[1].nbytes + now[2].nbytes)
    lins = [factory.linear([m]) for m in ms]
    assert factory.unpacked == 2  # the second passed the budget: the first was written then
    assert [np.shares_memory(lin.matrix.data, m.data) for lin, m in zip(lins, ms)] == \
        [False, True, False]  # 21 rows: a partial group; 9 rows: the same
    assert np.array_equal(lins[0].matrix.data, now[0].data)
    assert not lins[2].matrix.data.any()
    factory.pack(threads=threads)
    assert factory.unpacked == 0
    for lin, packed in zip(lins, now):
        assert np.array_equal(lin.matrix.data, packed.data)


@pytest.mark.skipif(GROUP == 0, reason="this build has no AVX2: no packed layout")
def test_packed_sums_hold_at_the_extreme_codes() -> None:
    """Every code at its format's extreme (Q8_0's -128 and 127, Q4's 0 and 15, Q5's 0 and
    31) against activations whose codes are all +-127: the largest partial sums AVX2's
    16-bit steps make (vpmaddubsw saturates past 2^15) still come out exact."""
    rng = np.random.default_rng(3)
    rows, cols = 16, 256
    signs = rng.choice([-1.0, 1.0], size=(4, cols)).astype(np.float32)
    x = signs * 2.0  # every block's max: each code +-127
    x[1] = 2.0       # all +127, and all -127: the sums' extremes
    x[2] = -2.0
    for qtype in sorted(PACKED):
        if qtype == QT.Q8_0:  # d then 32 int8 codes per block, the codes -128 or 127
            nb = cols // 32
            data = np.zeros((rows, nb, 34), dtype=np.uint8)
            data[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            codes = rng.choice(np.array([-128, 127], dtype=np.int8), size=(rows, nb, 32))
            codes[0] = -128
            data[:, :, 2:] = codes.view(np.uint8)
            m = QMatrix(qtype, (rows, cols), data.reshape(rows, -1))
        else:  # +-1 in every block: the codes at both ends of their range
            m = QMatrix.from_float(rng.choice([-1.0, 1.0], size=(rows, cols)).astype(np.float32),
                                   qtype)
        got = CpuLinear(PackedMatrix.of(m, LIB), LinearFactory("cpu", 2).threads, LIB)(x)
        if qtype in (QT.Q4_1, QT.Q5_1):  # offsets meet the activations' f16-rounded sums
            want = LinearFactory("cpu", threads=2, pack=False).linear([m])(x)
        else:
            want = rounded_activations(x).astype(np.float64) @ m.dequantize().astype(np.float64).T
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), qtype.name


@pytest.mark.skipif(GROUP != 16, reason="this CPU has no AVX512-VNNI: its own build is the "
                                          "8-row one, which the other tests check")
def test_the_8_row_layout_of_avx_vnni_cpus_gives_the_same_bits(tmp_path) -> None:
    """CPUs with AVX-VNNI but not AVX512-VNNI pack 8 rows to a group (256-bit vectors): that
    build, made here with -DFK_PACK_ROWS=8, keeps the bytes and computes the same bits."""
    from npu.engine.cpu_kernels import build, load
    from npu.engine.linear import Threads

    lib8 = load(build(tmp_path, extra=("-DFK_PACK_ROWS=8",)))
    assert lib8.fk_packed_rows() == 8
    rng = np.random.default_rng(5)
    for qtype in sorted(PACKED):
        m = _matrix(rng, qtype, 21, 96)
        p8, p16 = PackedMatrix.of(m, lib8), PackedMatrix.of(m, LIB)
        assert p8.nbytes == 24 * m.data.shape[1]
        assert np.array_equal(p8.blocks().data, m.data)
        assert np.array_equal(p8.rows(np.array([0, 20, 9])), m.rows(np.array([0, 20, 9])))
        x = rng.standard_normal((11, 96)).astype(np.float32)
        got8 = CpuLinear(p8, Threads(2), lib8)(x)
        assert np.array_equal(got8, CpuLinear(p16, Threads(2), LIB)(x)), qtype.name


@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16], ids=lambda q: q.name)
def test_float_formats_are_exact(qtype: QT) -> None:
    rng = np.random.default_rng(7)
    m = _matrix(rng, qtype, 37, 96)
    lin = LinearFactory("cpu", threads=2).linear([m])
    w = m.dequantize().astype(np.float64)
    for T in (*ROWS, 40):
        x = rng.standard_normal((T, 96)).astype(np.float32)
        got, exact = lin(x), x @ w.T
        assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max(), T


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_1, QT.F16, QT.F32], ids=lambda q: q.name)
@pytest.mark.parametrize("head", [False, True], ids=["rows", "packed as a head"])
def test_an_embedding_refuses_ids_outside_its_rows(qtype: QT, head: bool) -> None:
    """Token ids come checked from the tokenizer and the server; a caller of the engine that
    gives one past the vocabulary (or below 0) gets an error, not a read past the weight
    (the kernels' row lookup is unchecked: a crash, or another tensor's bytes as a row)."""
    rng = np.random.default_rng(3)
    m = _matrix(rng, qtype, 40, 64)
    emb = LinearFactory("cpu", threads=2).embedding(m, head=head)
    np.testing.assert_allclose(emb(np.array([0, 39])), m.dequantize()[[0, 39]], atol=1e-6)
    for bad in (40, 10**8, -1):
        with pytest.raises(ValueError, match=f"token id {bad} is outside the vocabulary"):
            emb(np.array([3, bad, 4]))
    assert emb(np.array([], dtype=np.int64)).shape == (0, 64)


def test_more_query_heads_a_key_head_than_the_kernel_takes_are_numpys() -> None:
    """fk_attend takes at most 64 query heads a key head: past that, numpy's attention on a
    float cache (it said it could not allocate); a Q8_0 cache says what it cannot take."""
    rng = np.random.default_rng(4)
    ops, ref = KernelOps(LIB, LinearFactory("cpu", 2).threads), NumpyOps()
    nq, dim = 66, 16
    K = rng.standard_normal((4, 1, 16, dim)).astype(np.float16)
    V = rng.standard_normal((4, 1, 16, dim)).astype(np.float16)
    tables, lengths = np.stack([np.arange(4)] * 2), np.array([30, 50])
    q = rng.standard_normal((2, nq, dim)).astype(np.float32)
    got = ops.attend(q, K, V, tables, lengths, 0, None, np.float32(0.25))
    want = ref.attend(q, K.astype(np.float32), V.astype(np.float32), tables, lengths, 0, None,
                      np.float32(0.25))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    K8 = np.zeros((4, 1, 16, 34), np.uint8)
    with pytest.raises(ValueError, match="at most 64 query heads a key head"):
        ops.attend(rng.standard_normal((2, nq, 32)).astype(np.float32), K8, K8.copy(), tables,
                   lengths, 0, None, np.float32(0.25))


def test_a_zero_activation_block_and_a_constant_one() -> None:
    """max|x| = 0 gives codes 0 (no division by zero); a block whose scale f16 holds
    exactly (127/128: scale 1/128, codes 127) is exact."""
    rng = np.random.default_rng(3)
    m = _matrix(rng, QT.Q4_0, 8, 64)
    lin = LinearFactory("cpu", threads=1).linear([m])
    x = np.zeros((2, 64), dtype=np.float32)
    x[1, 32:] = 127 / 128
    got = lin(x)
    exact = x @ m.dequantize().T
    assert np.all(got[0] == 0)
    assert np.allclose(got[1], exact[1], atol=1e-5)


def test_rms_norm_kernel_is_numpys() -> None:
    rng = np.random.default_rng(1)
    ops, ref = KernelOps(LIB, LinearFactory("cpu", 2).threads), NumpyOps()
    for shape in ((5, 96), (3, 4, 64), (1, 13)):
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        assert np.allclose(ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), rtol=1e-5,
                           atol=1e-6)


def test_silu_kernel_is_exact_to_float_rounding_far_out() -> None:
    """SwiGLU's kernel computes e^x itself 8 lanes at a time (the last I % 8 with expf):
    within 2e-7 of float64 over the whole float range of activations, finite at the ends."""
    ops = KernelOps(LIB, LinearFactory("cpu", 1).threads)
    g = np.concatenate([np.linspace(-200, 200, 4001), [-1e30, 1e30, 0.0, -0.0]])
    g = g.astype(np.float32)[None, :]  # 4005 values: a tail of 5 after the 8-lane part
    got = ops.gated(np.concatenate([g, np.full_like(g, 2)], axis=1), "silu")[0]
    x = g[0].astype(np.float64)
    want = 2 * x / (1 + np.exp(-np.clip(x, -700, 700)))
    assert np.all(np.isfinite(got))
    near = np.abs(want) > 1e-30
    assert np.max(np.abs(got - want)[near] / np.abs(want)[near]) < 2e-7
    assert np.max(np.abs(got - want)[~near]) < 1e-30


def test_geglu_kernel_is_gelu_tanh_to_float_rounding_far_out() -> None:
    """Gemma's GeGLU kernel (x / (1 + e^(-2u)), the same function as 0.5 x (1 + tanh u)):
    within 1e-6 of float64's tanh form everywhere, to 5e-6 relative where the value is not
    tiny (numpy's float32 tanh form loses 15% in the negative tail), finite at the ends."""
    ops = KernelOps(LIB, LinearFactory("cpu", 1).threads)
    g = np.concatenate([np.linspace(-200, 200, 4001), np.linspace(-6, 6, 1201),
                        [-1e30, 1e30, 0.0, -0.0]]).astype(np.float32)[None, :]
    got = ops.gated(np.concatenate([g, np.full_like(g, 2)], axis=1), "gelu_tanh")[0]
    x = g[0].astype(np.float64)
    with np.errstate(over="ignore"):
        want = x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert np.all(np.isfinite(got)) and got[-4] == 0 and got[-3] == np.float32(2e30)
    assert np.max(np.abs(got - want)[:-4]) < 1e-6
    big = np.abs(want) > 1e-6
    assert np.max(np.abs(got - want)[big] / np.abs(want)[big]) < 5e-6


def test_gelu_kernel_is_the_error_functions_and_a_row_does_not_depend_on_the_batch() -> None:
    """BERT's GELU (x Phi(x), erf by Abramowitz and Stegun as numpy's `gelu`): within 1e-6
    of float64's exact erf everywhere (the formula's own error: relative, it grows in the
    negative tail, as numpy's does), 2e-6 relative where the value is above 0.1, finite at
    the ends; a row's values the same bits alone as among others, with rows whose length
    leaves a tail past the 8 lanes; and numpy's own `gelu` within float rounding of it."""
    from math import erf

    ops, ref = KernelOps(LIB, LinearFactory("cpu", 1).threads), NumpyOps()
    ends = [-1e30, 1e30, 0.0, -0.0]  # in the 8 lanes, and again in a row's tail
    g = np.concatenate([ends, [-3.0] * 4, np.linspace(-40, 40, 4001), np.linspace(-6, 6, 1201),
                        ends]).astype(np.float32)[None, :]
    got = ops.gelu(g.copy())[0]
    want = np.array([0.5 * v * (1 + erf(v / np.sqrt(2))) for v in g[0][4:-4].astype(np.float64)])
    assert np.all(np.isfinite(got))
    for at in (0, len(got) - 4):
        assert list(got[at:at + 4]) == [0, np.float32(1e30), 0, 0]
    assert np.max(np.abs(got[4:-4] - want)) < 1e-6
    big = np.abs(want) > 0.1
    assert np.max(np.abs(got[4:-4] - want)[big] / np.abs(want)[big]) < 2e-6
    row = ops.gelu(g[0].copy())  # a single row as a 1-D array
    assert row.shape == g[0].shape and np.array_equal(row, got)
    rng = np.random.default_rng(4)
    for width in (40, 37, 5):  # whole sets of 8 lanes, a tail, a tail alone
        x = rng.standard_normal((6, width)).astype(np.float32) * 4
        every = ops.gelu(x.copy())
        assert np.allclose(every, ref.gelu(x.copy()), rtol=2e-6, atol=1e-7)
        for t in range(6):
            assert np.array_equal(ops.gelu(x[t:t + 1].copy()), every[t:t + 1])


def test_gated_and_qk_rope_kernels_are_numpys() -> None:
    rng = np.random.default_rng(2)
    ops, ref = KernelOps(LIB, LinearFactory("cpu", 2).threads), NumpyOps()
    gu = rng.standard_normal((3, 2 * 40)).astype(np.float32) * 4
    assert np.allclose(ops.gated(gu, "silu"), ref.gated(gu, "silu"), rtol=1e-5, atol=1e-6)
    # numpy's float32 tanh form loses digits in the negative tail: absolute terms there
    assert np.allclose(ops.gated(gu, "gelu_tanh"), ref.gated(gu, "gelu_tanh"), rtol=1e-5,
                       atol=1e-6)
    nq, nkv, dim, n = 4, 2, 16, 5
    angles = rng.uniform(0, 6, (n, dim // 2)).astype(np.float32)
    cos = np.cos(np.concatenate([angles, angles], -1))
    sin = np.sin(np.concatenate([angles, angles], -1))
    for norms in (None, (rng.standard_normal(dim).astype(np.float32),
                         rng.standard_normal(dim).astype(np.float32))):
        qkv = rng.standard_normal((n, (nq + 2 * nkv) * dim)).astype(np.float32)
        qn, kn = norms or (None, None)
        want = ref.qk_rope(qkv.copy(), nq, nkv, qn, kn, 1e-6, cos, sin)
        got = ops.qk_rope(qkv.copy(), nq, nkv, qn, kn, 1e-6, cos, sin)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.array_equal(got[:, (nq + nkv) * dim:], qkv[:, (nq + nkv) * dim:])  # values


@pytest.fixture()
def cache():
    """A paged cache [12 blocks, 2 kv heads, 16 positions, 16] and three sequences' block
    tables, out of order and padded (row 0 holds 1 block, row 1 all 3, row 2 2)."""
    rng = np.random.default_rng(5)
    K = rng.standard_normal((12, 2, 16, 16)).astype(np.float32)
    V = rng.standard_normal((12, 2, 16, 16)).astype(np.float32)
    tables = np.array([[7, 0, 0], [3, 11, 1], [5, 9, 0]])
    return rng, K, V, tables


def _dense(store: np.ndarray, table) -> np.ndarray:
    """One sequence's positions in order: [nkv, positions, dim]."""
    return np.concatenate([store[b] for b in table], axis=1)


@pytest.mark.parametrize("window", [0, 8])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_decode_attention_kernel_is_numpys(cache, window: int, with_sinks: bool) -> None:
    rng, K, V, tables = cache
    ops, ref = KernelOps(LIB, LinearFactory("cpu", 2).threads), NumpyOps()
    sinks = rng.standard_normal(4).astype(np.float32) if with_sinks else None
    q = rng.standard_normal((3, 4, 16)).astype(np.float32)
    lengths = np.array([5, 48, 17])
    got = ops.attend(q, K, V, tables, lengths, window, sinks, np.float32(0.25))
    want = ref.attend(q, K, V, tables, lengths, window, sinks, np.float32(0.25))
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    # and both read each row's blocks in table order, as plain attention over them would
    for b in range(3):
        n, lo = lengths[b], max(0, lengths[b] - window) if window else 0
        Kd, Vd = _dense(K, tables[b])[:, lo:n], _dense(V, tables[b])[:, lo:n]
        for h in range(4):
            scores = Kd[h // 2] @ q[b, h] * 0.25
            top = max(scores.max(), sinks[h]) if with_sinks else scores.max()
            e = np.exp(scores - top)
            total = e.sum() + (np.exp(sinks[h] - top) if with_sinks else 0)
            assert np.allclose(got[b, h * 16 : (h + 1) * 16], e @ Vd[h // 2] / total,
                               atol=1e-5)


@pytest.mark.parametrize("nq, nkv, dim", [
    (6, 2, 16), (6, 2, 24),  # 3 query heads a key head; rows of whole 16-value steps, and not
    (4, 4, 128), (8, 4, 64), (16, 2, 32)])  # 1, 2 and 8 (two sets) query heads a key head
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("window", [0, 100])
def test_long_rows_attend_in_spans_as_numpy_does_and_alike_alone(nq: int, nkv: int, dim: int,
                                                                 half: bool,
                                                                 window: int) -> None:
    """Rows seeing hundreds of keys are cut into spans that threads share and then merged:
    still numpy's attention (sinks, windows, 1 to 8 query heads per key head, f16 or float32
    cache), and a row's outputs are the same bits alone as among others, on 1 thread or 2."""
    rng = np.random.default_rng(nq + dim + half + window)
    dtype = np.float16 if half else np.float32
    K = rng.standard_normal((60, nkv, 16, dim)).astype(dtype)
    V = rng.standard_normal((60, nkv, 16, dim)).astype(dtype)
    tables = np.stack([rng.permutation(60) for _ in range(4)])
    lengths = np.array([900, 1, 161, 49])
    q = rng.standard_normal((4, nq, dim)).astype(np.float32)
    sinks = rng.standard_normal(nq).astype(np.float32)
    scale = np.float32(dim ** -0.5)
    ops, ref = KernelOps(LIB, LinearFactory("cpu", 2).threads), NumpyOps()
    got = ops.attend(q, K, V, tables, lengths, window, sinks, scale)
    want = ref.attend(q, K.astype(np.float32), V.astype(np.float32), tables, lengths, window,
                      sinks, scale)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    alone = KernelOps(LIB, LinearFactory("cpu", 1).threads)
    for b in range(4):
        one = alone.attend(q[b : b + 1], K, V, tables[b : b + 1], lengths[b : b + 1], window,
                           sinks, scale)
        assert np.array_equal(one[0], got[b]), b


_SHORTER_ROW_LONGER_SPAN = """
import numpy as np
from npu.engine.cpu_kernels import kernels
from npu.engine.linear import LinearFactory
from npu.engine.ops import KernelOps, NumpyOps

rng = np.random.default_rng(7)
ops, ref = KernelOps(kernels(), LinearFactory("cpu", 1).threads), NumpyOps()
worst = 0.0
for nq, nkv, dim in [(6, 1, 16), (8, 1, 64), (7, 1, 128)]:
    K = rng.standard_normal((6, nkv, 16, dim)).astype(np.float16)
    V = rng.standard_normal((6, nkv, 16, dim)).astype(np.float16)
    tables = np.stack([rng.permutation(6) for _ in range(3)])
    lengths = np.array([49, 48, 40])
    q = rng.standard_normal((3, nq, dim)).astype(np.float32)
    got = ops.attend(q, K, V, tables, lengths, 0, None, np.float32(0.25))
    want = ref.attend(q, K.astype(np.float32), V.astype(np.float32), tables, lengths, 0, None,
                      np.float32(0.25))
    worst = max(worst, float(np.abs(got - want).max()))
print(worst)
"""


def test_a_shorter_row_cut_into_longer_spans_stays_in_its_scratch() -> None:
    """49 keys are two spans of 32, 48 one of 48: a decode batch's scratch was sized by its
    longest row while a shorter row's task laid it out by its own, longer span, and wrote
    past it with 6 or more query heads a key head (gpt-oss, Qwen2.5-7B: a short
    conversation's verify step, or a batch of short ones). In a child process, as a write
    past the scratch aborts it (at free) rather than this one."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _SHORTER_ROW_LONGER_SPAN], text=True,
                          capture_output=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) < 1e-5


def _new_tokens_f16(ops, rng, K, V, tables):
    """A step of three rows' new keys and values written and attended by `ops` over an f16
    copy of the cache, and by numpy over a float32 copy: qkv, the two outputs and the four
    caches after."""
    qkv = rng.standard_normal((3, (4 + 2 * 2) * 16)).astype(np.float32)
    pos = np.array([4, 47, 16])
    K16, V16 = K.astype(np.float16), V.astype(np.float16)
    got = ops.attend_new(qkv, 4, K16, V16, tables, pos, 0, None, np.float32(0.25))
    K32, V32 = K.copy(), V.copy()
    want = NumpyOps().attend_new(qkv, 4, K32, V32, tables, pos, 0, None, np.float32(0.25))
    return qkv, got, want, K16, V16, K32, V32


def test_new_tokens_join_an_f16_cache_and_attend(cache) -> None:
    """The kernels' cache for quantized models is f16: writing a step's keys and values and
    attending over them matches numpy over the same cache in float32 to f16's precision."""
    rng, K, V, tables = cache
    ops = KernelOps(LIB, LinearFactory("cpu", 2).threads)
    assert ops.kv_dtype == np.float16
    qkv, got, want, K16, V16, K32, V32 = _new_tokens_f16(ops, rng, K, V, tables)
    assert not np.allclose(K32, K)  # the new rows were written ...
    assert np.allclose(K32[1, :, 15], qkv[1, 64:96].reshape(2, 16))  # ... at block 3 of row 1
    assert np.allclose(K16.astype(np.float32), K32, atol=2e-3)  # the kernel wrote the same
    assert np.allclose(V16.astype(np.float32), V32, atol=2e-3)
    assert np.allclose(got, want, atol=3e-3)


@pytest.mark.parametrize("window", [0, 4])
def test_prompt_attention_kernel_is_numpys(cache, window: int) -> None:
    rng, K, V, tables = cache
    ops, ref = KernelOps(LIB, LinearFactory("cpu", 2).threads), NumpyOps()
    q = rng.standard_normal((9, 4, 16)).astype(np.float32)
    got = ops.attend_prompt(q, K, V, tables[1], 30, window, None, np.float32(0.25))
    want = ref.attend_prompt(q, K, V, tables[1], 30, window, None, np.float32(0.25))
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def avx2_lib(tmp_path_factory):
    """The kernels built for AVX2 alone (-march=x86-64-v3), once for the tests below."""
    from npu.engine.cpu_kernels import build, load

    return load(build(tmp_path_factory.mktemp("avx2"), extra=("-march=x86-64-v3",)))


@SAME_BITS_AS_AVX2
def test_the_avx2_build_packs_8_rows_and_computes_the_same_bits(avx2_lib) -> None:
    """A CPU with AVX2 but no VNNI (x86-64-v3: many AMD EPYC and older Intel) packs 8 rows to
    a group too and makes the same exact integer sums with vpmaddubsw / vpmaddwd (Q8_0's codes
    kept signed): that build, made here with -march=x86-64-v3, keeps the bytes and gives the
    same bits as this machine's own build, packed and in the file's blocks, for every integer
    format, decode and prompt rows (`make test` with FLM_KERNEL_FLAGS=-march=x86-64-v3 runs
    the whole suite on it)."""
    from npu.engine.linear import Threads

    lib2 = avx2_lib
    assert lib2.fk_packed_rows() == 8
    rng = np.random.default_rng(9)
    for qtype in sorted(INTEGER):
        m = _matrix(rng, qtype, 37, 576)
        p2 = PackedMatrix.of(m, lib2)
        assert (p2 is not None) == (qtype in PACKED)
        if p2 is not None:
            assert np.array_equal(p2.blocks().data, m.data)
            assert np.array_equal(p2.rows(np.array([0, 36, 9])), m.rows(np.array([0, 36, 9])))
        own = PackedMatrix.of(m, LIB) if GROUP else None
        for T in ROWS:
            x = rng.standard_normal((T, 576)).astype(np.float32) * 3
            got = CpuLinear(m, Threads(2), lib2)(x)
            assert np.array_equal(got, CpuLinear(m, Threads(2), LIB)(x)), (qtype.name, T)
            if p2 is not None and own is not None:
                got = CpuLinear(p2, Threads(2), lib2)(x)
                assert np.array_equal(got, CpuLinear(own, Threads(2), LIB)(x)), (qtype.name, T)


@SAME_BITS_AS_AVX2
def test_decode_attention_is_the_same_bits_in_the_avx2_build(avx2_lib) -> None:
    """An f16 cache's decode attention computes the same bits built for AVX2 alone
    (x86-64-v3) as in this machine's own build (with AVX-512: 16 lanes, the queries held in
    registers for head sizes 64 and 128), for each grouping of query heads, head size and
    length (spans, the last key alone, sets of 8 keys cut short)."""
    from npu.engine.linear import Threads

    own, avx2 = KernelOps(LIB, Threads(2)), KernelOps(avx2_lib, Threads(2))
    rng = np.random.default_rng(3)
    for nq, nkv, dim in [(9, 3, 64), (4, 1, 64), (6, 1, 64), (16, 8, 128), (12, 4, 128),
                         (4, 2, 32)]:
        K = rng.standard_normal((24, nkv, 16, dim)).astype(np.float16)
        V = rng.standard_normal((24, nkv, 16, dim)).astype(np.float16)
        tables = rng.permutation(24).reshape(3, 8)
        q = rng.standard_normal((3, nq, dim)).astype(np.float32)
        for lengths in ([1, 9, 128], [127, 40, 7]):
            args = (q, K, V, tables, np.array(lengths), 0, None, np.float32(dim ** -0.5))
            assert np.array_equal(own.attend(*args), avx2.attend(*args)), (nq, nkv, dim)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="-march=x86-64 is x86's; on other CPUs the native build is the "
                           "portable one, which the whole suite runs on")
def test_the_portable_build_rounds_the_activations_and_keeps_an_f16_cache(tmp_path, cache) -> None:
    """Built for a CPU without AVX2 (-march=x86-64: the build aarch64 and older x86 hosts
    get), the integer formats are still products on 8-bit activations in plain C, each
    token's output the same bits alone as among others (prefix reuse and verified drafts
    rely on it), and the KV cache is f16, written and attended as numpy does
    (`FLM_KERNEL_FLAGS=-march=x86-64` runs the whole suite, the one-call step's included, on
    that build)."""
    from npu.engine.cpu_kernels import build, load
    from npu.engine.linear import Threads

    lib = load(build(tmp_path, extra=("-march=x86-64",)))
    assert lib.fk_packed_rows() == 0
    rng = np.random.default_rng(11)
    for qtype in sorted(INTEGER):
        m = _matrix(rng, qtype, 37, 96)
        w = m.dequantize().astype(np.float64)
        x = rng.standard_normal((9, 96)).astype(np.float32) * 3
        got = CpuLinear(m, Threads(2), lib)(x)
        emulated = rounded_activations(x).astype(np.float64) @ w.T
        assert np.abs(got - emulated).max() <= 1e-3 * np.abs(emulated).max(), qtype.name
        for t in (0, 4, 8):
            assert np.array_equal(CpuLinear(m, Threads(1), lib)(x[t:t + 1]), got[t:t + 1])
    _, K, V, tables = cache
    ops = KernelOps(lib, LinearFactory("cpu", 2).threads)
    _, got, want, K16, V16, K32, V32 = _new_tokens_f16(ops, rng, K, V, tables)
    assert np.array_equal(K16, K32.astype(np.float16))  # numpy's rounding, to the bit
    assert np.array_equal(V16, V32.astype(np.float16))
    assert np.allclose(got, want, atol=3e-3)
    # the k-quant conversion's plain C (no AVX2, no F16C) makes numpy's bytes too
    from npu.engine import convert
    from tests.npu.engine.test_convert import HALVES, _blocks

    for qtype in HALVES:
        m = QMatrix(qtype, (8, 512), _blocks(np.random.default_rng(int(qtype)), 8, 512, qtype))
        ref, _ = m.to_native(reference=True)
        done = convert.convert(qtype, m.data, lib=convert.declared(lib))
        assert done is not None and done[0] == ref.qtype, qtype.name
        assert np.array_equal(done[1], ref.data), qtype.name
        # factors of inf and NaN (a broken file): the plain C and this build alike
        bad = _blocks(np.random.default_rng(1), 8, 512, qtype).reshape(
            -1, GGML_QUANT_SIZES[qtype][1])  # super-blocks
        for i, at in enumerate(HALVES[qtype] * 4):
            bad[i, at : at + 2] = np.array([[np.inf, np.nan][i % 2]], np.float16).view(np.uint8)
        bad = bad.reshape(m.data.shape)
        plain, here = convert.convert(qtype, bad, lib=convert.declared(lib)), \
            convert.convert(qtype, bad)
        assert np.array_equal(plain[1], here[1]) and np.allclose(plain[2:], here[2:],
                                                                 equal_nan=True), qtype.name


@pytest.mark.parametrize("half", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("nq,nkv,dim,n,pos,window,with_sinks", [
    (4, 4, 16, 37, 0, 0, False),    # no GQA, a whole prompt, 37 rows: 3 row blocks, the last short
    (9, 3, 64, 50, 21, 0, False),   # SmolLM2's heads (groups of 3), a prefix of 21 cached
    (16, 8, 128, 17, 40, 0, True),  # Qwen3's, with sinks
    (6, 2, 32, 45, 13, 20, False),  # a window shorter than the piece
    (2, 1, 24, 1, 70, 0, False),    # one row; a head size not a multiple of 16
])
def test_blocked_prompt_attention_is_numpys(half: bool, nq: int, nkv: int, dim: int, n: int,
                                            pos: int, window: int, with_sinks: bool) -> None:
    """The blocked prompt attention (each key read once per block of rows, online softmax)
    against numpy's two-pass softmax over the same cache, at shapes that cross its blocks
    of rows and keys unevenly, with a prefix already cached, GQA groups, windows and sinks."""
    rng = np.random.default_rng(n + pos)
    blocks = -(-(pos + n) // 16) + 3
    dt = np.float16 if half else np.float32
    K = rng.standard_normal((blocks, nkv, 16, dim)).astype(dt)
    V = rng.standard_normal((blocks, nkv, 16, dim)).astype(dt)
    table = rng.permutation(blocks)[: -(-(pos + n) // 16)].astype(np.int64)
    q = rng.standard_normal((n, nq, dim)).astype(np.float32)
    sinks = rng.standard_normal(nq).astype(np.float32) if with_sinks else None
    scale = np.float32(dim ** -0.5)
    ops = KernelOps(LIB, LinearFactory("cpu", 2).threads)
    got = ops.attend_prompt(q, K, V, table, pos, window, sinks, scale)
    want = NumpyOps().attend_prompt(q, K.astype(np.float32), V.astype(np.float32), table, pos,
                                    window, sinks, scale)
    assert np.allclose(got, want, rtol=1e-5, atol=2e-6)
    # a row's result does not depend on the rows computed with it
    one = ops.attend_prompt(q[n - 1 :], K, V, table, pos + n - 1, window, sinks, scale)
    assert np.array_equal(one[0], got[n - 1])


@pytest.mark.parametrize("half", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("nq,nkv,dim,n,with_sinks", [
    (12, 12, 64, 45, False),   # BERT-base's heads, 45 rows: row blocks and key steps uneven
    (16, 8, 128, 1, True),     # one row, GQA, sinks
    (6, 2, 24, 100, False),    # a head size not a multiple of 16
])
def test_bidirectional_blocked_attention_is_numpys(half: bool, nq: int, nkv: int, dim: int,
                                                   n: int, with_sinks: bool) -> None:
    """An encoder's input (fk_attend_all): every row over all the input's keys, each key read
    once per block of rows; numpy's two-pass softmax, and a row the same bits alone."""
    rng = np.random.default_rng(n + dim)
    blocks = -(-n // 16) + 2
    dt = np.float16 if half else np.float32
    K = rng.standard_normal((blocks, nkv, 16, dim)).astype(dt)
    V = rng.standard_normal((blocks, nkv, 16, dim)).astype(dt)
    table = rng.permutation(blocks)[: -(-n // 16)].astype(np.int64)
    q = rng.standard_normal((n, nq, dim)).astype(np.float32)
    sinks = rng.standard_normal(nq).astype(np.float32) if with_sinks else None
    scale = np.float32(dim ** -0.5)
    ops = KernelOps(LIB, LinearFactory("cpu", 2).threads)
    got = ops.attend_all(q, K, V, table, n, sinks, scale)
    want = NumpyOps().attend_all(q, K.astype(np.float32), V.astype(np.float32), table, n,
                                 sinks, scale)
    assert np.allclose(got, want, rtol=1e-5, atol=2e-6)
    last = ops.attend_all(q[n - 1 :], K, V, table, n, sinks, scale)
    assert np.array_equal(last[0], got[n - 1])
    for keys in (0, len(table) * 16 + 1):  # none, or more than its blocks hold
        with pytest.raises(ValueError, match="attend_all over"):
            ops.attend_all(q, K, V, table, keys, sinks, scale)
