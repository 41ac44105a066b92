"""IRON flm.GEMM's B order (npu.xrt.iron_pack) against streams worked out by hand from the
published description (amd/IRON iron/operators/flm/packing.py at 2e1711ef), not from our
code: small matrices whose values name their place, padding, negative zero, the last block,
rounding and saturation."""

from __future__ import annotations

import numpy as np
import pytest

from npu.errors import ModelError
from npu.xrt.iron_pack import IronGeometry, pack_b_bf16, pack_b_bfp16ebs8
from npu.xrt.packing import from_bf16


def _named(n: int, k: int) -> np.ndarray:
    """W [N, K] with W[n, k] = 10 k + n: each packed value says where it came from."""
    return (10 * np.arange(k)[None, :] + np.arange(n)[:, None]).astype(np.float32)


@pytest.mark.parametrize("geometry,want", [
    # one stripe, one K block, one slice: per t-group tb, rows i, then s x t row-major
    (IronGeometry(k_tile=4, n_tile=4, s=2, t=2, ct_k=4),
     [0, 1, 10, 11, 20, 21, 30, 31, 2, 3, 12, 13, 22, 23, 32, 33]),
    # two K slices of 2: each slice's t-groups before the next slice
    (IronGeometry(k_tile=4, n_tile=4, s=1, t=2, ct_k=2),
     [0, 1, 10, 11, 2, 3, 12, 13, 20, 21, 30, 31, 22, 23, 32, 33]),
])
def test_bf16_order(geometry: IronGeometry, want: list[int]) -> None:
    got = from_bf16(pack_b_bf16(_named(4, 4), geometry))
    assert got.tolist() == want


def test_bf16_pads_with_zeros_and_keeps_negative_zero() -> None:
    w = _named(3, 3)
    w[0, 0] = -0.0
    g = IronGeometry(k_tile=2, n_tile=2, s=2, t=1, ct_k=2)  # K 3 -> 4, N 3 -> 4
    bits = pack_b_bf16(w, g)
    # stripe n0-1: K block k0-1 (n0: k0 k1; n1: k0 k1), block k2-3 (k3 is padding);
    # stripe n2-3 (n3 is padding) likewise
    assert from_bf16(bits).tolist() == [0, 10, 1, 11, 20, 0, 21, 0, 2, 12, 0, 0, 22, 0, 0, 0]
    assert bits[0] == 0x8000 and bits[5] == 0x0000


def test_bfp16ebs8_blocks_by_hand() -> None:
    g = IronGeometry(k_tile=8, n_tile=2, s=8, t=1, ct_k=8)
    w = np.array([[1, -1, 0.5, -0.0, 2, 0, 1.046875, -1.046875],
                  [3, 0, 0, 0, 0, 0, 0, 2.0 ** -30]], dtype=np.float32)
    # shared exponent 128 (2.0 and 3.0); 1.0 = 0x800000 >> 18 = 32; 0.5 >> 19 = 16; 2.0 >> 17
    # = 64; 1.046875 = 0x860000 >> 18 = 33.5: 34 to even, 33 floor; -33.5: -34 both ways;
    # 3.0 = 0xC00000 >> 17 = 96; 2**-30 shifted 48 places is 0; zeros have exponent 0, 128
    # below the shared one (32 or more: only the sign is left): 0.0 is 0 and -0.0 is -1
    # (IRON's f32_to_bfp16ebs8, in either rounding)
    even = [128, 32, 224, 16, 255, 64, 0, 34, 222, 128, 96, 0, 0, 0, 0, 0, 0, 0]
    floor = even[:7] + [33] + even[8:]
    assert pack_b_bfp16ebs8(w, g).tolist() == even
    assert pack_b_bfp16ebs8(w, g, "floor").tolist() == floor


def test_bfp16ebs8_pads_the_last_block_and_saturates() -> None:
    g = IronGeometry(k_tile=8, n_tile=2, s=8, t=1, ct_k=8)
    # K 5 -> 8, N 1 -> 2: exponent of 5.0 is 129; 1 >> 19 = 16, 2 >> 18 = 32, 3 = 48,
    # 4 >> 17 = 64, 5 = 0xA00000 >> 17 = 80; the padding out-feature is all zero
    got = pack_b_bfp16ebs8(np.array([[1, 2, 3, 4, 5]], dtype=np.float32), g)
    assert got.tolist() == [129, 16, 32, 48, 64, 80, 0, 0, 0] + [0] * 9
    # 1.9921875 = 0xFF0000 >> 17 = 127.5 rounds to 128, which saturates to 127
    top = np.zeros((1, 8), dtype=np.float32)
    top[0, 0] = 1.9921875
    assert pack_b_bfp16ebs8(top, g)[:2].tolist() == [127, 127]


