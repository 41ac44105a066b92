"""Scored prompts of one context (lm-evaluation-harness's multiple choice), with the worker's
memo of scored prompts (actors.score_memo) against without it, side by side in one run.

Each question is a context of N tokens (400; --quick: 64) and four continuations, scored as
lm-eval's `local-completions` scores them: one prompt per choice, `echo` + `logprobs` 1 and
`max_tokens` 0, one after the other, through the worker's decode loop (no Ray). Each round
asks a question of its own (no context seen before) with the memo off, then another with it
on; the printed ratio is the total time off over on, with the prompt tokens taken from the
KV cache. The scores must be the same within float rounding (the context's are copied, the
continuations' computed after the cached blocks).

    .venv/bin/python bench/bench_scoring.py [--quick] [--rounds N] [--context N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.events import CompletionGenerate, Prompt, Usage  # noqa: E402
from actors.score_memo import ScoreMemo  # noqa: E402
from actors.worker import Worker  # noqa: E402
from npu import load_model  # noqa: E402

CHOICES = (" a red car.", " the old bridge.", " two cats.", " nothing at all.")


async def _score(worker: Worker, ids: list[int], k: int) -> tuple[list[float], int]:
    req = CompletionGenerate(request_id=f"s{k}", prompt_ids=ids, max_tokens=0, logprobs=True,
                             top_logprobs=1, echo_prompt=True, prompt_logprobs=True)
    events = [e async for batch in worker.generate(req) for e in batch]
    prompt = next(e for e in events if isinstance(e, Prompt))
    usage = next(e for e in events if isinstance(e, Usage))
    return [t.logprob for t in prompt.logprobs[1:]], usage.cached_tokens


def question(worker: Worker, context: list[int], memo: bool) -> tuple[float, int, list]:
    """Seconds for the four choices of one question, the tokens they took from the cache,
    their scores."""
    worker.scheduler.scores = ScoreMemo() if memo else ScoreMemo(max_cost=0)
    tok = worker.model.tokenizer
    start, cached, scores = time.perf_counter(), 0, []
    for k, text in enumerate(CHOICES):
        got, took = asyncio.run(_score(worker, context + tok.encode(text), k))
        cached += took
        scores.append(got)
    return time.perf_counter() - start, cached, scores


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="flm-tiny, a 64-token context (CI)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int)
    args = ap.parse_args()
    model = "flm-tiny" if args.quick else "smollm2-135m"
    n = args.context or (64 if args.quick else 400)
    rounds = 1 if args.quick else args.rounds
    worker = Worker(lambda: load_model(model, "cpu", name=model), max_batch=4)
    try:
        base = worker.model.prompt_ids(" ".join(
            f"The {i}th sentence of the story tells of a town by the river." for i in range(n)))
        vocab = worker.model.config.vocab_size

        def context(q: int) -> list[int]:  # a question of its own: ids no other one starts with
            return [base[0]] + [(t + 7 * q) % (vocab - 300) + 256 for t in base[1:n]]

        question(worker, context(1000), True)  # warm-up (first-request costs)
        off_s = on_s = worst = 0.0
        for r in range(rounds):
            off, _, want = question(worker, context(2 * r), False)
            on, cached, _ = question(worker, context(2 * r + 1), True)
            off_s, on_s = off_s + off, on_s + on
            # the first question again, the memo on (untimed): its scores against off's
            _, _, again = question(worker, context(2 * r), True)
            worst = max(worst, max(abs(a - b) for w, g in zip(want, again, strict=True)
                                   for a, b in zip(w, g, strict=True)))
            print(f"round {r + 1}: off {off:.2f} s, on {on:.2f} s ({cached} of "
                  f"{4 * n} context tokens from the cache)", flush=True)
        print(f"{model}, a {n}-token context, {len(CHOICES)} choices: ratio off/on "
              f"{off_s / on_s:.2f} ({rounds} round(s)); largest score difference "
              f"{worst:.1e} (target <= 2e-3)")
        return 0 if worst <= 2e-3 else 1
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
