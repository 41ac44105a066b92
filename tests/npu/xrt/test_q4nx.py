"""FastFlowLM's Q4NX blocks (npu.xrt.q4nx) against bytes worked out by hand from the
published layout (amd/IRON iron/operators/flm/q4nx.py and its dequant reference)."""

from __future__ import annotations

import numpy as np
import pytest

from npu.errors import ModelError
from npu.xrt.q4nx import BLOCK_BYTES, pack_q4nx, unpack_q4nx


def _block() -> np.ndarray:
    """W [32, 256]: every group of 32 in-features takes all 16 codes, so its minimum and
    scale come out exact: min -1.0 (out-features 0-15) or -2.0 (16-31), scale 0.125;
    code (k + m + 5 * (m >= 16)) % 16."""
    m = np.arange(32)[:, None]
    k = np.arange(256)[None, :]
    code = (k + m + 5 * (m >= 16)) % 16
    return (np.where(m < 16, -1.0, -2.0) + 0.125 * code).astype(np.float32)


def test_one_block_by_hand() -> None:
    blob = pack_q4nx(_block())
    assert blob.size == BLOCK_BYTES == 5120
    # scales: 8 groups x 32 out-features of bf16 0.125 = 0x3E00, little-endian
    assert blob[:512].reshape(-1, 2).tolist() == [[0x00, 0x3E]] * 256
    # minima, group-major: out-feature m of group g at 512 + 2 (32 g + m); -1.0 = 0xBF80,
    # -2.0 = 0xC000
    mins = blob[512:1024].view(np.uint16).reshape(8, 32)
    assert (mins[:, :16] == 0xBF80).all() and (mins[:, 16:] == 0xC000).all()
    codes = blob[1024:].reshape(2, 256, 8)  # half, in-feature, byte
    # half 0, in-feature 0: byte j = code(2j) | code(2j + 1) << 4 = 2j | (2j + 1) << 4
    assert codes[0, 0].tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    # in-feature 1 shifts every code by one
    assert codes[0, 1].tolist() == [0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB, 0xED, 0x0F]
    # half 1 (out-features 16-31), in-feature 0: codes (2j + 5) % 16 and (2j + 6) % 16
    assert codes[1, 0].tolist() == [0x65, 0x87, 0xA9, 0xCB, 0xED, 0x0F, 0x21, 0x43]
    np.testing.assert_array_equal(unpack_q4nx(blob, 32, 256), _block())


def test_padding_and_rounding_of_the_scale() -> None:
    # W [1, 1] = 3.0, padded to one block: group 0 of out-feature 0 spans 0..3, so min 0
    # and scale 3 / 15 = 0.2 -> bf16 0x3E4D (to nearest even); 3.0 is code round(14.985) =
    # 15; every other group and out-feature is zero: scale 0, min 0, codes 0
    blob = pack_q4nx(np.array([[3.0]], dtype=np.float32))
    want = np.zeros(BLOCK_BYTES, dtype=np.uint8)
    want[0:2] = [0x4D, 0x3E]
    want[1024] = 0x0F
    np.testing.assert_array_equal(blob, want)


def test_blocks_go_row_by_row_and_the_minimum_is_never_above_a_weight() -> None:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 300)).astype(np.float32)  # 2 x 2 blocks once padded
    blob = pack_q4nx(w)
    assert blob.size == 4 * BLOCK_BYTES
    got = unpack_q4nx(blob, 40, 300)
    ones = np.ones((32, 256), dtype=np.float32)  # a constant group: scale 0, exact
    np.testing.assert_array_equal(unpack_q4nx(pack_q4nx(ones), 32, 256), ones)
    # each weight within half a step of its group's 16 levels (bf16 scale: 1% slack)
    groups = np.pad(w, ((0, 24), (0, 212))).reshape(64, 16, 32)
    half_step = (groups.max(-1) - groups.min(-1)) / 15 / 2 * 1.01 + 1e-3
    err = np.abs(np.pad(got - w, ((0, 24), (0, 212)))).reshape(64, 16, 32).max(-1)
    assert (err <= half_step).all()
    # block (row 0, column 1) holds in-features 256.. of out-features 0-31: its first
    # minimum is that of out-feature 0's in-features 256-287
    mins = blob[BLOCK_BYTES + 512 : BLOCK_BYTES + 1024].view(np.uint16)
    lo = (mins[0].astype(np.uint32) << 16).view(np.float32)
    assert lo <= w[0, 256:288].min() and lo > w[0, 256:288].min() - 0.02
    with pytest.raises(ModelError, match="is 20480 bytes, not 15359"):
        unpack_q4nx(blob[:5120 * 3 - 1], 40, 300)


def test_linear_ops_read_q4nx_weights(tmp_path) -> None:
    """gemv / gemm on a flm.q4nx kernel directory: what numpy computes from the
    dequantised Q4NX weight (rounded toward minus infinity, as the cores do), and npu-check
    passes on it; granules that are not whole blocks are refused."""
    import json

    from npu import config_from_json
    from npu.xrt import XRT, XRTError
    from npu.xrt.bf16 import round_bf16
    from npu.xrt.check import check_kernels
    from npu.xrt.kernels import LinearOps, OpKernel
    from npu.xrt.manifest import load_manifest
    from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

    cfg = config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                            "intermediate_size": 96, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "vocab_size": 100, "max_position_embeddings": 64})
    kd = make_kernel_dir(tmp_path / "k", [cfg], ops=("gemv", "gemm"), weights="q4nx",
                         gemm_m=4, granule_k=256, rounding="floor")
    xrt = XRT(simulator_for(kd, ["npu4"]))
    m = load_manifest(kd / "npu2")
    ops = LinearOps(*(OpKernel(xrt, 0, kd / "npu2", n, m.ops[n]) for n in ("gemv", "gemm")))
    rng = np.random.default_rng(6)
    w = rng.standard_normal((100, 64)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    dw = ops.upload(w)
    assert dw.bo.size() == 128 * 256 * 5 // 8  # N 100 -> 128, K 64 -> 256, 5 bits each
    wq = round_bf16(unpack_q4nx(pack_q4nx(w), 100, 64), "floor")
    want = round_bf16(x) @ wq.T
    np.testing.assert_allclose(ops.matmul(x, dw), want, rtol=1e-5, atol=1e-5)
    assert all(r.matched for r in check_kernels(kd, XRT(simulator_for(kd, ["npu4"]))))
    path = kd / "npu2" / "manifest.json"
    bad = json.loads(path.read_text())
    bad["ops"]["gemv"]["granule"]["k"] = 64
    path.write_text(json.dumps(bad))
    with pytest.raises(XRTError, match="flm.q4nx is for gemv / gemm"):
        load_manifest(kd / "npu2")
