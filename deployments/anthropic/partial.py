"""parse_partial: a tool_use block's input from a JSON text that may be cut short (max_tokens
ended the call): its members that were whole, as the anthropic SDK's stream reads the same
text (jiter's partial mode), so a non-streamed reply equals the stream's final message."""

from __future__ import annotations

import json

_CLOSERS = {"{": "}", "[": "]"}
_SPACE = " \t\r\n"
_SCALAR_END = _SPACE + ",:]}"


def _string_end(text: str, start: int) -> int:
    """The index just past the string literal opening at `start` (-1: it is cut)."""
    i, n = start + 1, len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return -1


def _closable_prefix(text: str) -> str:
    """The longest prefix of `text` ending after a whole value (or an opening bracket),
    closed: a cut string, key or literal is dropped with what leads to it; a number at
    the very end is kept when it is one (`12`, not `1.` or `-`)."""
    stack: list[str] = []
    cut, closers = 0, ""
    prev = ""  # the last structural character, or "v" after a value
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            continue
        if c in ",:":
            prev = c
            i += 1
            continue
        if c in "{[":
            stack.append(c)
            prev = c
        elif c in "}]":
            if stack:
                stack.pop()
            prev = "v"
        elif c == '"':
            end = _string_end(text, i)
            if end < 0:
                break
            is_key = bool(stack) and stack[-1] == "{" and prev in "{,"
            prev = ":" if is_key else "v"  # (a key is no place to cut)
            i = end
            if not is_key:
                cut, closers = i, "".join(_CLOSERS[s] for s in reversed(stack))
            continue
        else:  # a number or a literal: it ends where a delimiter starts
            end = i
            while end < n and text[end] not in _SCALAR_END:
                end += 1
            if end == n:
                try:
                    json.loads(text[i:end])
                except ValueError:
                    break
            prev, i = "v", end
            cut, closers = i, "".join(_CLOSERS[s] for s in reversed(stack))
            continue
        i += 1
        cut, closers = i, "".join(_CLOSERS[s] for s in reversed(stack))
    return text[:cut] + closers


def parse_partial(arguments: str) -> dict:
    """A tool call's arguments as its input object: the JSON object, or of a cut one the
    members that were whole (`{"a": 1, "b": "x` -> {"a": 1}); {} when nothing was."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        try:
            value = json.loads(_closable_prefix(arguments) or "{}")
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}
