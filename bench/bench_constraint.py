"""Constrained decoding cost on a real vocabulary, beside bare xgrammar calls in the same run.

Printed: GrammarEngine build time; cold and cached compile time of a 5-tool `required` tag
and of a moderate JSON schema; per-token fill_mask + accept p50/p99 through our
`GrammarConstraint` and through a bare xgrammar matcher replaying the same tokens (target:
ours <= 1.2x bare); the per-output total over 300-token outputs; and what a request with
nothing to constrain costs (target: no constraint object, no mask work).

    python bench/bench_constraint.py           # the Qwen vocabulary from ../shared
    python bench/bench_constraint.py --quick   # fewer outputs (CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chat import (  # noqa: E402
    GrammarEngine,
    constraint_request_from_openai,
    make_constraint,
    spec_for_kind,
    structural_tag,
)
from chat.decode import mask_words  # noqa: E402
from tests.chat.vocab import qwen_available, qwen_vocab, small_vocab  # noqa: E402
from tests.chat.walk import walk  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                   "exact": {"type": "boolean"}, "tags": {"type": "array",
                                                          "items": {"type": "string"}}},
    "required": ["query"]}}} for i in range(5)]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
        "required": ["city"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "score": {"type": "number"}, "active": {"type": "boolean"}},
    "required": ["name", "age", "address"]}
REQUESTS = {
    "5-tool required": {"tools": TOOLS, "tool_choice": "required"},
    "JSON schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": SCHEMA}}},
}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 outputs per request (CI)")
    args = ap.parse_args()
    outputs = 3 if args.quick else 20
    if qwen_available():
        vocab, stops = qwen_vocab()
        print(f"vocabulary: Qwen3, {len(vocab)} tokens")
    else:
        vocab, stops = small_vocab()
        print(f"vocabulary: small test BPE, {len(vocab)} tokens (../shared absent)")
    import xgrammar  # noqa: F401  (import time is not the engine's)

    t0 = time.perf_counter()
    engine = GrammarEngine(vocab, stops)
    print(f"GrammarEngine build (TokenizerInfo + compiler): {ms(time.perf_counter() - t0)}")
    spec = spec_for_kind("hermes_json")
    rng = np.random.default_rng(0)
    words = mask_words(engine.vocab_size)
    ratios = []
    for label, body in REQUESTS.items():
        request = constraint_request_from_openai(body)
        tag = structural_tag(spec, request)
        t0 = time.perf_counter()
        compiled = engine.compile(tag)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(100):
            engine.compile(tag)
        cached = (time.perf_counter() - t0) / 100
        print(f"\n[{label}] compile cold {ms(cold)}, cached {ms(cached)}")
        # token sequences a constrained random model produces (about 300 tokens)
        sequences = []
        for _ in range(outputs):
            c = make_constraint(spec, request, engine)
            c.start("")
            text, _ = walk(c, vocab, set(stops), rng, max_tokens=300, closer_bias=1.0)
            sequences.append(engine_tokens(c))
        ours_steps, bare_steps, ours_total, bare_total = [], [], [], []
        buf = np.zeros(words, dtype=np.uint32)
        bare_buf = np.zeros((1, words), dtype=np.int32)
        for seq in sequences:
            c = make_constraint(spec, request, engine)
            c.start("")
            ours_total.append(timed(seq, lambda: c.fill_mask(buf), c.accept, ours_steps))
            m = engine.matcher(compiled, engine.stop_token_ids)
            bare_total.append(timed(seq, lambda: m.fill_next_token_bitmask(bare_buf),
                                    m.accept_token, bare_steps))
        n_tok = statistics.mean(len(s) for s in sequences)
        p = lambda xs, q: float(np.percentile(xs, q)) / 1000  # noqa: E731
        ratio = sum(ours_total) / sum(bare_total)
        ratios.append(ratio)
        print(f"  per token fill_mask+accept: ours p50 {p(ours_steps, 50):7.1f} us "
              f"p99 {p(ours_steps, 99):7.1f} us | bare xgrammar p50 {p(bare_steps, 50):7.1f} us "
              f"p99 {p(bare_steps, 99):7.1f} us")
        print(f"  per output ({n_tok:.0f} tokens): ours {statistics.mean(ours_total) / 1e6:7.2f} ms"
              f", bare {statistics.mean(bare_total) / 1e6:7.2f} ms, ratio {ratio:.3f} "
              "(target <= 1.2)")
    t0 = time.perf_counter_ns()
    none = make_constraint(spec, constraint_request_from_openai({}), engine)
    dt = (time.perf_counter_ns() - t0) / 1000
    print(f"\nno constraint: make_constraint -> {none!r} in {dt:.1f} us; the loop does no mask work")
    print(f"worst ours/bare ratio: {max(ratios):.3f}")
    return 0


def timed(seq: list[int], fill, accept, steps: list[float]) -> float:
    """Replay `seq` as fill-mask + accept per token; records each step, returns the total ns."""
    total = 0.0
    for tok in seq:
        t0 = time.perf_counter_ns()
        fill()
        accept(tok)
        dt = time.perf_counter_ns() - t0
        steps.append(dt)
        total += dt
    return total


def engine_tokens(constraint) -> list[int]:
    return constraint.tokens


if __name__ == "__main__":
    raise SystemExit(main())
