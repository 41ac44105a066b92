"""MessageBuilder: the append-only sink that parsers write a turn into.

Reasoning and content are written as segments: each segment is trimmed, and non-empty
segments of one field are joined with "\\n\\n". Trailing whitespace is held until more text
of the same segment follows, so everything the builder has emitted is final: this is what
makes every field of a partial parse a prefix of the same field of any longer parse.
"""

from __future__ import annotations

from chat.message import ChatMsg, ToolCall

SEGMENT_JOIN = "\n\n"


class _Field:
    __slots__ = ("parts", "nonempty", "open", "pending_ws")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.nonempty = False
        self.open = False
        self.pending_ws = ""

    def write(self, text: str) -> str:
        """Append `text` to the open segment; returns what became final."""
        if not self.open:
            text = text.lstrip()
            if not text:
                return ""
            self.open = True
            if self.nonempty:
                text = SEGMENT_JOIN + text
        body = text.rstrip()
        if not body:
            self.pending_ws += text
            return ""
        out = self.pending_ws + body if self.pending_ws else body
        self.pending_ws = text[len(body) :]
        self.parts.append(out)
        self.nonempty = True
        return out

    def end_segment(self) -> None:
        self.open = False
        self.pending_ws = ""


class _Call:
    __slots__ = ("name", "parts", "dropped")

    def __init__(self, name: str) -> None:
        self.name = name
        self.parts: list[str] = []
        self.dropped = False


class MessageBuilder:
    """Collects a turn from parser events and logs what changed since the last `drain()`.

    The log holds ("reasoning_content" | "content", text) and ("call", index, text)
    entries, in order; `drain()` returns and clears it.
    """

    def __init__(self) -> None:
        self._fields = {"reasoning_content": _Field(), "content": _Field()}
        self._calls: list[_Call] = []
        self.log: list[tuple] = []
        self.dropped = False  # some streamed call was taken back (a parse fell back)

    # -- text -------------------------------------------------------------------------
    def text(self, field: str, text: str) -> None:
        if text:
            out = self._fields[field].write(text)
            if out:
                self.log.append((field, out))

    def end_segment(self, field: str) -> None:
        self._fields[field].end_segment()

    def continue_segment(self, field: str) -> None:
        """Text written next goes on an open segment: its leading whitespace is kept (a
        turn the client began, which the model continues)."""
        self._fields[field].open = True

    def end_segments(self) -> None:
        for f in self._fields.values():
            f.end_segment()

    # -- tool calls -------------------------------------------------------------------
    def call_start(self, name: str) -> int:
        self._calls.append(_Call(name))
        index = len(self._calls) - 1
        self.log.append(("call_start", index, name))
        return index

    def call_args(self, text: str) -> None:
        if text:
            self._calls[-1].parts.append(text)
            self.log.append(("call", len(self._calls) - 1, text))

    @property
    def call_count(self) -> int:
        return len(self._calls)

    def drop_calls(self, first: int) -> None:
        """Take back the calls from index `first` on (their block did not parse)."""
        for call in self._calls[first:]:
            if not call.dropped:
                call.dropped = True
                self.dropped = True
                self.log.append(("call_drop", self._calls.index(call)))

    # -- results ----------------------------------------------------------------------
    def drain(self) -> list[tuple]:
        out, self.log = self.log, []
        return out

    def message(self, ids: dict[int, str] | None = None) -> ChatMsg:
        ids = ids or {}
        calls = [
            ToolCall(name=c.name, arguments="".join(c.parts), id=ids.get(i, ""))
            for i, c in enumerate(self._calls)
            if not c.dropped
        ]
        return ChatMsg(
            reasoning_content="".join(self._fields["reasoning_content"].parts),
            content="".join(self._fields["content"].parts),
            tool_calls=calls,
        )
