"""SSE reading and folding for the integration tests."""

from __future__ import annotations

import json

import httpx


def sse_events(response: httpx.Response) -> list:
    """Every `data:` payload of a stream, parsed (the final "[DONE]" kept as a string)."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_chat(client: httpx.Client, body: dict) -> tuple[list, int]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            return [r.json()], r.status_code
        return sse_events(r), r.status_code


def fold_chat(chunks: list) -> dict[int, dict]:
    """What a client that appends every delta ends up with, per choice."""
    choices: dict[int, dict] = {}
    for c in chunks:
        if c == "[DONE]" or "choices" not in c:
            continue
        for ch in c["choices"]:
            st = choices.setdefault(ch["index"], {"content": "", "reasoning_content": "",
                                                  "tool_calls": {}, "finish_reason": None})
            d = ch.get("delta", {})
            st["content"] += d.get("content") or ""
            st["reasoning_content"] += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                call = st["tool_calls"].setdefault(tc["index"], {"id": None, "name": None,
                                                                 "arguments": ""})
                if tc.get("id"):
                    call["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    call["name"] = fn["name"]
                call["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                st["finish_reason"] = ch["finish_reason"]
    return choices


def message_view(msg: dict) -> dict:
    """A non-streamed message in the folded shape."""
    return {"content": msg.get("content") or "",
            "reasoning_content": msg.get("reasoning_content") or "",
            "tool_calls": {i: {"id": tc["id"], "name": tc["function"]["name"],
                               "arguments": tc["function"]["arguments"]}
                           for i, tc in enumerate(msg.get("tool_calls") or [])}}
