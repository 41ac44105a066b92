"""The k-quant conversion in C (cpu_convert.c) makes the numpy reference's bytes and bound."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from npu.engine import convert
from npu.engine.quant import QMatrix

pytestmark = pytest.mark.skipif(not convert.available(), reason="the CPU kernels cannot be built here")

# where each k-quant's f16 factors sit in its super-block
HALVES = {QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2),
          QT.Q6_K: (208,)}


def _blocks(rng: np.random.Generator, rows: int, cols: int, qtype: QT) -> np.ndarray:
    """Random super-blocks whose f16 factors span zero, subnormals and values up to 1000
    (random bytes elsewhere: every code and 6-bit scale)."""
    _, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows * cols // 256, size), dtype=np.uint8)
    n = len(b)
    for at in HALVES[qtype]:
        mag = np.exp2(rng.uniform(-26, 10, n)) * rng.choice([-1, 1], n)
        mag[rng.random(n) < 0.05] = 0.0
        b[:, at : at + 2] = mag.astype(np.float16).view(np.uint8).reshape(n, 2)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("qtype", list(HALVES))
def test_c_conversion_equals_the_numpy_reference_byte_for_byte(qtype: QT) -> None:
    m = QMatrix(qtype, (24, 1024), _blocks(np.random.default_rng(int(qtype)), 24, 1024, qtype))
    ref, ref_bound = m.to_native(reference=True)
    fast, bound = m.to_native()
    assert fast.qtype == ref.qtype and fast.shape == ref.shape
    assert np.array_equal(fast.data, ref.data)
    assert bound == pytest.approx(ref_bound, rel=1e-6)


@pytest.mark.parametrize("qtype", list(HALVES))
def test_rows_taken_in_an_order_and_packed_as_converted_are_the_same_bytes(qtype: QT) -> None:
    """`order` is `reorder` before the conversion; `packed` is the packed layout of what the
    conversion makes (each group packed as it is converted), on 1 and 3 threads."""
    from npu.engine.cpu_kernels import kernels
    from npu.engine.linear import PackedMatrix

    rows = 4 * max(convert.packed_rows(), 1)
    m = QMatrix(qtype, (rows, 512), _blocks(np.random.default_rng(7 + int(qtype)), rows, 512,
                                            qtype))
    order = np.random.default_rng(1).permutation(rows)
    want, _ = m.reorder(order).to_native(reference=True)
    got = convert.convert(qtype, m.data, order=order)
    assert np.array_equal(got[1], want.data)
    if not convert.packed_rows():
        with pytest.raises(RuntimeError):
            convert.convert(qtype, m.data, packed=True)
        return
    packed = PackedMatrix.of(want, kernels())
    for threads in (1, 3):
        p = convert.convert(qtype, m.data, n_threads=threads, order=order, packed=True)
        assert p[0] == want.qtype and p[2:] == got[2:]
        assert np.array_equal(p[1].reshape(-1), packed.data)
    with pytest.raises(RuntimeError):  # a partial group: not packed here
        convert.convert(qtype, m.data[:rows - 1], packed=True)


def test_threads_make_the_same_bytes() -> None:
    data = _blocks(np.random.default_rng(5), 64, 2048, QT.Q6_K)
    one = convert.convert(QT.Q6_K, data, n_threads=1)
    for n in (3, 16):  # 16: more threads than rows a thread (64 rows), a 16-core default
        many = convert.convert(QT.Q6_K, data, n_threads=n)
        assert np.array_equal(one[1], many[1]) and one[2:] == many[2:]


def test_software_f16_rounding_is_numpys() -> None:
    """The rounding builds without F16C use: nearest even, subnormals, overflow to inf."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    edges = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 2.0**-25,
                      3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 1 + 2.0**-11,
                      1 + 3 * 2.0**-11, 5.96e-8, 6.1e-5], dtype=np.float32)
    near = np.exp2(rng.uniform(-27, 17, 100_000)).astype(np.float32)
    for v in (x, edges, near, -near):
        with np.errstate(over="ignore"):
            assert np.array_equal(convert.half_soft(v), v.astype(np.float16).view(np.uint16))
