"""ChatStream cost per update as a turn grows: is streaming linear?

For every format, three synthetic turns are streamed about 4 characters a piece: a long
reasoning trace, long content, and 8 tool calls with long string arguments. Printed: the
median microseconds per update in a window ending at 1k, 4k and 16k tokens, the ratio
16k/1k (target <= 1.5: no quadratic growth), and beside it what a full re-parse of the
turn so far costs at 16k tokens (what the C++ original does on every flush).

    python bench/bench_stream.py            # 16k tokens
    python bench/bench_stream.py --quick    # 2k tokens, to check the script works
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chat import ChatStream, FormatKind, parse, spec_for_kind  # noqa: E402

WORDS = ("the model weighs each option and then < checks a value , writes code { x : 1 } "
         "before it answers\n").split(" ")
CHARS_PER_TOKEN = 4


def words(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def reasoning_turn(kind: FormatKind, body: str) -> tuple[str, str]:
    if kind is FormatKind.GEMMA4:
        return "", "<|channel>thought\n" + body + "<channel|>Done."
    if kind is FormatKind.HARMONY:
        return "assistant", "<|channel|>analysis<|message|>" + body + "<|end|>"
    return "", "<think>" + body + "</think>Done."


def content_turn(kind: FormatKind, body: str) -> tuple[str, str]:
    if kind is FormatKind.HARMONY:
        return "assistant", "<|channel|>final<|message|>" + body + "<|return|>"
    return "", body


def calls_turn(kind: FormatKind, bodies: list[str]) -> tuple[str, str]:
    parts = []
    for i, body in enumerate(bodies):
        if kind is FormatKind.HERMES_JSON:
            args = json.dumps({"path": f"f{i}.txt", "text": body})
            parts.append(f'<tool_call>\n{{"name": "write", "arguments": {args}}}\n</tool_call>')
        elif kind is FormatKind.QWEN_XML:
            parts.append(f"<tool_call>\n<function=write>\n<parameter=path>\nf{i}.txt\n"
                         f"</parameter>\n<parameter=text>\n{body}\n</parameter>\n</function>\n"
                         "</tool_call>")
        elif kind is FormatKind.GEMMA4:
            q = '<|"|>'
            parts.append(f"<|tool_call>call:write{{path:{q}f{i}.txt{q},text:{q}{body}{q}}}"
                         "<tool_call|>")
        elif kind is FormatKind.LFM2_PYTHONIC:
            parts.append(f"write(path='f{i}.txt', text={json.dumps(body)})")
        elif kind is FormatKind.HARMONY:
            args = json.dumps({"path": f"f{i}.txt", "text": body})
            parts.append(f"<|start|>assistant<|channel|>commentary to=functions.write "
                         f"<|constrain|>json<|message|>{args}<|call|>")
        elif kind is FormatKind.MISTRAL_JSON:
            parts.append(json.dumps({"name": "write", "arguments": {"path": f"f{i}.txt",
                                                                     "text": body}}))
        elif kind is FormatKind.MISTRAL_ARGS:
            args = json.dumps({"path": f"f{i}.txt", "text": body})
            parts.append(f"[TOOL_CALLS]write[ARGS]{args}")
        elif kind is FormatKind.LLAMA3_JSON:
            parts.append(json.dumps({"name": "write", "parameters": {"path": f"f{i}.txt",
                                                                      "text": body}}))
        else:
            parts.append(body)
    if kind is FormatKind.LFM2_PYTHONIC:
        return "", "<|tool_call_start|>[" + ", ".join(parts) + "]<|tool_call_end|>"
    if kind is FormatKind.HARMONY:
        return "assistant", "".join(parts)[len("<|start|>assistant") :]
    if kind is FormatKind.MISTRAL_JSON:
        return "", "[TOOL_CALLS][" + ", ".join(parts) + "]"
    if kind is FormatKind.LLAMA3_JSON:
        return "", "; ".join(parts)
    return "", "".join(parts)


def run_stream(kind: FormatKind, prefill: str, text: str) -> list[float]:
    """Microseconds of each update, feeding about CHARS_PER_TOKEN characters a piece."""
    stream = ChatStream(spec_for_kind(kind), prefill=prefill)
    times = []
    clock = time.perf_counter_ns
    for i in range(0, len(text), CHARS_PER_TOKEN):
        piece = text[i : i + CHARS_PER_TOKEN]
        t0 = clock()
        stream.update(piece)
        times.append((clock() - t0) / 1000)
    stream.update("", final=True)
    return times


def full_reparse_us(kind: FormatKind, prefill: str, text: str, repeat: int = 5) -> float:
    spec = spec_for_kind(kind)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        parse(spec, prefill + text, partial=True)
        best = min(best, (time.perf_counter_ns() - t0) / 1000)
    return best


def window(times: list[float], end_token: int, width: int) -> float:
    lo = max(0, end_token - width)
    return statistics.median(times[lo:end_token])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2k tokens only (CI)")
    args = ap.parse_args()
    tokens = 2048 if args.quick else 16384
    marks = [m for m in (1024, 4096, 16384) if m <= tokens]
    width = 256
    rng = random.Random(0)
    n_chars = tokens * CHARS_PER_TOKEN
    print(f"ChatStream: median us/update in the {width} updates ending at each mark; "
          f"{CHARS_PER_TOKEN} chars a piece")
    head = f"{'format':<14} {'turn':<9} " + " ".join(f"{str(m // 1024) + 'k':>7}" for m in marks)
    print(head + f" {'ratio':>6} {'full@end':>10} {'incr/full':>9}")
    worst_ratio = 0.0
    for kind in FormatKind:
        body = words(rng, n_chars)
        call_bodies = [words(rng, n_chars // 8) for _ in range(8)]
        turns = {
            "reasoning": reasoning_turn(kind, body),
            "content": content_turn(kind, body),
            "calls": calls_turn(kind, call_bodies),
        }
        for name, (prefill, text) in turns.items():
            times = run_stream(kind, prefill, text)
            at = [window(times, m, width) for m in marks]
            ratio = at[-1] / at[0]
            worst_ratio = max(worst_ratio, ratio)
            cut = min(len(text), marks[-1] * CHARS_PER_TOKEN)
            full = full_reparse_us(kind, prefill, text[:cut])
            print(f"{kind.value:<14} {name:<9} " + " ".join(f"{v:7.2f}" for v in at)
                  + f" {ratio:6.2f} {full:10.0f} {at[-1] / full:9.5f}")
    print(f"worst ratio {marks[-1] // 1024}k/1k: {worst_ratio:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
