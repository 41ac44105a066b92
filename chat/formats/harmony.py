"""harmony (gpt-oss): `<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]
<|message|>BODY<|end|>` messages. `analysis` is reasoning, `final` and `commentary` are
content, a `functions.NAME` recipient makes the body a call's JSON arguments, and other
recipients (built-in tools) are not shown."""

from __future__ import annotations

import re

from chat.builder import MessageBuilder
from chat.dialects import Dialect, Status, ValueReader
from chat.formats.block import WS
from chat.jsonout import JSONWriter
from chat.scan import Markers
from chat.spec import (
    HARMONY_CALL,
    HARMONY_CHANNEL,
    HARMONY_END,
    HARMONY_MESSAGE,
    HARMONY_RETURN,
    HARMONY_START,
)

_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"[^\s<]*")
FUNCTIONS = "functions."

_HEADER, _TEXT, _CALL, _IGNORE, _AFTER = range(5)


class HarmonyParser:
    def __init__(self, builder: MessageBuilder, *, parse_tool_calls: bool = True) -> None:
        self.b = builder
        self.parse_tool_calls = parse_tool_calls
        self.buf = ""
        self.mode = _HEADER
        self.field = "content"
        self.reader: ValueReader | None = None
        self.call_index = -1
        self.body_end = Markers(HARMONY_END, HARMONY_CALL, HARMONY_RETURN, HARMONY_START)
        self.message = Markers(HARMONY_MESSAGE)
        self._scanned = 0

    @property
    def cut_block(self) -> str:
        """Harmony's calls are named in their header, before any text of theirs: none."""
        return ""

    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside a call's arguments."""
        return self.mode == _CALL

    def feed(self, text: str, final: bool) -> None:
        buf = self.buf + text if self.buf else text
        pos = 0
        while True:
            step = self._step(buf, pos, final)
            if step is None:
                break
            pos = step
        self.buf = "" if final else buf[pos:]
        if final:
            self.b.end_segments()

    def _step(self, buf: str, pos: int, final: bool) -> int | None:
        n = len(buf)
        mode = self.mode
        if mode == _HEADER:
            at = buf.find(HARMONY_MESSAGE, pos + self._scanned)
            if at < 0:
                if not final:
                    self._scanned = max(0, n - pos - len(HARMONY_MESSAGE) + 1)
                    return None
                header = buf[pos:]
                if "<|" not in header and "to=" not in header:
                    self.b.text("content", header)  # plain text with no harmony markup
                return None if pos >= n else n
            self._scanned = 0
            self._open_body(buf[pos:at])
            return at + len(HARMONY_MESSAGE)
        if mode == _AFTER:
            p = WS.match(buf, pos).end()
            if p >= n:
                return None if p == pos else p
            if buf.startswith(HARMONY_START, p):
                self.mode = _HEADER
                return p + len(HARMONY_START)
            if not final and HARMONY_START.startswith(buf[p:]):
                return None if p == pos else p
            self.mode = _HEADER
            return p
        if mode == _CALL:
            assert self.reader is not None
            end, status = self.reader.feed(buf, pos, final)
            if status is Status.MORE:
                if final:
                    self.b.drop_calls(self.call_index)
                    return None
                return None if end == pos else end
            if status is Status.ERROR:
                self.b.drop_calls(self.call_index)
            self.mode = _IGNORE
            return end
        # _TEXT or _IGNORE: a body up to its end marker
        if pos >= n:
            return None
        at, marker = self.body_end.find(buf, pos)
        if at < 0:
            end = n if final else n - self.body_end.hold(buf, pos)
            if mode == _TEXT and end > pos:
                self.b.text(self.field, buf[pos:end])
            return end if end > pos else None
        if mode == _TEXT:
            self.b.text(self.field, buf[pos:at])
            self.b.end_segment(self.field)
        self.mode = _HEADER if marker == HARMONY_START else _AFTER
        return at + len(marker)

    def _open_body(self, header: str) -> None:
        recipients = _RECIPIENT.findall(header)
        recipient = recipients[-1] if recipients else ""
        at = header.rfind(HARMONY_CHANNEL)
        channel = ""
        if at >= 0:
            m = _CHANNEL_NAME.match(header, at + len(HARMONY_CHANNEL))
            channel = m.group() if m else ""
        if recipient.startswith(FUNCTIONS) and self.parse_tool_calls:
            self.call_index = self.b.call_start(recipient[len(FUNCTIONS) :])
            self.reader = ValueReader(JSONWriter(self.b.call_args), Dialect.JSON)
            self.mode = _CALL
        elif recipient and recipient != "assistant" and not recipient.startswith(FUNCTIONS):
            self.mode = _IGNORE
        else:
            self.field = "reasoning_content" if channel == "analysis" else "content"
            self.mode = _TEXT
