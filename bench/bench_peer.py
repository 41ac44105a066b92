"""Ours against llama.cpp on the same GGUF files, same thread count, in one run.

For each file, one child process per side holds the model (both loaded at once), and the
parent asks them for measurements in rounds, the sides taking turns going first, so the
machine's drift hits both: decode tokens/s for one sequence after a 128-token prompt;
prefill tokens/s for a 512-token prompt; and (ours) aggregate decode tokens/s for 8
sequences decoded together (each at the same 128-token position); (ours, at more than one
thread) the first prompt length's prefill on N threads and on 1 in a row (N 1 1 N), for the
scaling; prefill tokens/s for
prompts of each `--prefill` length (512 and 2,048 tokens by default; `--prefill
512,2048,8192` for long prompts, lengths past a file's context skipped). Printed: each
side's medians, the median of the rounds' ratios ours / llama.cpp with their range, where a
decode step's time goes on our side (by kind of operation, for one sequence (measured each
round: medians, with the range of the share outside the products) and for 8; with
the layers in one kernel call, npu.engine.fused, its own timers split the call into
products, attention and the rest, and "outside the products" is the share of a step not in
a matrix product, the output head included as one), and our decode's weight bytes per
second against this machine's memory read bandwidth (a float32 matrix-vector product over
1 GiB, measured in the same run).

Files: the default SmolLM2-135M-Instruct (Q4_1); gemma3-270m (the real Gemma 3 270M
Q4_K_M file from PyPI, bench/bench_load.py's) or a .gguf path; and random-weight Qwen3-0.6B- and
Llama-3.1-8B-shaped files in Q4_0, Q8_0 and llama.cpp's Q4_K_M mix, and a 0.6B one in its
Q5_K_M mix (bench/gguf_shapes.py writes them once into the cache directory; the 8B ones
are 4.2, 8.5 and 4.9 GB).

    .venv/bin/python bench/bench_peer.py                # every file (over an hour)
    .venv/bin/python bench/bench_peer.py smollm2 qwen3-0.6b-Q4_0   # some of them
    .venv/bin/python bench/bench_peer.py --quick        # SmolLM2, few tokens, ours only
    .venv/bin/python bench/bench_peer.py smollm2 --threads 1 --prefill 512,2048,8192
    .venv/bin/python bench/bench_peer.py qwen3-0.6b-Q4_0 --prompt 2048 --kv q8_0

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

FILES = ("smollm2", "qwen3-0.6b-Q4_0", "qwen3-0.6b-Q8_0", "qwen3-0.6b-Q4_K_M",
         "qwen3-0.6b-Q5_K_M", "llama-8b-Q4_0", "llama-8b-Q8_0", "llama-8b-Q4_K_M")
BATCH = 8
BATCH_SEQS = ["d"] + [f"d{i}" for i in range(1, BATCH)]  # "d" holds the prompt, forked
# a pause before each measurement: the other side's threads (OpenMP's, llama.cpp's pool)
# spin a while after their work and would slow the next run's start
SETTLE_S = 0.3
# llama.cpp's Q8_0 KV cache (`--cache-type-k q8_0 --cache-type-v q8_0`, which needs its flash
# attention for V): the one `--kv q8_0` compares ours with
Q8_CACHE = {"type_k": 8, "type_v": 8, "flash_attn": True}


def model_path(name: str) -> Path:
    if name == "smollm2":
        from npu.load.loader import default_model_path

        return default_model_path()
    if _real(name):
        from bench_load import model_path as load_path

        return load_path(name)
    from gguf_shapes import shaped_gguf

    shape, qtype = name.rsplit("-", 1)
    return shaped_gguf(shape, qtype)


def _real(name: str) -> bool:
    """Whether `name` is a real file: the Gemma 3 file of bench/bench_load.py, or a path."""
    return name == "gemma3-270m" or name.endswith(".gguf")


def _shaped(name: str) -> bool:
    """Whether `name` is a shape and format bench/gguf_shapes.py writes."""
    from gguf_shapes import FORMATS, SHAPES

    shape, _, fmt = name.rpartition("-")
    return shape in SHAPES and fmt in FORMATS


def tokens(n: int, seed: int) -> list[int]:
    """n token ids from the common part of the vocabularies (all files here have 49,152)."""
    return np.random.default_rng(seed).integers(1000, 40000, n).tolist()


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


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
    fused = getattr(step, "fused", None)  # one kernel call for the layers: its own timers
    before = fused.seconds.copy() if fused is not None else None

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
    if fused is not None:
        inside = (fused.seconds - before) / len(ids) * 1e3
        spent["linear"] += inside[0] * len(ids) / 1e3
        spent["attention"] += inside[1] * len(ids) / 1e3
        spent["fused rest"] = inside[2] * len(ids) / 1e3
    out = {k: v / len(ids) * 1e3 for k, v in spent.items()}
    out["other"] = total / len(ids) * 1e3 - sum(out.values())
    out["outside the products %"] = 100 * (1 - out["linear"] / (total / len(ids) * 1e3))
    return out


class _Step:
    """A decode step for op_times, with the engine's fused layers (their timers) if any."""

    def __init__(self, fn, engine) -> None:
        self.fn, self.fused = fn, getattr(engine, "fused", None)

    def __call__(self, token: int):
        return self.fn(token)


