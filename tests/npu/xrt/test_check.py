"""npu-check against the simulator: every linear shape launched once and compared with
numpy; a kernel that computes something else is reported off, by how much."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from npu import config_from_json
from npu.xrt import XRT
from npu.xrt.check import check_kernels, main, report
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

CFG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
       "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
       "vocab_size": 100, "max_position_embeddings": 64}


def _kdir(tmp_path, **kw):
    return make_kernel_dir(tmp_path / "k", [config_from_json(CFG)], ops=("gemv", "gemm"),
                           gemm_m=4, granule_k=32, **kw)


def test_every_linear_shape_matches_on_the_simulator(tmp_path, capsys) -> None:
    kd = _kdir(tmp_path, weights="bfp16ebs8", y="bf16")
    results = check_kernels(kd, XRT(simulator_for(kd, ["npu4"])))
    assert {r.op for r in results} == {"gemv", "gemm"}
    assert all(r.matched and r.gbps > 0 for r in results), report(results)
    assert main(["--kernel-dir", str(kd), "--simulate"]) == 0
    assert "shapes matched numpy" in capsys.readouterr().out
    # the same through the command line a user types (its own process)
    cli = subprocess.run([sys.executable, "-m", "deployments.launch.cli", "npu-check",
                          "--kernel-dir", str(kd), "--simulate"], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and "shapes matched numpy" in cli.stdout, cli.stderr


def test_a_kernel_that_computes_wrong_is_reported_off(tmp_path) -> None:
    kd = _kdir(tmp_path, weights="bf16")
    sim = simulator_for(kd, ["npu4"])
    for key, (n_args, fn) in list(sim.kernels.items()):
        def doubled(*args, fn=fn):
            nbytes = fn(*args)
            y = args[-1].dev.view(np.float32)
            y *= 2  # a kernel off by a factor of two
            return nbytes

        sim.kernels[key] = (n_args, doubled)
    results = check_kernels(kd, XRT(sim))
    assert results and not any(r.matched for r in results)
    assert all(0.9 < r.max_rel_err < 1.1 for r in results)
    assert "0 of" in report(results)


def test_a_missing_or_incomplete_kernel_dir_is_named_and_fails(tmp_path, capsys) -> None:
    # each was a traceback (FileNotFoundError from the simulator), or "0 of 0 shapes
    # matched numpy" with exit status 0 when no op could open
    missing = main(["--kernel-dir", str(tmp_path / "none"), "--simulate"])
    assert missing == 2 and "kernel directory" in capsys.readouterr().err
    kd = _kdir(tmp_path, weights="bf16")
    (kd / "npu2" / "flm.xclbin").unlink()
    assert main(["--kernel-dir", str(kd), "--simulate"]) == 1
    out = capsys.readouterr().out
    assert "cannot open" in out and "flm.xclbin" in out and "could not run" in out
    kd = _kdir(tmp_path / "2", weights="bf16")
    (kd / "npu2" / "gemv_0.bin").unlink()
    assert main(["--kernel-dir", str(kd), "--simulate"]) == 1
    assert "cannot read gemv_0.bin" in capsys.readouterr().out
