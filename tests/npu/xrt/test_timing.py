"""The simulator's timing model reads each kernel's bandwidth from its manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npu import config_from_json
from npu.xrt import XRT
from npu.xrt.kernels import LinearOps, OpKernel
from npu.xrt.manifest import load_manifest
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for
from npu.xrt.timing import TimingModel


def _seconds(tmp_path, gbps: float | None) -> tuple[float, int, int]:
    cfg = config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                            "intermediate_size": 96, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "vocab_size": 100, "max_position_embeddings": 64})
    kd = make_kernel_dir(tmp_path, [cfg], ops=("gemv",), weights="bf16", granule_k=32)
    path = kd / "npu2" / "manifest.json"
    if gbps is not None:
        m = json.loads(path.read_text())
        m["ops"]["gemv"]["gbps"] = gbps
        path.write_text(json.dumps(m))
    sim = simulator_for(kd, ["npu4"], timing=TimingModel(launch_us=100, gbps=60))
    op = OpKernel(XRT(sim), 0, kd / "npu2", "gemv", load_manifest(kd / "npu2").ops["gemv"])
    ops = LinearOps(op, None)
    w = ops.upload(np.ones((100, 64), dtype=np.float32))
    before = sim.clock.seconds
    ops.matmul(np.ones((1, 64), dtype=np.float32), w)
    return sim.clock.seconds - before, sim.clock.bytes_read, sim.clock.launches


def test_a_kernels_bandwidth_comes_from_its_manifest(tmp_path) -> None:
    default, nbytes, launches = _seconds(tmp_path / "a", None)
    slow, nbytes2, _ = _seconds(tmp_path / "b", 25.0)
    assert launches == 1 and nbytes == nbytes2 > 0
    assert default == pytest.approx(100e-6 + nbytes / 60e9)
    assert slow == pytest.approx(100e-6 + nbytes / 25e9)
