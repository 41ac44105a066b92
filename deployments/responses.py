"""OpenAI response shapes: stream chunks (already SSE-encoded) and folded final bodies."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.events import Deltas, TokenLogprob, Usage
from chat import ChatMsg

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def usage_body(u: Usage) -> dict:
    """OpenAI's `usage`: `prompt_tokens` is the whole prompt, of which
    `prompt_tokens_details.cached_tokens` came from the KV cache."""
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def chat_delta(event: Deltas, *, first: bool) -> dict:
    """The `delta` object of a chat chunk (several fields may grow in one event)."""
    delta: dict[str, Any] = {"role": "assistant"} if first else {}
    for d in event.deltas:
        if d.field == "tool_call":
            call: dict[str, Any] = {"index": d.index}
            if d.name:
                call.update(id=d.id, type="function",
                            function={"name": d.name, "arguments": d.text})
            else:
                call["function"] = {"arguments": d.text}
            delta.setdefault("tool_calls", []).append(call)
        else:
            delta[d.field] = delta.get(d.field, "") + d.text
    return delta


def chat_logprobs(items: list[TokenLogprob] | None) -> dict | None:
    if items is None:
        return None
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": b}
                                          for s, v, b in t.top]} for t in items]}


def completion_logprobs(items: list[TokenLogprob] | None, offset: int) -> dict | None:
    if items is None:
        return None
    offsets, pos = [], offset
    for t in items:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [{s: v for s, v, _ in t.top} for t in items],
            "text_offset": offsets}


class ChoiceFold:
    """A choice's final state, folded from its events exactly as a client folds chunks."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, dict] = {}
        self.logprobs: list[TokenLogprob] | None = None
        self.finish_reason: str | None = None
        self.final: ChatMsg | None = None

    def add(self, event: Deltas) -> None:
        for d in event.deltas:
            if d.field == "reasoning_content":
                self.reasoning.append(d.text)
            elif d.field == "content":
                self.content.append(d.text)
            elif d.name:
                self.calls[d.index] = {"id": d.id, "type": "function",
                                       "function": {"name": d.name, "arguments": d.text}}
            elif d.index in self.calls:
                self.calls[d.index]["function"]["arguments"] += d.text
        if event.text:
            self.content.append(event.text)
        if event.logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(event.logprobs)

    def chat_message(self) -> dict:
        if self.final is not None:
            return message_from(self.final)
        content = "".join(self.content)
        msg: dict[str, Any] = {"role": "assistant",
                               "content": content if content or not self.calls else None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return msg


def message_from(msg: ChatMsg) -> dict:
    """An OpenAI assistant message from a final parse."""
    calls = [{"id": c.id, "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}} for c in msg.tool_calls]
    out: dict[str, Any] = {"role": "assistant",
                           "content": msg.content if msg.content or not calls else None}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if calls:
        out["tool_calls"] = calls
    return out
