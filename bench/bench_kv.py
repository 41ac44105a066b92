"""The KV cache's formats side by side: a decode step after a long prompt on the f16 cache and
on the Q8_0 one (`kv_cache_type: q8_0`), the same file loaded twice in one process, the two
taking turns each round (this machine's spells hit both). Printed: each format's step and its
attention (the one-call step's own timer) in milliseconds, the medians of the rounds with
each round's, the KV bytes a token, and the ratio f16 / q8_0 of the step.

    .venv/bin/python bench/bench_kv.py                          # Qwen3-0.6B Q4_0, 2,048 tokens
    .venv/bin/python bench/bench_kv.py smollm2 --prompt 4096 --threads 1
    .venv/bin/python bench/bench_kv.py --quick                  # SmolLM2, 256 tokens
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peer import model_path, tokens  # noqa: E402

KINDS = ("f16", "q8_0")


def measure(name: str, prompt: int, steps: int, rounds: int, threads: int) -> None:
    from threadpoolctl import threadpool_limits

    from npu import load_model

    threadpool_limits(threads)
    engines = {k: load_model(model_path(name), kv_cache_type=k).engine for k in KINDS}
    for eng in engines.values():
        eng.set_threads(threads)
        eng.prefill("d", tokens(prompt, 1))
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    for r in range(rounds):
        for kind, eng in engines.items():
            ids = tokens(steps + 1, 2 + r)
            eng.decode(["d"], [ids[0]])
            timed = getattr(eng.fused, "seconds", None)
            before = None if timed is None else timed.copy()
            start = time.perf_counter()
            for t in ids[1:]:
                eng.decode(["d"], [t])
            step = (time.perf_counter() - start) / steps * 1e3
            attention = 0.0 if before is None else (timed[1] - before[1]) / steps * 1e3
            got[kind].append((step, attention))
            eng.rewind("d", prompt)  # the next round decodes after the same prompt
    print(f"{name}, a decode step after {prompt} tokens, {threads} thread(s), {rounds} rounds")
    med = {}
    for kind, eng in engines.items():
        steps_ms = [s for s, _ in got[kind]]
        med[kind] = statistics.median(steps_ms)
        print(f"  {kind:5} step {med[kind]:7.2f} ms [{' '.join(f'{s:.2f}' for s in steps_ms)}]"
              f", attention {statistics.median(a for _, a in got[kind]):6.2f} ms; KV "
              f"{eng.kv.block_bytes // 16:,} bytes a token")
    print(f"  ratio f16 / q8_0 step {med['f16'] / med['q8_0']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", default="qwen3-0.6b-Q4_0",
                    help="smollm2, a bench/gguf_shapes.py shape (default qwen3-0.6b-Q4_0)")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.file, args.prompt, args.steps, args.rounds = "smollm2", 256, 4, 2
    measure(args.file, args.prompt, args.steps, args.rounds, args.threads)


if __name__ == "__main__":
    main()
