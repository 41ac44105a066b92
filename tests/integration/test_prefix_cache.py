"""Prefix caching through HTTP: usage reports the cached prompt tokens, and a conversation's
turns go to the flm-tiny replica (of two) that holds its earlier turns."""

from __future__ import annotations

import pytest

from tests.integration.helpers import sse_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SYSTEM = {"role": "system", "content": "You are a terse assistant for a bicycle shop. " * 8}


def _usage_ok(usage: dict) -> int:
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 <= cached <= usage["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return cached


def test_a_conversations_turns_reuse_the_earlier_turns(client) -> None:
    """Five turns, each the whole history again: from the second turn on, the prompt up to
    the end of the previous one (whole 16-token blocks) comes from the cache, so every turn
    landed on the replica that served the one before (two replicas, prefix-aware routing)."""
    messages = [SYSTEM, {"role": "user", "content": "Which tyre fits a 28 inch rim, turn 0?"}]
    previous = 0
    for turn in range(5):
        r = client.post("/v1/chat/completions", json={
            "model": "flm-tiny", "messages": messages, "max_tokens": 6, "seed": turn})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        cached = _usage_ok(usage)
        if turn:
            assert cached >= previous // 16 * 16, (turn, usage)
        previous = usage["prompt_tokens"]
        reply = r.json()["choices"][0]["message"]["content"]
        messages = messages + [{"role": "assistant", "content": reply},
                               {"role": "user", "content": f"And for turn {turn + 1}?"}]


def test_cached_tokens_in_the_streamed_usage_and_on_completions(client) -> None:
    prompt = "Once upon a time in a bicycle shop there lived a mechanic. " * 4
    body = {"model": "flm-tiny", "prompt": prompt, "max_tokens": 3, "seed": 1}
    for _ in range(2):  # the second goes where the first went, and is served from cache
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200
    assert _usage_ok(r.json()["usage"]) >= 32
    with client.stream("POST", "/v1/completions", json={
            **body, "stream": True, "stream_options": {"include_usage": True}}) as s:
        chunks = [c for c in sse_events(s) if c != "[DONE]"]
    assert _usage_ok(chunks[-1]["usage"]) >= 32
    assert all(c["usage"] is None for c in chunks[:-1])
