"""Speculative decoding from the prompt (n-gram drafting) against plain decoding, on the
default model (SmolLM2-135M Q4_1), greedy, through the worker's decode loop (no Ray): an echo
workload (a ~300-token JSON block rewritten with one change) and free text. Both sides
alternate in one run, each request run after a warm-up (the prompt's KV is cached for both);
the outputs must be the same token for token.

    .venv/bin/python bench/bench_spec.py [--quick] [--rounds N] [--threads N] [--tokens K]
        [--lookup-min N] [--more]

The ratio printed is the median of the rounds' ratios (each round both sides, taking turns
going first), with their range; --more adds four other kinds of free text (a poem, a list,
an explanation, code).

Targets (issue 31): echo >= 1.6x tokens/s, free text >= 0.97x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.events import ChatGenerate, Deltas, Usage  # noqa: E402
from actors.speculation import Speculation  # noqa: E402
from actors.worker import Worker  # noqa: E402
from chat import constraint_request_from_openai  # noqa: E402
from npu import load_model  # noqa: E402

RECORD = {"id": 4127, "name": "Ada Lovelace", "email": "ada@example.com", "city": "London",
          "roles": ["admin", "editor"], "active": True,
          "address": {"street": "12 St James's Square", "postcode": "SW1Y 4JH",
                      "country": "United Kingdom"},
          "projects": [{"name": "analytical-engine", "stars": 1843, "language": "notes"},
                       {"name": "bernoulli", "stars": 512, "language": "tables"}],
          "created": "1843-07-10T09:00:00Z", "tags": ["math", "computing", "poetry"]}
ECHO = ("Here is a JSON record:\n\n" + json.dumps(RECORD, indent=2) + "\n\nRewrite the whole "
        "record exactly as it is, changing only \"city\" to \"Paris\". Answer with the JSON "
        "only.")
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."
FREE2 = "Explain in a few paragraphs how photosynthesis works and why it matters."
MORE = {  # --more: free text of other kinds
    "poem": "Write a poem about autumn leaves in the style of a sonnet.",
    "list": "Name twenty different countries and the main language spoken in each.",
    "explain": "Why is the sky blue? Answer in detail for a curious ten year old.",
    "code": "Write a Python function that checks whether a string is a palindrome, with "
            "comments."}


async def _run(worker: Worker, prompt: str, max_tokens: int) -> tuple[str, int, float, Usage]:
    req = ChatGenerate(request_id="bench", messages=[{"role": "user", "content": prompt}],
                       max_tokens=max_tokens, temperature=0.0,
                       constraint=constraint_request_from_openai({}))
    text, usage = [], None
    t = time.perf_counter()
    async for batch in worker.generate(req):
        for ev in batch:
            if isinstance(ev, Deltas):
                text += [d.text for d in ev.deltas]
            elif isinstance(ev, Usage):
                usage = ev
    return "".join(text), usage.completion_tokens, time.perf_counter() - t, usage


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=Speculation().tokens)
    ap.add_argument("--threads", type=int, default=0,
                    help="kernel threads (0: every core; --quick: 1)")
    ap.add_argument("--lookup-min", type=int, default=Speculation().lookup_min)
    ap.add_argument("--more", action="store_true", help="free text of four other kinds too")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    model = load_model("smollm2-135m")
    threads = args.threads or (1 if args.quick else 0)  # quick (CI): one thread, steady
    if threads:
        model.engine.set_threads(threads)
    spec = Speculation(tokens=args.tokens, lookup_min=args.lookup_min,
                       lookup_max=max(4, args.lookup_min))
    sides = {"plain": Worker(lambda: model, speculation=Speculation(method="off")),
             "ngram": Worker(lambda: model, speculation=spec)}
    print(f"SmolLM2-135M Q4_1, greedy, {model.engine.linears.threads.n} thread(s), speculative tokens={spec.tokens} "
          f"lookup={spec.lookup_min}..{spec.lookup_max}, {rounds} round(s)")
    ok = True
    workloads = [("echo", ECHO, 120 if args.quick else 400, 1.6),
                 ("free text", FREE, 40 if args.quick else 200, 0.97)]
    if not args.quick:
        workloads.append(("free text 2", FREE2, 200, 0.97))
    if args.more:
        workloads += [(name, prompt, 200, 0.97) for name, prompt in MORE.items()]
    try:
        for label, prompt, max_tokens, target in workloads:
            rates: dict[str, list[float]] = {k: [] for k in sides}
            texts: dict[str, str] = {}
            usage = None
            for name, w in sides.items():  # warm-up: the prompt's KV cached for both sides
                asyncio.run(_run(w, prompt, max_tokens))
            for r in range(rounds):  # the sides take turns going first
                for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                    text, n, dt, u = asyncio.run(_run(sides[name], prompt, max_tokens))
                    rates[name].append(n / dt)
                    texts[name] = text
                    if name == "ngram":
                        usage = u
            same = texts["plain"] == texts["ngram"]
            ok &= same
            plain, fast = statistics.median(rates["plain"]), statistics.median(rates["ngram"])
            ratios = sorted(f / p for f, p in zip(rates["ngram"], rates["plain"]))
            drafted = usage.accepted_prediction_tokens + usage.rejected_prediction_tokens
            print(f"{label}: plain {plain:.1f} tok/s, ngram {fast:.1f} tok/s, ratio "
                  f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}, the "
                  f"rounds' median and range; target {target}); drafts kept "
                  f"{usage.accepted_prediction_tokens}/{drafted} of {usage.completion_tokens} "
                  f"tokens; same output: {same}")
        cost = sides["ngram"].scheduler.cost.seconds
        print("a forward by its rows (ms, moving average): " + ", ".join(
            f"{rows}: {cost[rows] * 1e3:.1f}" for rows in sorted(cost)))
    finally:
        for w in sides.values():
            w.close()
    if not ok:
        print("FAIL: speculative output differs from plain output")
        sys.exit(1)


if __name__ == "__main__":
    main()