def test_bfp16ebs8_interleaves_out_features_in_order() -> None:
    # t = 2: within a K slice the 8 in-features of n0, then of n1 (t-major), then the next
    # t-group; values 10 k + n, exponents per block
    g = IronGeometry(k_tile=8, n_tile=4, s=8, t=2, ct_k=8)
    got = pack_b_bfp16ebs8(_named(4, 8), g).reshape(4, 9)
    assert got[:, 0].tolist() == [133, 133, 133, 133]  # 70..73 have exponent 6 (+127)
    # block of n = 1: 1, 11, ..., 71 at 2**(133 - 133) = 1 a unit: mantissa = value
    assert got[1, 1:].view(np.int8).tolist() == [1, 11, 21, 31, 41, 51, 61, 71]
    assert got[2, 1:].view(np.int8).tolist() == [2, 12, 22, 32, 42, 52, 62, 72]


def test_geometry_is_checked() -> None:
    with pytest.raises(ModelError, match="multiple of ct_k"):
        pack_b_bf16(_named(4, 4), IronGeometry(k_tile=4, n_tile=4, s=2, t=2, ct_k=3))
    with pytest.raises(ModelError, match="s = 8"):
        pack_b_bfp16ebs8(_named(4, 4), IronGeometry(k_tile=4, n_tile=4, s=2, t=2, ct_k=4))


def test_linear_ops_on_the_iron_layout_compute_what_bf16_rows_do(tmp_path) -> None:
    """A kernel directory whose gemv / gemm read IRON's order: the same numbers as the
    bf16.v1 tiles, from differently ordered bytes, and npu-check passes on it."""
    from npu import config_from_json
    from npu.xrt import XRT
    from npu.xrt.check import check_kernels
    from npu.xrt.kernels import LinearOps, OpKernel
    from npu.xrt.manifest import load_manifest
    from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

    cfg = config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                            "intermediate_size": 96, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "vocab_size": 100, "max_position_embeddings": 64})
    rng = np.random.default_rng(5)
    w = rng.standard_normal((100, 64)).astype(np.float32)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    out, packed = {}, {}
    for layout in ("bf16.v1", "iron.pack_b"):
        kd = make_kernel_dir(tmp_path / layout, [cfg], ops=("gemv", "gemm"), weights="bf16",
                             gemm_m=4, granule_k=32, layout=layout, mmul=(2, 2, 16))
        sim = simulator_for(kd, ["npu4"])
        xrt = XRT(sim)
        m = load_manifest(kd / "npu2")
        ops = LinearOps(*(OpKernel(xrt, 0, kd / "npu2", n, m.ops[n]) for n in ("gemv", "gemm")))
        dw = ops.upload(w)
        packed[layout] = dw.bo.dev.copy()
        out[layout] = ops.matmul(x, dw)
        assert all(r.matched for r in check_kernels(kd, XRT(simulator_for(kd, ["npu4"]))))
    np.testing.assert_array_equal(out["iron.pack_b"], out["bf16.v1"])
    assert packed["iron.pack_b"].size == packed["bf16.v1"].size
    assert not np.array_equal(packed["iron.pack_b"], packed["bf16.v1"])


def test_the_iron_layout_is_checked_in_the_manifest(tmp_path) -> None:
    import json

    from npu.xrt import XRTError
    from npu.xrt.manifest import load_manifest

    folder = tmp_path / "npu2"
    folder.mkdir()
    op = {"xclbin": "k.xclbin", "dtype": {"x": "bf16", "w": "bf16", "y": "bf16"},
          "layout": "iron.pack_b", "granule": {"n": 32, "k": 32}, "args": ["x", "w", "y"],
          "shapes": [{"insts": "gemv.bin", "m": 1, "k": 32, "n": 32}]}
    for mmul in ([], [2, 2, 24], [3, 2, 16]):
        (folder / "manifest.json").write_text(json.dumps(
            {"version": 2, "generation": "npu2", "ops": {"gemv": {**op, "mmul": mmul}}}))
        with pytest.raises(XRTError, match="iron.pack_b is for gemv / gemm"):
            load_manifest(folder)
