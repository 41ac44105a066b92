"""Ours against llama.cpp on the same GGUF files, same thread count, in one run.

For each file, two child processes (one per side, so each starts with the memory free) each
measure: decode tokens/s for one sequence after a 128-token prompt; prefill tokens/s for a
512-token prompt; and (ours) aggregate decode tokens/s for 8 sequences decoded together
(each at the same 128-token position). Printed: each side's figures and the ratios
ours / llama.cpp, and our decode's weight bytes per second against this machine's memory
read bandwidth (a float32 matrix-vector product over 1 GiB, measured in the same run).

Files: the default SmolLM2-135M-Instruct (Q4_1), and random-weight Qwen3-0.6B- and
Llama-3.1-8B-shaped files in Q4_0 and Q8_0 (bench/gguf_shapes.py writes them once into the
cache directory; the 8B ones are 4.2 and 8.5 GB).

    .venv/bin/python bench/bench_peer.py                # every file (about 15 minutes)
    .venv/bin/python bench/bench_peer.py smollm2 qwen3-0.6b-Q4_0   # some of them
    .venv/bin/python bench/bench_peer.py --quick        # SmolLM2, few tokens, ours only

`make bench-peer` installs llama-cpp-python first when the venv lacks it. Without it the
script prints our side only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

FILES = ("smollm2", "qwen3-0.6b-Q4_0", "qwen3-0.6b-Q8_0", "llama-8b-Q4_0", "llama-8b-Q8_0")
BATCH = 8


def model_path(name: str) -> Path:
    if name == "smollm2":
        from npu.load.model import default_model_path

        return default_model_path()
    from gguf_shapes import shaped_gguf

    shape, qtype = name.rsplit("-", 1)
    return shaped_gguf(shape, qtype)


def tokens(n: int, seed: int) -> list[int]:
    """n token ids from the common part of the vocabularies (all files here have 49,152)."""
    return np.random.default_rng(seed).integers(1000, 40000, n).tolist()


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def measure_ours(path: Path, threads: int, prompt: int, steps: int, prefill: int) -> dict:
    from threadpoolctl import threadpool_limits

    from npu import load_model

    threadpool_limits(threads)
    model = load_model(path)
    eng = model.engine
    eng.set_threads(threads)
    out: dict = {"weight_bytes": eng.weight_bytes}
    embed = eng.embed.matrix
    # bytes a decode step reads: every weight except the embedding (one row of it), unless
    # the head is the embedding itself
    head_tied = eng.lm_head.matrix is embed
    out["step_bytes"] = eng.weight_bytes - (0 if head_tied else embed.nbytes)
    eng.prefill("warm", tokens(16, 9))
    eng.release("warm")

    eng.prefill("d", tokens(prompt, 1))
    step_ids = tokens(steps + 2, 2)
    for t in step_ids[:2]:
        eng.decode(["d"], [t])
    start = time.perf_counter()
    for t in step_ids[2:]:
        eng.decode(["d"], [t])
    out["decode"] = _rate(steps, time.perf_counter() - start)

    out["op_ms"] = op_times(lambda t: eng.decode(["d"], [t]), tokens(max(4, steps // 2), 6))

    for i in range(1, BATCH):
        eng.fork("d", f"d{i}")
    seqs = ["d"] + [f"d{i}" for i in range(1, BATCH)]
    eng.decode(seqs, tokens(BATCH, 3))
    batch_steps = max(2, steps // 2)
    start = time.perf_counter()
    for s in range(batch_steps):
        eng.decode(seqs, tokens(BATCH, 4 + s))
    out["decode_batch"] = _rate(BATCH * batch_steps, time.perf_counter() - start)
    for sid in seqs:
        eng.release(sid)

    ids = tokens(prefill, 5)
    start = time.perf_counter()
    eng.prefill("p", ids)
    out["prefill"] = _rate(prefill, time.perf_counter() - start)
    return out


def op_times(step, ids: list[int]) -> dict[str, float]:
    """Milliseconds per `step(token)` by kind of operation: each kind's methods timed by a
    wrapper (its overhead, about a microsecond a call, lands in the kind); "other" is the
    rest (numpy between them, Python)."""
    from npu.engine import linear, ops

    kinds = {"linear": [(linear.CpuLinear, "__call__"), (linear.ReferenceLinear, "__call__")],
             "attention": [(ops.NumpyOps, "attend_new"), (ops.KernelOps, "attend_new")],
             "norms": [(ops.NumpyOps, "rms_norm"), (ops.KernelOps, "rms_norm")],
             "rope": [(ops.NumpyOps, "qk_rope"), (ops.KernelOps, "qk_rope")],
             "glu": [(ops.NumpyOps, "gated"), (ops.KernelOps, "gated")],
             "embedding": [(linear.Embedding, "__call__")]}
    spent = dict.fromkeys(kinds, 0.0)
    saved = []

    def timed(fn, kind):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[kind] += time.perf_counter() - t0
        return wrapper

    for kind, places in kinds.items():
        for owner, attr in places:
            fn = owner.__dict__[attr]
            saved.append((owner, attr, fn))
            setattr(owner, attr, timed(fn, kind))
    try:
        start = time.perf_counter()
        for t in ids:
            step(t)
        total = time.perf_counter() - start
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
    out = {k: v / len(ids) * 1e3 for k, v in spent.items()}
    out["other"] = total / len(ids) * 1e3 - sum(out.values())
    return out


def measure_llama(path: Path, threads: int, prompt: int, steps: int, prefill: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=max(1024, prompt + steps + 8, prefill + 8),
                n_batch=512, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    out: dict = {}
    llm.eval(tokens(16, 9))
    llm.reset()
    llm.eval(tokens(prompt, 1))
    step_ids = tokens(steps + 2, 2)
    for t in step_ids[:2]:
        llm.eval([t])
    start = time.perf_counter()
    for t in step_ids[2:]:
        llm.eval([t])
    out["decode"] = _rate(steps, time.perf_counter() - start)
    llm.reset()
    ids = tokens(prefill, 5)
    start = time.perf_counter()
    llm.eval(ids)
    out["prefill"] = _rate(prefill, time.perf_counter() - start)
    return out


def read_bandwidth(threads: int) -> float:
    """Bytes/s of a float32 matrix-vector product over 1 GiB (BLAS, `threads` threads)."""
    from threadpoolctl import threadpool_limits

    m = np.ones((1 << 14, 1 << 14), dtype=np.float32)
    x = np.ones(1 << 14, dtype=np.float32)
    with threadpool_limits(threads):
        m @ x
        best = min(_timed(lambda: m @ x) for _ in range(5))
    return m.nbytes / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child(side: str, name: str, args) -> dict | None:
    cmd = [sys.executable, __file__, "--child", side, name, "--threads", str(args.threads),
           "--prompt", str(args.prompt), "--steps", str(args.steps),
           "--prefill", str(args.prefill)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        print(f"  {side} failed on {name}: {done.stderr.strip()[-800:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def has_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", help=f"some of {', '.join(FILES)} (default: all)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "FILE"))
    args = ap.parse_args()
    if args.child:
        side, name = args.child
        fn = measure_ours if side == "ours" else measure_llama
        print(json.dumps(fn(model_path(name), args.threads, args.prompt, args.steps,
                            args.prefill)))
        return
    if args.quick:
        args.prompt, args.steps, args.prefill = 16, 4, 32
    names = args.files or (["smollm2"] if args.quick else list(FILES))
    unknown = set(names) - set(FILES)
    if unknown:
        ap.error(f"unknown files {sorted(unknown)}; known: {', '.join(FILES)}")
    peer = has_llama_cpp() and not args.quick
    bw = read_bandwidth(args.threads)
    print(f"threads {args.threads}; memory read bandwidth (GEMV over 1 GiB): {bw / 1e9:.1f} GB/s")
    print(f"decode after a {args.prompt}-token prompt ({args.steps} steps); prefill of "
          f"{args.prefill} tokens; batch {BATCH} = aggregate tok/s of {BATCH} sequences")
    if not peer:
        print("(llama.cpp: " + ("not run in --quick)" if args.quick else
                                "llama-cpp-python is not installed; `make bench-peer`)"))
    for name in names:
        path = model_path(name)
        print(f"\n{name}: {path.name}, {path.stat().st_size / 1e6:.0f} MB", flush=True)
        ours = child("ours", name, args)
        theirs = child("llama", name, args) if peer else None
        if ours:
            gbs = ours["step_bytes"] * ours["decode"] / 1e9
            print(f"  ours      decode {ours['decode']:7.1f} tok/s ({gbs:.1f} GB/s = "
                  f"{gbs * 1e9 / bw:.2f} of the bandwidth)  prefill {ours['prefill']:7.1f} "
                  f"tok/s  batch {BATCH} {ours['decode_batch']:7.1f} tok/s (ratio to one "
                  f"{ours['decode_batch'] / ours['decode']:.2f})")
            print("  ours, a decode step's ms by kind: " + ", ".join(
                f"{k} {v:.2f}" for k, v in ours["op_ms"].items()))
        if theirs:
            print(f"  llama.cpp decode {theirs['decode']:7.1f} tok/s"
                  f"{'':36}prefill {theirs['prefill']:7.1f} tok/s")
        if ours and theirs:
            print(f"  ours / llama.cpp: decode {ours['decode'] / theirs['decode']:.2f}, "
                  f"prefill {ours['prefill'] / theirs['prefill']:.2f}", flush=True)


if __name__ == "__main__":
    main()
