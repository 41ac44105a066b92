"""The linear-layer kernels side by side: ours (npu/engine/cpu_kernels.c, straight from the
GGUF blocks) against torch's CPU weight-only kernels and numpy's float32 BLAS, on the same
shapes in one run, for one row of x (decode), 8 rows (batched decode) and 128 rows (prompt).

Issue 14 measured torch's kernels against numpy float32 GEMV on 16 4096x4096 matrices
(torch bf16 0.75x, `_weight_int8pack_mm` 1.9x, `_weight_int4pack_mm_for_cpu` 3.5x); this
puts ours beside them. Printed: milliseconds for one pass over all the matrices (the median of
the rounds, the variants taking turns), the speed-up over numpy float32 and the weight
bytes read per second.

Then the prompt attention (one layer's, over an f16 cache): the kernel that reads every
cached key once per query row (fk_attend, each row its own task) against the blocked one
(fk_attend_prompt: each key once per block of up to 32 rows, online softmax), at SmolLM2's and
Qwen3-0.6B's heads, one thread and `--threads`, in interleaved rounds.

    .venv/bin/python bench/bench_kernels.py            # 16 matrices 4096 x 4096, 2 threads
    .venv/bin/python bench/bench_kernels.py --quick    # 2 matrices 1024 x 1024
    .venv/bin/python bench/bench_kernels.py --attention-only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu.engine.linear import LinearFactory  # noqa: E402
from npu.engine.quant import QMatrix, QT  # noqa: E402


def _torch_variants(weights: list[np.ndarray], threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    out = {}
    bf16 = [torch.from_numpy(w).to(torch.bfloat16) for w in weights]
    out["torch bf16"] = (lambda x: [torch.from_numpy(x).to(torch.bfloat16) @ w.T for w in bf16],
                         sum(w.numel() * 2 for w in bf16))
    int8 = []
    for w in weights:
        scale = np.abs(w).max(axis=1) / 127
        codes = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
        int8.append((torch.from_numpy(codes), torch.from_numpy(scale.astype(np.float32))))
    # bf16 activations and scales: their fast path (float32 ones run about 10x slower here)
    int8 = [(c, s.to(torch.bfloat16)) for c, s in int8]
    out["torch int8pack"] = (
        lambda x: [torch.ops.aten._weight_int8pack_mm(torch.from_numpy(x).to(torch.bfloat16),
                                                      c, s)
                   for c, s in int8], sum(c.numel() + 2 * s.numel() for c, s in int8))
    int4 = []
    for w in weights:
        rows, cols = w.shape
        g = w.reshape(rows, cols // 32, 32)
        lo, hi = g.min(-1), g.max(-1)
        scale = np.maximum(hi - lo, 1e-8) / 15
        codes = np.clip(np.rint((g - lo[..., None]) / scale[..., None]), 0, 15)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(codes.reshape(rows, cols).astype(np.int32)), 1)
        # scales and zeros [groups, rows, 2]: value = (code - 8) * scale + zero
        sz = np.stack([scale.T, (lo + 8 * scale).T], axis=-1).astype(np.float32)
        int4.append((packed, torch.from_numpy(np.ascontiguousarray(sz)).to(torch.bfloat16)))
    out["torch int4pack g32"] = (
        lambda x: [torch.ops.aten._weight_int4pack_mm_for_cpu(
            torch.from_numpy(x).to(torch.bfloat16), p, 32, sz)
            for p, sz in int4], sum(p.numel() + sz.numel() * 2 for p, sz in int4))
    return out


def attention(threads: int, quick: bool) -> None:
    """Row-at-a-time against blocked prompt attention, ms per layer."""
    from npu.engine.cpu_kernels import kernels
    from npu.engine.linear import Threads
    from npu.engine.ops import KernelOps, NumpyOps

    lib = kernels()
    rng = np.random.default_rng(1)
    print("\nprompt attention of one layer, f16 cache, ms (median of rounds, interleaved); "
          "ratio: row-at-a-time / blocked")
    for name, (nq, nkv, dim) in (("SmolLM2", (9, 3, 64)), ("Qwen3-0.6B", (16, 8, 128))):
        for n in (128,) if quick else (512, 2048):
            blocks = n // 16 + 1
            K = rng.standard_normal((blocks, nkv, 16, dim)).astype(np.float16)
            V = rng.standard_normal((blocks, nkv, 16, dim)).astype(np.float16)
            table = np.arange(blocks, dtype=np.int64)
            q = rng.standard_normal((n, nq, dim)).astype(np.float32)
            scale = np.float32(dim ** -0.5)
            line = []
            for th in sorted({1, threads}):
                ops = KernelOps(lib, Threads(th))
                fns = {"rows": lambda o=ops: NumpyOps.attend_prompt(o, q, K, V, table, 0, 0,
                                                                    None, scale),
                       "blocked": lambda o=ops: o.attend_prompt(q, K, V, table, 0, 0, None,
                                                                scale)}
                times: dict[str, list[float]] = {k: [] for k in fns}
                for _ in range(3 if quick else 5):
                    for k, fn in fns.items():
                        start = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - start)
                med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
                line.append(f"{th} thread{'s' * (th > 1)}: {med['rows']:.1f} / "
                            f"{med['blocked']:.1f} ms, ratio {med['rows'] / med['blocked']:.2f}")
            print(f"  {name} heads {nq}/{nkv} x {dim}, {n} rows: " + "; ".join(line))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention-only", action="store_true")
    args = ap.parse_args()
    if args.attention_only:
        attention(args.threads, args.quick)
        return
    count, size = (2, 1024) if args.quick else (16, 4096)
    rounds = 3 if args.quick else 7
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((size, size), dtype=np.float32) * size ** -0.5
               for _ in range(count)]
    factory = LinearFactory("cpu", args.threads)
    variants = {"numpy f32": (lambda x: [x @ w.T for w in weights],
                              sum(w.nbytes for w in weights))}
    for qtype in (QT.Q8_0, QT.Q4_0, QT.Q4_1):
        lins = [factory.linear([QMatrix.from_float(w, qtype)]) for w in weights]
        variants[f"ours {qtype.name}"] = ((lambda ls: lambda x: [lin(x) for lin in ls])(lins),
                                          sum(lin.nbytes for lin in lins))
    try:
        variants.update(_torch_variants(weights, args.threads))
    except Exception as exc:  # an older torch without these ops
        print(f"(torch's kernels unavailable: {exc})")
    print(f"{count} matrices {size} x {size}, {args.threads} threads; ms for one pass over all "
          f"(median of {rounds} rounds), ratio of numpy f32's time to it, weight GB/s")
    for rows in (1, 8) if args.quick else (1, 8, 128):
        x = rng.standard_normal((rows, size), dtype=np.float32)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for fn, _ in variants.values():
            fn(x)
        for _ in range(rounds):
            for name, (fn, _) in variants.items():
                # a pause, so the thread pools of the one before (OpenMP's and OpenBLAS's
                # threads spin a while after their work) are idle again
                time.sleep(0.25)
                start = time.perf_counter()
                fn(x)
                times[name].append(time.perf_counter() - start)
        base = float(np.median(times["numpy f32"]))
        print(f"\nx with {rows} row{'s' * (rows > 1)}:")
        for name, (_, nbytes) in variants.items():
            t = float(np.median(times[name]))
            print(f"  {name:20} {t * 1e3:8.2f} ms  {base / t:5.2f}x  {nbytes / t / 1e9:6.1f} GB/s")
    attention(args.threads, args.quick)


if __name__ == "__main__":
    main()
