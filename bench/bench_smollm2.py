"""The default model on the CPU engine: load time, prefill and decode tokens/s, and where a
decode step's time goes (linear layers vs the rest).

    .venv/bin/python bench/bench_smollm2.py [--quick]

The side-by-side comparison with llama.cpp on the same file is issue 14's bench/bench_peer.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu import load_model  # noqa: E402
from npu.engine import linear as linear_mod  # noqa: E402


def main() -> None:
    quick = "--quick" in sys.argv
    start = time.perf_counter()
    model = load_model("smollm2-135m")
    print(f"load: {time.perf_counter() - start:.1f} s, weights {model.engine.weight_bytes / 1e6:.0f}"
          f" MB")
    eng = model.engine
    prompt = list(range(1000, 1000 + (16 if quick else 128)))
    t = time.perf_counter()
    logits = eng.prefill("p", prompt)
    dt = time.perf_counter() - t
    print(f"prefill {len(prompt)} tokens: {len(prompt) / dt:.0f} tok/s")
    steps = 8 if quick else 64
    tok = int(np.argmax(logits))
    t = time.perf_counter()
    for _ in range(steps):
        tok = int(np.argmax(eng.decode(["p"], [tok])[0]))
    dt = time.perf_counter() - t
    print(f"decode batch 1: {steps / dt:.1f} tok/s ({dt / steps * 1e3:.1f} ms a token)")
    spent = [0.0]
    calls = [linear_mod.CpuLinear.__call__, linear_mod.ReferenceLinear.__call__]

    def timed(orig):
        def wrapper(self, x):
            t0 = time.perf_counter()
            try:
                return orig(self, x)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper

    linear_mod.CpuLinear.__call__ = timed(calls[0])
    linear_mod.ReferenceLinear.__call__ = timed(calls[1])
    t = time.perf_counter()
    for _ in range(steps):
        tok = int(np.argmax(eng.decode(["p"], [tok])[0]))
    dt = time.perf_counter() - t
    linear_mod.CpuLinear.__call__, linear_mod.ReferenceLinear.__call__ = calls
    print(f"  of a step: linear layers {spent[0] / steps * 1e3:.1f} ms, the rest "
          f"{(dt - spent[0]) / steps * 1e3:.1f} ms (linear ratio {spent[0] / dt:.2f})")


if __name__ == "__main__":
    main()
