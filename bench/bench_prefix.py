"""Prefix caching, measured side by side in one run: cache on vs off, through HTTP.

8 tool-calling conversations of 10 turns each, interleaved (each its turns in order, all at
once), over 2 worker replicas of the default model (SmolLM2-135M, Q4_1 GGUF): a ~2,000-token
system prompt with a tool list, then per turn the model's reply (a tool call with its result,
or text) and a new user message, so each turn's prompt is the whole history. Three servings
of the same app, one after the other:
- "cache": prefix caching on, Serve's prefix-aware router (deployments/routing.py);
- "cache, default router": prefix caching on, requests routed by load only;
- "off": no prefix caching (every prompt prefilled whole).

Printed: per turn, the mean time to first token and cached/prompt tokens; the aggregate time
to first token; the prefix hit rate (cached / prompt tokens over turns 2..10), and the
targets of issue 15 with their figures.

    .venv/bin/python bench/bench_prefix.py            # full (several minutes)
    .venv/bin/python bench/bench_prefix.py --quick    # flm-tiny, 2 conversations, 3 turns
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPICS = ["order status", "returns", "shipping rates", "warranty claims", "store hours",
          "bike fitting", "repairs", "rentals", "gift cards", "trade-ins", "financing",
          "events"]


def tools(n: int) -> list[dict]:
    """`n` shop tools with long descriptions (the bulk of the system prompt)."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        out.append({"type": "function", "function": {
            "name": f"lookup_{topic.replace(' ', '_').replace('-', '_')}_{i}",
            "description": (f"Look up {topic} for a customer of the bicycle shop. Use it when "
                            f"the customer asks about {topic}; it returns a JSON record with "
                            "the facts the answer needs, never guess them. ") * 2,
            "parameters": {"type": "object", "properties": {
                "customer_id": {"type": "string", "description": "The customer's id."},
                "detail": {"type": "string", "description": f"What about {topic}."}},
                "required": ["customer_id"]}}})
    return out


def system_prompt(repeats: int) -> dict:
    policy = ("You are the assistant of a bicycle shop. Be brief and exact. Call a tool when "
              "the answer needs a fact from the shop's systems; otherwise answer in one or "
              "two sentences. Never invent order numbers, prices or dates. ")
    return {"role": "system", "content": policy * repeats}


async def turn(client: httpx.AsyncClient, model: str, messages: list, tool_list: list,
               max_tokens: int) -> dict:
    """One streamed request: its time to first token, usage and reply message. With
    `logprobs` every token is a chunk (a tool call's opening is otherwise held back until its
    name is whole), so the first chunk's time is the first token's."""
    body = {"model": model, "messages": messages, "tools": tool_list, "max_tokens": max_tokens,
            "temperature": 0, "logprobs": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    content, calls, usage = "", {}, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                d = c["delta"]
                if first is None:
                    first = time.perf_counter()
                content += d.get("content") or ""
                for call in d.get("tool_calls") or []:
                    acc = calls.setdefault(call["index"], {"id": "", "name": "", "args": ""})
                    acc["id"] = call.get("id") or acc["id"]
                    acc["name"] = call.get("function", {}).get("name") or acc["name"]
                    acc["args"] += call.get("function", {}).get("arguments") or ""
    end = time.perf_counter()
    reply: dict = {"role": "assistant", "content": content}
    if calls:
        reply["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["name"], "arguments": c["args"] or "{}"}} for c in calls.values()]
    return {"ttft": (first or end) - t0, "usage": usage, "reply": reply}


async def conversation(client, model: str, index: int, turns: int, system: dict,
                       tool_list: list, max_tokens: int) -> list[dict]:
    messages = [system, {"role": "user", "content":
                         f"Hi, I am customer C-{1000 + index}. Where is my order?"}]
    out = []
    for t in range(turns):
        r = await turn(client, model, messages, tool_list, max_tokens)
        out.append(r)
        messages = messages + [r["reply"]]
        for call in r["reply"].get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps({"customer": f"C-{1000 + index}",
                                                    "turn": t, "status": "ok"})})
        messages.append({"role": "user", "content": f"Thanks. Question {t + 1}: and what "
                         f"about {TOPICS[(index + t) % len(TOPICS)]}?"})
    return out


