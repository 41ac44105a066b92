"""Helpers for chat tests: fold streamed deltas back into a message, compare messages."""

from __future__ import annotations

import json
import random

from chat import ChatMsg, ChatStream, Delta, ToolCall


def fold(deltas: list[Delta]) -> ChatMsg:
    """What a client that appends every delta ends up with."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, list] = {}
    for d in deltas:
        if d.field == "reasoning_content":
            reasoning.append(d.text)
        elif d.field == "content":
            content.append(d.text)
        else:
            if d.name:
                assert d.index not in calls, f"second first-delta for call {d.index}"
                assert d.id.startswith("call_") and len(d.id) == 29
                calls[d.index] = [d.name, [d.text], d.id]
            else:
                assert d.index in calls, f"arguments delta before the first delta of {d.index}"
                calls[d.index][1].append(d.text)
    return ChatMsg(
        reasoning_content="".join(reasoning),
        content="".join(content),
        tool_calls=[ToolCall(name=n, arguments="".join(a), id=i) for n, a, i in
                    (calls[k] for k in sorted(calls))],
    )


def stream_pieces(stream: ChatStream, text: str, rng: random.Random, *,
                  max_piece: int = 8, final: bool = True) -> list[Delta]:
    """Feed `text` in random pieces, then the final update."""
    out: list[Delta] = []
    i = 0
    while i < len(text):
        k = rng.randint(1, max_piece)
        out += stream.update(text[i : i + k])
        i += k
    if final:
        out += stream.update("", final=True)
    return out


def without_ids(msg: ChatMsg) -> ChatMsg:
    return ChatMsg(
        reasoning_content=msg.reasoning_content,
        content=msg.content,
        tool_calls=[ToolCall(name=c.name, arguments=c.arguments) for c in msg.tool_calls],
    )


def is_prefix_msg(a: ChatMsg, b: ChatMsg) -> str | None:
    """None when every field of `a` is a prefix of the same field of `b`, else why not."""
    if not b.reasoning_content.startswith(a.reasoning_content):
        return f"reasoning {a.reasoning_content!r} -> {b.reasoning_content!r}"
    if not b.content.startswith(a.content):
        return f"content {a.content!r} -> {b.content!r}"
    if len(a.tool_calls) > len(b.tool_calls):
        return f"calls {len(a.tool_calls)} -> {len(b.tool_calls)}"
    for i, (x, y) in enumerate(zip(a.tool_calls, b.tool_calls)):
        if x.name != y.name or not y.arguments.startswith(x.arguments):
            return f"call {i}: {x} -> {y}"
    return None


def calls_as_objects(msg: ChatMsg) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]
