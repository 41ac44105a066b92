"""Thread counts side by side: one model's decode and prefill on the default thread count (one
a physical core, at most the cgroup's CPU quota: npu.engine.cores) and on others, taking
turns each round in one process (this machine's spells hit every count). Printed: what the
process may use (affinity, physical cores, quota), each count's decode and prefill tokens/s
(medians, with each round's), and each count's ratio to the default.

Where the default matters is where threads outnumber the CPUs really there: a container's
quota (`docker run --cpus 1`) or a core's second hardware thread. To see the quota's case
here, as root with cgroup v1, run it in a cgroup of one CPU:

    mkdir /sys/fs/cgroup/cpu/flm1 && echo 100000 > /sys/fs/cgroup/cpu/flm1/cpu.cfs_quota_us
    sh -c 'echo $$ > /sys/fs/cgroup/cpu/flm1/cgroup.procs; exec .venv/bin/python \\
        bench/bench_threads.py --threads 1,2'

    .venv/bin/python bench/bench_threads.py                  # Qwen3-0.6B Q4_0, default and 2x
    .venv/bin/python bench/bench_threads.py smollm2 --threads 1,2,4
    .venv/bin/python bench/bench_threads.py --quick          # SmolLM2, few tokens
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

from npu.engine.cores import (  # noqa: E402
    allowed_cpus,
    cgroup_cpu_limit,
    default_threads,
    physical_cores,
)


def decode(eng, threads: int, prompt: int, steps: int) -> float:
    eng.set_threads(threads)
    eng.release("d")
    eng.prefill("d", tokens(prompt, 1))
    ids = tokens(steps + 1, 2)
    eng.decode(["d"], [ids[0]])
    start = time.perf_counter()
    for t in ids[1:]:
        eng.decode(["d"], [t])
    return steps / (time.perf_counter() - start)


def prefill(eng, threads: int, n: int) -> float:
    eng.set_threads(threads)
    eng.release("p")
    ids = tokens(n, 5)
    start = time.perf_counter()
    eng.prefill("p", ids)
    eng.release("p")
    return n / (time.perf_counter() - start)


def measure(name: str, counts: list[int], prompt: int, steps: int, prefill_n: int,
            rounds: int) -> None:
    from threadpoolctl import threadpool_limits

    from npu import load_model

    cpus = allowed_cpus()
    base = default_threads()
    print(f"{name}: {len(cpus)} CPU(s) in the affinity mask, {physical_cores(cpus)} physical "
          f"core(s), cgroup quota {cgroup_cpu_limit() or 'none'}: default {base} thread(s)")
    counts = sorted(set(counts) | {base})
    threadpool_limits(1)  # the quantized kernels' own threads only
    eng = load_model(model_path(name)).engine
    got: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in counts}
    for r in range(rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            got[n][0].append(decode(eng, n, prompt, steps))
            got[n][1].append(prefill(eng, n, prefill_n))
    med = {n: (statistics.median(d), statistics.median(p)) for n, (d, p) in got.items()}
    for n, (d, p) in got.items():
        mark = " (default)" if n == base else ""
        print(f"  {n:3d} thread(s){mark}: decode {med[n][0]:7.1f} tok/s "
              f"[{' '.join(f'{x:.1f}' for x in d)}], prefill {prefill_n} {med[n][1]:7.1f} "
              f"tok/s [{' '.join(f'{x:.1f}' for x in p)}]")
    for n in counts:
        if n != base:
            print(f"  ratio default / {n} threads: decode {med[base][0] / med[n][0]:.2f}, "
                  f"prefill {med[base][1] / med[n][1]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", default="qwen3-0.6b-Q4_0",
                    help="smollm2, a bench/gguf_shapes.py shape (default qwen3-0.6b-Q4_0)")
    ap.add_argument("--threads", default="",
                    help="counts beside the default, comma-separated (default: twice it)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.threads.split(",") if x] or [2 * default_threads()]
    if args.quick:
        args.file, args.prompt, args.steps, args.prefill, args.rounds = "smollm2", 16, 2, 32, 2
        counts = [1, default_threads() + 1]
    measure(args.file, counts, args.prompt, args.steps, args.prefill, args.rounds)


if __name__ == "__main__":
    main()
