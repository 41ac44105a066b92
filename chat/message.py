"""ChatMsg, ToolCall and Delta: a parsed assistant turn and the pieces a stream sends.

`compute_deltas(prev, cur)` turns two successive parses into deltas; a field that fails to
extend its previous value is logged and skipped, never sent as a contradiction.
"""

from __future__ import annotations

import logging
import secrets
import string
from typing import Literal

import msgspec

log = logging.getLogger(__name__)

DeltaField = Literal["reasoning_content", "content", "tool_call"]

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A tool call id: `call_` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call; `arguments` is JSON text (an object once the call is complete)."""

    name: str
    arguments: str
    id: str = ""


class ChatMsg(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed assistant turn. Absent fields are empty strings / an empty list."""

    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """What one field gained. For "tool_call", `text` is the arguments suffix, and
    `id`/`name` are set on the call's first delta only."""

    field: DeltaField
    text: str
    index: int = 0
    id: str = ""
    name: str = ""


def compute_deltas(prev: ChatMsg, cur: ChatMsg) -> list[Delta]:
    """The deltas that take a client from `prev` to `cur`.

    Args:
        prev: the message already sent.
        cur: the new parse; each field should extend the same field of `prev`.

    Returns:
        One delta per field that grew: reasoning, content, then each tool call in order
        (a first delta with id, name and arguments so far, or an arguments suffix).
        A field that does not extend its previous value is logged and skipped.
    """
    out: list[Delta] = []
    for field in ("reasoning_content", "content"):
        before, after = getattr(prev, field), getattr(cur, field)
        suffix = _suffix(before, after, field)
        if suffix:
            out.append(Delta(field=field, text=suffix))
    for index, call in enumerate(cur.tool_calls):
        if index >= len(prev.tool_calls):
            out.append(
                Delta(
                    field="tool_call",
                    text=call.arguments,
                    index=index,
                    id=call.id or new_call_id(),
                    name=call.name,
                )
            )
            continue
        old = prev.tool_calls[index]
        if old.name != call.name:
            log.warning("chat parser rewrote already streamed tool call %d name", index)
            continue
        suffix = _suffix(old.arguments, call.arguments, f"tool call {index} arguments")
        if suffix:
            out.append(Delta(field="tool_call", text=suffix, index=index))
    if len(cur.tool_calls) < len(prev.tool_calls):
        log.warning("chat parser dropped %d streamed tool call(s)",
                    len(prev.tool_calls) - len(cur.tool_calls))
    return out


def _suffix(before: str, after: str, what: str) -> str:
    if after.startswith(before):
        return after[len(before) :]
    log.warning("chat parser rewrote already streamed %s; skipping it", what)
    return ""