def summarise(name: str, results: list[list[dict]]) -> dict:
    turns = len(results[0])
    per_turn = []
    for t in range(turns):
        rs = [conv[t] for conv in results]
        per_turn.append({"ttft": statistics.mean(r["ttft"] for r in rs),
                         "prompt": statistics.mean(r["usage"]["prompt_tokens"] for r in rs),
                         "cached": statistics.mean(
                             r["usage"]["prompt_tokens_details"]["cached_tokens"]
                             for r in rs)})
    later = [conv[t]["usage"] for conv in results for t in range(1, turns)]
    hit = (sum(u["prompt_tokens_details"]["cached_tokens"] for u in later)
           / sum(u["prompt_tokens"] for u in later))
    least = min(u["prompt_tokens_details"]["cached_tokens"] / u["prompt_tokens"]
                for u in later)
    total = sum(r["ttft"] for conv in results for r in conv)
    print(f"\n{name}: aggregate time to first token {total:.2f} s, prefix hit rate "
          f"(turns 2..{turns}) {hit:.1%}, least cached share {least:.1%}")
    for t, row in enumerate(per_turn):
        print(f"  turn {t + 1:2d}: ttft {1000 * row['ttft']:7.1f} ms   prompt "
              f"{row['prompt']:7.0f}   cached {row['cached']:7.0f}")
    return {"total": total, "hit": hit, "least": least, "per_turn": per_turn}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--conversations", type=int)
    parser.add_argument("--turns", type=int)
    args = parser.parse_args()
    quick = args.quick
    model_path = "flm-tiny" if quick else "smollm2-135m"
    conversations = args.conversations or (2 if quick else 8)
    turns = args.turns or (3 if quick else 10)
    tool_list = tools(2 if quick else 10)
    system = system_prompt(2 if quick else 6)
    max_tokens = 8 if quick else 24

    cache = Path(tempfile.mkdtemp(prefix="flm-bench-prefix-"))
    from npu.engine.cpu_kernels import seed_cache

    seed_cache(cache)  # the workers load this process's kernel build, not their own
    os.environ["FLM_CACHE"] = str(cache)
    import logging

    import ray
    from ray import serve

    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request

    from deployments.app import build_app
    from deployments.launch.serve_env import free_port, serve_environ

    os.environ.update(serve_environ(os.environ, private_ports=True))  # as `make serve`
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"FLM_CACHE": str(cache)}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    modes = [("cache", {}), ("off", {"prefix_cache": False})]
    if not quick:
        modes.insert(1, ("cache, default router", {"prefix_routing": False}))
    print(f"{model_path}, {conversations} conversations x {turns} turns over 2 worker "
          f"replicas, {max_tokens} tokens a reply, {len(tool_list)} tools")
    summaries = {}
    try:
        for name, opts in modes:
            serve.run(build_app({"models": [{"name": "m", "path": model_path, "replicas": 2,
                                             "max_batch": 8, **opts}]}),
                      name="bench", route_prefix="/")

            async def run():
                async with httpx.AsyncClient(base_url=url, timeout=900) as client:
                    # warm both replicas (the tools' grammar, first-request costs) with
                    # another prompt
                    await asyncio.gather(*(turn(client, "m", [{"role": "user", "content":
                                                               f"warm up {i}"}], tool_list, 2)
                                           for i in range(4)))
                    return await asyncio.gather(*(conversation(
                        client, "m", i, turns, system, tool_list, max_tokens)
                        for i in range(conversations)))

            summaries[name] = summarise(name, asyncio.run(run()))
            serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()

    on, off = summaries["cache"], summaries["off"]
    second, last = on["per_turn"][1]["ttft"], on["per_turn"][-1]["ttft"]
    checks = [
        (f"from turn 2 on, cached >= 90% of each prompt: least {on['least']:.1%}",
         on["least"] >= 0.9),
        (f"last turn's ttft <= 1.3x the second's: ratio {last / second:.2f}",
         last <= 1.3 * second),
        (f"aggregate ttft, off / cache >= 4: ratio {off['total'] / on['total']:.2f}",
         off["total"] >= 4 * on["total"]),
    ]
    if "cache, default router" in summaries:
        default = summaries["cache, default router"]
        checks.append((f"prefix hit rate with the prefix-aware router >= 90%: "
                       f"{on['hit']:.1%} (default router: {default['hit']:.1%})",
                       on["hit"] >= 0.9))
    print()
    for text, ok in checks:
        print(f"target {'met' if ok else 'MISSED'}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
