"""Manifests for amd/IRON's GEMV and GEMM operators (iron/operators/gemv/op.py and
gemm/op.py at 00802545; flm/gemm and flm/packing.py at 2e1711ef) as the real designs are
called: their buffer order, one GEMV xclbin per K, their layouts (`iron.rows`,
`iron.pack_b.bfp16ebs8`) and numerics (bf16 out rounded to nearest even; GEMM on NPU2 a
bfp16-emulated matmul, accumulated in bf16 per K tile). Expected bytes and values are worked
out by hand from the published descriptions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npu import config_from_json
from npu.errors import ModelError
from npu.xrt import XRT, XRTError, packing
from npu.xrt.check import check_kernels
from npu.xrt.iron_pack import (IronGeometry, decode_bfp16ebs8, pack_b_bfp16ebs8,
                               quantize_bfp16, unpack_b_bfp16ebs8)
from npu.xrt.kernels import LinearOps, OpKernel
from npu.xrt.manifest import load_manifest
from npu.xrt.sim_kernels import IRON_ARGS, make_kernel_dir, simulator_for


def test_iron_rows_is_w_row_major_bf16_padded() -> None:
    t = packing.tiling("iron.rows", 3, 3, 2, 4)  # N 3 -> 4, K 3 -> 4
    w = np.array([[1, 2, 3], [-0.0, 5, 6], [7, 8, 9]], dtype=np.float32)
    bits = packing.pack(w, t).view(np.uint16)
    # row n: its k values then a zero; the padding row n = 3 all zero; -0.0 kept (0x8000)
    assert bits.tolist() == [0x3F80, 0x4000, 0x4040, 0, 0x8000, 0x40A0, 0x40C0, 0,
                             0x40E0, 0x4100, 0x4110, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(packing.unpack(packing.pack(w, t), t)[:3, :3], w)


def test_bfp16ebs8_decodes_by_hand_and_unpacks_iron_order() -> None:
    # shared exponent 128: a unit of 2**-5; mantissas 32, -1, 127 -> 1.0, -2**-5, 3.96875
    block = np.array([[128, 32, 255, 127, 0, 0, 0, 0, 0]], dtype=np.uint8)
    assert decode_bfp16ebs8(block).tolist() == [[1.0, -0.03125, 3.96875, 0, 0, 0, 0, 0]]
    g = IronGeometry(k_tile=8, n_tile=4, s=8, t=2, ct_k=8)
    w = (np.arange(32, dtype=np.float32).reshape(4, 8) - 16) / 4  # exact in 8-bit blocks
    np.testing.assert_array_equal(unpack_b_bfp16ebs8(pack_b_bfp16ebs8(w, g), 4, 8, g), w)


def test_quantize_bfp16_keeps_7_bits_under_the_block_peak() -> None:
    x = np.array([[4.0, 1.0, 0.0625, 0.03125, -0.0234375, 3.0, 0, 0]], dtype=np.float32)
    # peak 4.0 (exponent 129): a unit of 2**-4 = 0.0625; 0.03125 is half a unit (ties to
    # even: 0), -0.0234375 is -0.375 units (0); floor takes both down (0 and -1 unit)
    assert quantize_bfp16(x).tolist() == [[4.0, 1.0, 0.0625, 0, 0, 3.0, 0, 0]]
    assert quantize_bfp16(x, "floor").tolist() == [[4.0, 1.0, 0.0625, 0, -0.0625, 3.0, 0, 0]]
    with pytest.raises(ModelError, match="blocks of 8"):
        quantize_bfp16(np.ones((1, 12), dtype=np.float32))


def _cfg():
    return config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                             "intermediate_size": 96, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "num_key_value_heads": 1,
                             "vocab_size": 100, "max_position_embeddings": 64})


def _iron_dir(tmp_path):
    """IRON's GEMV (bf16 W row-major as A, K compiled in) and its GEMM on NPU2 (b_col_maj:
    W row-major as B; bfp16-emulated matmul; bf16 C accumulated per tile_k)."""
    return make_kernel_dir(tmp_path, [_cfg()], ops=("gemv", "gemm"), weights="bf16",
                           layout="iron.rows", args=IRON_ARGS, xclbins="gemv_per_k",
                           gemm_m=8, granule_k=32, granule_n=16, y="bf16",
                           overrides={"gemm": {"bfp16_mmul": True, "round_per_k_tile": True}})


def _ops(kd):
    xrt = XRT(simulator_for(kd, ["npu4"]))
    m = load_manifest(kd / "npu2")
    return xrt, m, [OpKernel(xrt, 0, kd / "npu2", n, m.ops[n]) for n in ("gemv", "gemm")]


def test_iron_gemv_and_gemm_are_called_in_their_designs_order(tmp_path) -> None:
    kd = _iron_dir(tmp_path)
    xrt, m, (gemv, gemm) = _ops(kd)
    # one GEMV xclbin per K (64: q/k/v/o/gate/up/lm_head; 96: down), each its own context
    ks = {s.k: gemv.context(s) for s in m.ops["gemv"].shapes}
    assert sorted(ks) == [64, 96] and ks[64] is not ks[96]
    bufs = {"x": "X", "w": "W", "y": "Y"}
    _, args, _ = gemv.call(m.ops["gemv"].shapes[0], bufs)
    assert args[0] == 3 and args[3:] == ("W", "X", "Y")  # sequence(A, B, C): A the matrix
    _, args, _ = gemm.call(m.ops["gemm"].shapes[0], bufs)
    assert args[3:] == ("X", "W", "Y")  # GEMM's A the activations, B the weight


def test_iron_numerics_gemv_rounds_once_gemm_per_tile_on_bfp16(tmp_path) -> None:
    kd = _iron_dir(tmp_path)
    _, _, (gemv, gemm) = _ops(kd)
    ops = LinearOps(gemv, gemm)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((100, 64)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    dw = ops.upload(w)
    # the simulator's memory groups are per argument: GEMV's w (3) and GEMM's (4) differ,
    # so the weight is on the device once per group
    assert sorted(dw.bos) == [3, 4]
    wb, xb = packing.round_bf16(w), packing.round_bf16(x)
    # GEMV (mv.cc): f32 accumulation, one conv_even rounding to bf16
    np.testing.assert_array_equal(ops.matmul(x[:1], dw),
                                  packing.round_bf16(xb[:1] @ wb.T))
    # GEMM: operands in bfp16 blocks of 8 along K, C kept in bf16 between the K tiles of 32
    xq, wq = quantize_bfp16(xb), quantize_bfp16(wb)
    want = packing.round_bf16(xq[:, :32] @ wq[:, :32].T)
    want = packing.round_bf16(want + xq[:, 32:] @ wq[:, 32:].T)
    np.testing.assert_array_equal(ops.matmul(x, dw), want)
    assert all(r.matched for r in check_kernels(kd, XRT(simulator_for(kd, ["npu4"]))))


def test_a_gemv_kernel_runs_only_its_own_k(tmp_path) -> None:
    kd = _iron_dir(tmp_path)
    xrt, m, (gemv, _) = _ops(kd)
    s64, s96 = (next(s for s in m.ops["gemv"].shapes if s.k == k) for k in (64, 96))
    _, args, _ = gemv.call(s96, {a: gemv.bo(a, 64) for a in "xwy"})
    other, _, _ = gemv.call(s64, {a: gemv.bo(a, 64) for a in "xwy"})
    with pytest.raises(XRTError, match="not one this kernel was built for"):
        xrt.run(other, *args)  # the K=64 xclbin given the K=96 stream


def test_flm_gemm_bfp16_layout_on_npu2(tmp_path) -> None:
    """flm.GEMM on NPU2: B pre-packed as bfp16ebs8 in IRON's order, in the op's rounding."""
    kd = make_kernel_dir(tmp_path, [_cfg()], ops=("gemv", "gemm"), weights="bfp16ebs8",
                         layout="iron.pack_b.bfp16ebs8", mmul=(8, 8, 32), gemm_m=4,
                         granule_k=32, granule_n=16, rounding="floor", y="bf16",
                         overrides={"gemm": {"bfp16_mmul": True}})
    _, _, (gemv, gemm) = _ops(kd)
    ops = LinearOps(gemv, gemm)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((100, 64)).astype(np.float32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    dw = ops.upload(w)
    g = IronGeometry(k_tile=32, n_tile=16, s=8, t=8, ct_k=32)
    wp = np.zeros((112, 64), dtype=np.float32)
    wp[:100] = w
    packed = pack_b_bfp16ebs8(wp, g, "floor")
    np.testing.assert_array_equal(dw.bo.dev, packed)
    # its mmul: A in bfp16 too (floor), one f32 accumulation, one floor rounding to bf16
    wq = unpack_b_bfp16ebs8(packed, 112, 64, g)[:100]
    xq = quantize_bfp16(packing.round_bf16(x), "floor")
    np.testing.assert_array_equal(ops.matmul(x, dw),
                                  packing.round_bf16(xq @ wq.T, "floor"))
    assert all(r.matched for r in check_kernels(kd, XRT(simulator_for(kd, ["npu4"]))))


def _bfp16_s4(m: dict) -> None:
    m["ops"]["gemv"].update(layout="iron.pack_b.bfp16ebs8", mmul=[4, 8, 32])
    m["ops"]["gemv"]["dtype"]["w"] = "bfp16ebs8"


@pytest.mark.parametrize("edit,message", [
    (_bfp16_s4, "s = 8"),
    (lambda m: m["ops"]["gemm"].update(bfp16_mmul=True, granule={"m": 8, "k": 4, "n": 16}),
     "bfp16_mmul is for gemv / gemm with a k granule"),
    (lambda m: m["ops"]["gemv"].update(xclbin=""), None),  # every shape has its own: fine
    (lambda m: m["ops"]["gemv"]["shapes"][0].pop("xclbin"), "needs an xclbin"),
    (lambda m: m["ops"]["gemm"]["shapes"][0].update(m=12), "multiple of its m granule 8"),
])
def test_iron_manifests_are_checked(tmp_path, edit, message) -> None:
    kd = _iron_dir(tmp_path)
    path = kd / "npu2" / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))
    if message is None:
        load_manifest(kd / "npu2")
        return
    with pytest.raises(XRTError, match=message):
        load_manifest(kd / "npu2")
