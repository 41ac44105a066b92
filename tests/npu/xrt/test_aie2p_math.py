"""AIE2P's exp and 1/x from lookup tables (npu.xrt.aie2p_math), against values worked out by
hand from the published description (mlir-aie aie_runtime_lib/AIE2P/lut_based_ops.h at
0e3f42d6; amd/IRON iron/operators/flm/aie2p_math_emulation.py at 072d3995), and a layer op
declaring `math: "aie2p"` computing with them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import config_from_json, load_model
from npu.xrt import XRT
from npu.xrt.aie2p_math import exp_lut, inv_lut, silu, softmax
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

E_BF16 = 2.71875  # e rounded to bf16: 1.35914 * 128 = 173.97 -> 174 / 64
E_INV_BF16 = 0.3671875  # 1/e: 1.47152 * 128 = 188.35 -> 188 / 512
SQRT_E_BF16 = 1.6484375  # e^(128/256): 1.64872 * 128 = 211.04 -> 211 / 128
E_255_BF16 = 2.703125  # e^(255/256) = 2.70765: / 2 * 128 = 173.29 -> 173 / 64


def test_exp_is_the_product_of_two_bf16_tables() -> None:
    x = np.array([0.0, 1.0, -0.5, 0.001, -0.001, -200.0], dtype=np.float32)
    got = exp_lut(x).tolist()
    # 0 -> word 0: e^0 e^0; 1 -> 0x0100: e^1 e^0; -0.5 -> 0xFF80: e^-1 e^(128/256)
    assert got[:3] == [1.0, E_BF16, np.float32(E_INV_BF16 * SQRT_E_BF16)]
    # steps of 1/256: 0.001 is still 0 (1.0), -0.001 already the step below, 0xFFFF:
    # e^-1 e^(255/256) = 0.9926, not 0.999
    assert got[3] == 1.0 and got[4] == np.float32(E_INV_BF16 * E_255_BF16)
    assert got[5] == 0.0  # saturated to n = -128: e^-128 is 0 in bf16


def test_inverse_from_the_exponent_and_a_7_bit_mantissa_table() -> None:
    # 2 = 0x40000000: exponent 128, mantissa 0 -> exponent 126 + 0: 0x3F00 = 0.5
    # 3 = 0x40400000: exponent 128, mantissa 64 -> round(256 / 1.5) = 171, low 7 bits 43:
    # 0x3EAB = 0.333984375; 1.0 -> 1.0
    assert inv_lut(np.array([2.0, 3.0, 1.0], dtype=np.float32)).tolist() == [
        0.5, 0.333984375, 1.0]
    x = np.geomspace(1e-3, 1e3, 4001).astype(np.float32)
    err = np.abs(inv_lut(x) * x - 1)
    # x rounded to 7 mantissa bits, then a 7-bit table: each off by up to 2^-8
    assert 0.004 < err.max() < 2 * 2.0 ** -8


def test_softmax_and_silu_are_the_tables_not_f32() -> None:
    s = np.array([[0.0, -1.0, -0.5, 3.0]], dtype=np.float32)
    masked = np.array([[False, False, False, True]])
    p = softmax(s, masked, "floor")
    e = np.array([1.0, E_INV_BF16, E_INV_BF16 * SQRT_E_BF16], dtype=np.float32)
    want = e * inv_lut(np.array([e.sum(dtype=np.float32)], dtype=np.float32))[0]
    np.testing.assert_array_equal(p[0, :3], want)
    assert p[0, 3] == 0.0 and abs(p.sum() - 1) > 1e-4  # the reciprocal's error shows
    g = np.array([0.0, 2.0, -100.0], dtype=np.float32)
    got = silu(g, "conv_even")
    # silu(2): sigmoid = 1 / (1 + e^-2); e^-2 from the tables: word 0xFE00, e^-2 e^0
    e2 = float(exp_lut(np.array([-2.0], dtype=np.float32))[0])
    assert got[0] == 0.0 and abs(got[2]) < 1e-30  # -100 e^-80: the cap, not a table overflow
    assert got[1] == np.float32(2 * inv_lut(np.array([1 + e2], dtype=np.float32))[0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from npu.load.tiny import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("cache"))


def test_a_layer_op_with_aie2p_math_computes_with_the_tables(tiny, tmp_path) -> None:
    cfg = config_from_json(json.loads((tiny / "config.json").read_text()))
    out = {}
    for math in ("exact", "aie2p"):
        kd = make_kernel_dir(tmp_path / math, [cfg], weights="bf16", ctx=64, math=math,
                             ops=("gemv", "gemm", "layer"))
        engine = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])),
                            npu_mode="layer").engine
        out[math] = [engine.prefill("a", [1, 2, 3, 4, 5]), engine.decode(["a"], [6])[0]]
    for a, b in zip(out["aie2p"], out["exact"]):
        assert not np.array_equal(a, b)
        assert np.abs(a - b).max() < 0.05 * np.abs(b).max()  # close: a few bf16 steps


def test_math_is_declared_for_layer_ops_only(tmp_path) -> None:
    from npu.xrt import XRTError
    from npu.xrt.manifest import load_manifest

    cfg = config_from_json({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 100, "max_position_embeddings": 64})
    for overrides, message in [({"gemv": {"math": "aie2p"}}, "math is for the layer ops"),
                               ({"layer": {"math": "lut"}}, "not exact or aie2p")]:
        kd = make_kernel_dir(tmp_path / message[:4], [cfg], weights="bf16", ctx=64,
                             ops=("gemv", "layer"), overrides=overrides)
        with pytest.raises(XRTError, match=message):
            load_manifest(kd / "npu2")
