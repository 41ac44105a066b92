"""ToolBlock: the protocol of a format's tool-block reader, and helpers they share."""

from __future__ import annotations

import re
from typing import Any, Protocol

from chat.builder import MessageBuilder
from chat.dialects import Status

WS = re.compile(r"[ \t\r\n]*")


class ToolBlock(Protocol):
    """Reads one tool block, from just after its opener, into builder calls.

    `feed(buf, pos, final)` consumes from `pos` and returns (new position, status):
    DONE just after the block's closer (or where the block implicitly ended), MORE when it
    needs more text, ERROR when the block is not valid. `complete()` says, once the text
    has ended inside the block, whether the calls read so far are whole.
    """

    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]: ...

    def complete(self) -> bool: ...


def expect(buf: str, pos: int, marker: str, final: bool) -> Status | None:
    """DONE if `marker` is at `pos`, MORE if the text so far could still become it,
    None otherwise."""
    if buf.startswith(marker, pos):
        return Status.DONE
    if not final and marker.startswith(buf[pos:]):
        return Status.MORE
    return None


def tool_schemas(tools: list[dict] | None) -> dict[str, dict[str, Any]]:
    """name -> JSON schema of the parameters, from an OpenAI `tools` list (or bare
    function objects)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


class CallCounter:
    """Remembers the first builder call a block made, to take its calls back."""

    def __init__(self, builder: MessageBuilder) -> None:
        self.builder = builder
        self.first = builder.call_count