class Ours:
    """Our engine on a file, measured on request."""

    def __init__(self, path: Path, args) -> None:
        from threadpoolctl import threadpool_limits

        from npu import load_model

        threadpool_limits(args.threads)
        self.args = args
        self.eng = eng = load_model(path, kv_cache_type=args.kv).engine
        eng.set_threads(args.threads)
        embed = eng.embed_tokens.matrix
        # bytes a decode step reads: every weight but the embedding (one row of it), unless
        # the head is the embedding itself
        tied = eng.lm_head.matrix is embed
        self.info = {"step_bytes": eng.weight_bytes - (0 if tied else embed.nbytes),
                     "context": eng.max_context}
        eng.prefill("warm", tokens(16, 9))
        eng.release("warm")

    def _start(self, seqs: list[str]) -> None:
        for sid in ["d", *seqs]:
            self.eng.release(sid)
        self.eng.prefill("d", tokens(self.args.prompt, 1))
        for sid in seqs[1:]:
            self.eng.fork("d", sid)

    def decode(self) -> float:
        self._start(["d"])
        ids = tokens(self.args.steps + 2, 2)
        for t in ids[:2]:
            self.eng.decode(["d"], [t])
        start = time.perf_counter()
        for t in ids[2:]:
            self.eng.decode(["d"], [t])
        return _rate(self.args.steps, time.perf_counter() - start)

    def batch(self) -> float:
        self._start(BATCH_SEQS)
        self.eng.decode(BATCH_SEQS, tokens(BATCH, 3))
        steps = max(2, self.args.steps // 2)
        start = time.perf_counter()
        for s in range(steps):
            self.eng.decode(BATCH_SEQS, tokens(BATCH, 4 + s))
        return _rate(BATCH * steps, time.perf_counter() - start)

    def prefill(self, n: str) -> float:
        self.eng.release("p")
        ids = tokens(int(n), 5)
        start = time.perf_counter()
        self.eng.prefill("p", ids)
        rate = _rate(len(ids), time.perf_counter() - start)
        self.eng.release("p")
        return rate

    def prefill_one(self, n: str) -> float:
        """`prefill` on one thread, the kernels' and BLAS's (set back after): the
        scaling's baseline."""
        from threadpoolctl import threadpool_limits

        self.eng.set_threads(1)
        try:
            with threadpool_limits(1):
                return self.prefill(n)
        finally:
            self.eng.set_threads(self.args.threads)

    def scaling(self, n: str) -> list[float]:
        """Prefill tokens/s at the set threads and at one, side by side in the order N 1 1 N
        (the machine's drift within them cancels): [N threads' mean, one thread's]."""
        many = [self.prefill(n)]
        one = [self.prefill_one(n), self.prefill_one(n)]
        many.append(self.prefill(n))
        return [sum(many) / 2, sum(one) / 2]

    def profile(self) -> dict[str, float]:
        self._start(["d"])
        return op_times(_Step(lambda t: self.eng.decode(["d"], [t]), self.eng),
                        tokens(max(4, self.args.steps // 2), 6))

    def profile_batch(self) -> dict[str, float]:
        self._start(BATCH_SEQS)
        return op_times(_Step(lambda t: self.eng.decode(BATCH_SEQS, [t] * BATCH), self.eng),
                        tokens(max(4, self.args.steps // 4), 7))


class Peer:
    """llama.cpp (llama-cpp-python) on a file, measured on request."""

    def __init__(self, path: Path, args) -> None:
        from llama_cpp import Llama

        self.args = args
        self.llm = Llama(model_path=str(path), n_ctx=max(1024, args.prompt + args.steps + 8,
                                                         max(_sizes(args.prefill)) + 8),
                         n_batch=512, n_ubatch=512, n_threads=args.threads,
                         n_threads_batch=args.threads, verbose=False,
                         **(Q8_CACHE if args.kv == "q8_0" else {}))
        self.info = {}
        self.llm.eval(tokens(16, 9))

    def decode(self) -> float:
        self.llm.reset()
        self.llm.eval(tokens(self.args.prompt, 1))
        ids = tokens(self.args.steps + 2, 2)
        for t in ids[:2]:
            self.llm.eval([t])
        start = time.perf_counter()
        for t in ids[2:]:
            self.llm.eval([t])
        return _rate(self.args.steps, time.perf_counter() - start)

    def prefill(self, n: str) -> float:
        self.llm.reset()
        ids = tokens(int(n), 5)
        start = time.perf_counter()
        self.llm.eval(ids)
        return _rate(len(ids), time.perf_counter() - start)


def serve_side(side: str, name: str, args) -> None:
    """The child: load the file, say "ready" (with the side's facts), then answer each
    request line ("decode", "prefill", ...) with one JSON line."""
    held = (Ours if side == "ours" else Peer)(model_path(name), args)
    print(json.dumps(held.info), flush=True)
    for line in sys.stdin:
        what, *args = line.split()
        print(json.dumps(getattr(held, what)(*args)), flush=True)


class Side:
    """A child process holding one side's model."""

    def __init__(self, side: str, name: str, args) -> None:
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", side, name, "--threads", str(args.threads),
             "--prompt", str(args.prompt), "--steps", str(args.steps),
             "--prefill", str(args.prefill), "--kv", args.kv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.side} ended (its error is above)")
        return json.loads(line)

    def ask(self, what: str):
        time.sleep(SETTLE_S)
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


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


def has_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _sizes(prefill: str) -> list[int]:
    return [int(n) for n in str(prefill).split(",")]


def _med(values: list[float]) -> float:
    return float(np.median(values))


def compare(name: str, args, peer: bool, bw: float) -> None:
    """One file: both sides loaded, `args.rounds` rounds of each measurement."""
    path = model_path(name)
    print(f"\n{name}: {path.name}, {path.stat().st_size / 1e6:.0f} MB", flush=True)
    sides = {"ours": Side("ours", name, args)}
    if peer:
        sides["llama.cpp"] = Side("llama", name, args)
    sizes = [n for n in _sizes(args.prefill) if n <= sides["ours"].info["context"]]
    kinds = ["decode"] + [f"prefill {n}" for n in sizes]
    got: dict[str, dict[str, list[float]]] = {s: {k: [] for k in kinds} for s in sides}
    got["ours"]["batch"] = []
    one = f"prefill {sizes[0]}" if sizes and args.threads > 1 else None  # its 1-thread rate
    got["ours"]["scaling"] = []
    profiles: list[dict[str, float]] = []
    try:
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for kind in kinds:
                for side in order:
                    got[side][kind].append(sides[side].ask(kind))
            got["ours"]["batch"].append(sides["ours"].ask("batch"))
            if one:
                got["ours"]["scaling"].append(sides["ours"].ask(f"scaling {sizes[0]}"))
            profiles.append(sides["ours"].ask("profile"))  # one a round: the machine drifts
        profile_batch = sides["ours"].ask("profile_batch")
    finally:
        for side in sides.values():
            side.close()
    ours = {k: _med(v) for k, v in got["ours"].items() if v and k != "scaling"}
    gbs = sides["ours"].info["step_bytes"] * ours["decode"] / 1e9
    each = lambda vals: " ".join(f"{v:.1f}" for v in vals)  # noqa: E731
    print(f"  ours      decode {ours['decode']:7.1f} tok/s [{each(got['ours']['decode'])}]"
          f" ({gbs:.1f} GB/s = {gbs * 1e9 / bw:.2f} of the bandwidth)")
    for kind in kinds[1:]:
        print(f"            {kind} {ours[kind]:6.1f} tok/s [{each(got['ours'][kind])}]")
    print(f"            batch {BATCH} {ours['batch']:7.1f} tok/s [{each(got['ours']['batch'])}]"
          f" (ratio to one {ours['batch'] / ours['decode']:.2f})")
    if one:  # each round: N threads, 1, 1, N in a row
        pairs = got["ours"]["scaling"]
        scale = sorted(a / b for a, b in pairs)
        print(f"            {one} on 1 thread {_med([b for _, b in pairs]):6.1f} tok/s "
              f"[{each(b for _, b in pairs)}], on {args.threads} "
              f"{_med([a for a, _ in pairs]):6.1f} [{each(a for a, _ in pairs)}] (in a row, "
              f"{args.threads} 1 1 {args.threads}): {args.threads} threads / 1, median of the "
              f"rounds' ratios {_med(scale):.2f} ({scale[0]:.2f}-{scale[-1]:.2f})")
    profile = {k: _med([p[k] for p in profiles]) for k in profiles[0]}
    outside = sorted(p["outside the products %"] for p in profiles)
    print("            a decode step's ms by kind (medians of the rounds): " + ", ".join(
        f"{k} {v:.2f}" for k, v in profile.items()) + f" ({outside[0]:.1f}-{outside[-1]:.1f})")
    print(f"            a batch {BATCH} step's ms by kind: " + ", ".join(
        f"{k} {v:.2f}" for k, v in profile_batch.items()))
    if not peer:
        return
    theirs = {k: _med(v) for k, v in got["llama.cpp"].items()}
    print(f"  llama.cpp decode {theirs['decode']:7.1f} tok/s "
          f"[{each(got['llama.cpp']['decode'])}]")
    for kind in kinds[1:]:
        print(f"            {kind} {theirs[kind]:6.1f} tok/s [{each(got['llama.cpp'][kind])}]")
    line = []
    for kind in kinds:
        ratios = sorted(o / t for o, t in zip(got["ours"][kind], got["llama.cpp"][kind]))
        line.append(f"{kind} {_med(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")
    print("  ours / llama.cpp, median of the rounds' ratios (range): " + ", ".join(line),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", help=f"some of {', '.join(FILES)} (default: all)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", default="512,2048",
                    help="prompt lengths to prefill, comma-separated (default 512,2048)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv", choices=["f16", "q8_0"], default="f16",
                    help="the KV cache's format on both sides (q8_0: llama.cpp's "
                         "--cache-type-k/v q8_0 with its flash attention)")
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "FILE"))
    args = ap.parse_args()
    if args.child:
        serve_side(*args.child, args)
        return
    if args.quick:
        args.prompt, args.steps, args.prefill, args.rounds = 16, 4, "32,64", 1
    names = args.files or (["smollm2"] if args.quick else list(FILES))
    unknown = [n for n in names if n not in FILES and not _shaped(n) and not _real(n)]
    if unknown:
        ap.error(f"unknown files {unknown}; known: {', '.join(FILES)}, or any shape of "
                 "bench/gguf_shapes.py with one of its formats (e.g. llama-8b-Q5_K_M)")
    peer = has_llama_cpp() and not args.quick
    bw = read_bandwidth(args.threads)
    print(f"KV cache {args.kv}; threads {args.threads}; memory read bandwidth (GEMV over "
          f"1 GiB): {bw / 1e9:.1f} GB/s")
    print(f"decode after a {args.prompt}-token prompt ({args.steps} steps); prefill of "
          f"{args.prefill} tokens; batch {BATCH} = aggregate tok/s of {BATCH} sequences; "
          f"{args.rounds} rounds, figures are medians [each round]")
    if not peer:
        print("(llama.cpp: " + ("not run in --quick)" if args.quick else
                                "llama-cpp-python is not installed; `make bench-peer`)"))
    for name in names:
        try:
            compare(name, args, peer, bw)
        except RuntimeError as exc:  # a side that failed to load: the others still run
            print(f"  {exc}", flush=True)


if __name__ == "__main__":
    main()
