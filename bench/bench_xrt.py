"""What crosses to the NPU per decode step, on the pyxrt simulator.

A Qwen3-0.6B-shaped model (random weights) runs on the XRT engine over the simulator:
weights are uploaded once at load; per decode step we count the bytes written to and read
from the device against the weight bytes (target: activations only, under 1%), and the
kernel runs per token. (Speed on the simulator means nothing: it is numpy.)

    python bench/bench_xrt.py           # Qwen3-0.6B shapes
    python bench/bench_xrt.py --quick   # small shapes (CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import QUICK, QWEN3_06B, random_weights  # noqa: E402
from npu import config_from_json  # noqa: E402
from npu.xrt import XRT  # noqa: E402
from npu.xrt.engine import XRTEngine  # noqa: E402
from npu.xrt.sim import make_kernel_dir, simulator_for  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (CI)")
    args = ap.parse_args()
    raw = QUICK if args.quick else QWEN3_06B
    kdir = make_kernel_dir(Path(tempfile.mkdtemp()) / "kernel", tile=(16, 64, 64))
    sim = simulator_for(kdir, ["RyzenAI-npu4"])
    t0 = time.perf_counter()
    engine = XRTEngine(config_from_json(raw), random_weights(raw, np.random.default_rng(0)),
                       xrt=XRT(sim), device_index=0, kernel_dir=kdir)
    g = engine.gemm
    print(f"model: {'quick' if args.quick else 'Qwen3-0.6B'} shapes; weights on the device "
          f"{g.weight_bytes / 1e9:.3f} GB (tiled, padded), uploaded in "
          f"{time.perf_counter() - t0:.1f} s")
    engine.prefill("s", list(range(16)))
    for batch in (1, 8):
        ids = [("b", batch, i) for i in range(batch)]
        for sid in ids:
            engine.prefill(sid, list(range(8)))
        in0, out0, runs0 = g.bytes_in, g.bytes_out, g.runs
        engine.decode(ids, [1] * batch)
        bytes_in, bytes_out, runs = g.bytes_in - in0, g.bytes_out - out0, g.runs - runs0
        share = (bytes_in + bytes_out) / g.weight_bytes
        print(f"decode step, batch {batch}: to device {bytes_in / 1e6:8.3f} MB, from device "
              f"{bytes_out / 1e6:8.3f} MB = {100 * share:.3f}% of the weight bytes "
              f"(target < 1%); kernel runs {runs}")
        for sid in ids:
            engine.release(sid)
    layers = engine.config.num_layers
    print(f"kernel runs per token: {4 * layers + 1} (4 per layer: qkv, o, gate+up, down; "
          "1 lm_head)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
