"""gemma4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`, reasoning in
`<|channel>thought\\n...<channel|>`; the turn stops at `<|tool_response>`."""

from __future__ import annotations

import re

from chat.builder import MessageBuilder
from chat.dialects import Dialect, Status, ValueReader
from chat.formats.block import WS, expect
from chat.jsonout import JSONWriter

CALL_PREFIX = "call:"
CHANNEL_NAME = "thought"
_NAME = re.compile(r"[^{<\s]*")


class Gemma4Block:
    def __init__(self, builder: MessageBuilder, closer: str) -> None:
        self.b = builder
        self.closer = closer
        self.reader: ValueReader | None = None
        self.state = "prefix"

    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]:
        n = len(buf)
        if self.state == "prefix":
            pos = WS.match(buf, pos).end()
            st = expect(buf, pos, CALL_PREFIX, final)
            if st is Status.MORE or pos >= n:
                return pos, Status.MORE
            if st is None:
                return pos, Status.ERROR
            pos += len(CALL_PREFIX)
            self.state = "name"
        if self.state == "name":
            m = _NAME.match(buf, pos)
            end = m.end()
            if end >= n:
                return pos, Status.MORE
            if buf[end] != "{" or end == pos:
                return pos, Status.ERROR
            self.b.call_start(m.group())
            self.reader = ValueReader(JSONWriter(self.b.call_args), Dialect.GEMMA4)
            pos = end
            self.state = "args"
        if self.state == "args":
            assert self.reader is not None
            pos, status = self.reader.feed(buf, pos, final)
            if status is not Status.DONE:
                return pos, status
            self.state = "close"
        pos = WS.match(buf, pos).end()
        if pos >= n:
            return pos, Status.MORE
        st = expect(buf, pos, self.closer, final)
        if st is Status.DONE:
            return pos + len(self.closer), Status.DONE
        if st is Status.MORE:
            return pos, Status.MORE
        return pos, Status.DONE  # the block ends implicitly after its call

    def complete(self) -> bool:
        return self.state == "close"


def gemma4_block(builder: MessageBuilder, opener: str, closer: str) -> Gemma4Block:
    return Gemma4Block(builder, closer)
