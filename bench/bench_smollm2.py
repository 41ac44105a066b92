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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peer import op_times  # noqa: E402  (a step's time by kind of operation)


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
    ms = op_times(lambda t: eng.decode(["p"], [t]), list(range(2000, 2000 + steps)))
    total = sum(ms.values())
    print(f"  of a step: linear layers {ms['linear']:.1f} ms, the rest "
          f"{total - ms['linear']:.1f} ms (linear ratio {ms['linear'] / total:.2f})")


if __name__ == "__main__":
    main()
