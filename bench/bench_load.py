"""Loading GGUF files: time, memory against issue 13's bounds, and a first decode.

    .venv/bin/python bench/bench_load.py [--quick] [shape:format ...]

Default files: smollm2-135m (the default model), qwen3-0.6b:Q4_0 and llama-8b:Q4_0 (random
weights of those shapes, bench/gguf_shapes.py; any of its formats, e.g. llama-8b:Q4_K_M).
Each is loaded in a fresh process, which reports: load time; peak RSS while loading against
(quantized weight bytes, the file's or as held if more (k-quants are converted), + the
largest tensor in float32 + 300 MB; the KV cache is empty then); RSS after load against
1.2x the weights as held; decode tokens/s at batch 1 after a short prompt.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(spec: str, steps: int) -> dict:
    """In this process: load the model `spec` and measure it."""
    import numpy as np
    from npu import load_model
    from npu.load.gguf_header import read_header
    from npu.load.loader import default_model_path

    if spec == "smollm2-135m":
        path = default_model_path()
    else:
        from bench.gguf_shapes import shaped_gguf

        path = shaped_gguf(*spec.split(":"))
    tensors = read_header(path).tensors
    file_bytes = sum(t.n_bytes for t in tensors)
    largest = max(int(np.prod(t.shape)) for t in tensors) * 4
    base = _rss()
    start = time.perf_counter()
    model = load_model(path)
    load_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    after = _rss() - base
    eng = model.engine
    logits = eng.prefill("b", list(range(100, 116)))
    tok = int(np.argmax(logits))
    t = time.perf_counter()
    for _ in range(steps):
        tok = int(np.argmax(eng.decode(["b"], [tok])[0]))
    dt = time.perf_counter() - t
    return {"spec": spec, "file_mb": file_bytes / 1e6, "held_mb": eng.weight_bytes / 1e6,
            "load_s": load_s, "peak_mb": peak / 1e6,
            "peak_bound_mb": (max(file_bytes, eng.weight_bytes) + largest + 300e6) / 1e6,
            "after_mb": after / 1e6,
            "after_bound_mb": 1.2 * eng.weight_bytes / 1e6, "tok_s": steps / dt}


def main() -> None:
    if "--child" in sys.argv:
        spec, steps = sys.argv[2], int(sys.argv[3])
        print(json.dumps(measure(spec, steps)))
        return
    quick = "--quick" in sys.argv
    specs = [a for a in sys.argv[1:] if not a.startswith("--")] or (
        ["smollm2-135m"] if quick else ["smollm2-135m", "qwen3-0.6b:Q4_0", "llama-8b:Q4_0"])
    steps = 4 if quick else 16
    print(f"{'model':18} {'file MB':>8} {'held MB':>8} {'load s':>7} {'peak MB':>8} "
          f"{'bound':>7} {'after MB':>8} {'bound':>7} {'tok/s':>6}")
    for spec in specs:
        out = subprocess.run([sys.executable, __file__, "--child", spec, str(steps)],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            sys.exit(out.stderr)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{spec:18} {r['file_mb']:8.0f} {r['held_mb']:8.0f} {r['load_s']:7.1f} "
              f"{r['peak_mb']:8.0f} {r['peak_bound_mb']:7.0f} {r['after_mb']:8.0f} "
              f"{r['after_bound_mb']:7.0f} {r['tok_s']:6.1f}")
        print(f"  ratio peak/bound {r['peak_mb'] / r['peak_bound_mb']:.2f} (target <= 1), "
              f"after/bound {r['after_mb'] / r['after_bound_mb']:.2f} (target <= 1)")


if __name__ == "__main__":
    main()
