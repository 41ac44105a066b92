"""lfm2_pythonic: `<|tool_call_start|>[f(a=1, b='x'), g()]<|tool_call_end|>` (LFM2, LFM2.5).

Arguments are Python keyword arguments read by the Python dialect (both quote styles,
True/False/None, dicts, lists, sets, tuples, and the broken forms models write). A call
whose arguments cannot be converted is dropped and its siblings kept. A block holding a
JSON call object (what LFM2-8B-A1B's template asks for) is read as hermes_json's.
"""

from __future__ import annotations

import re

from chat.builder import MessageBuilder
from chat.dialects import Dialect, Status, ValueReader
from chat.formats.block import WS, expect
from chat.formats.hermes_json import JSONCallBlock
from chat.jsonout import JSONWriter

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_SKIP_CALL = re.compile(r"\)\s*(?=[,\]])")


class LFM2Block:
    def __init__(self, builder: MessageBuilder, closer: str) -> None:
        self.b = builder
        self.closer = closer
        self.state = "lead"
        self.reader: ValueReader | None = None
        self.json_block: JSONCallBlock | None = None
        self.call_index = -1

    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]:
        n = len(buf)
        while True:
            state = self.state
            if state == "json":
                assert self.json_block is not None
                return self.json_block.feed(buf, pos, final)
            if state == "args":
                assert self.reader is not None
                pos, status = self.reader.feed(buf, pos, final)
                if status is Status.MORE:
                    return pos, status
                if status is Status.ERROR:
                    self.b.drop_calls(self.call_index)
                    self.state = "skip"
                    continue
                self.state = "after_call"
                continue
            if state == "skip":  # a call that did not convert: skip to its end
                m = _SKIP_CALL.search(buf, pos)
                if m is None:
                    if final:
                        return n, Status.MORE
                    paren = buf.rfind(")", pos)
                    return (paren if paren >= 0 else n), Status.MORE
                pos = m.end()
                self.state = "after_call"
                continue
            pos = WS.match(buf, pos).end()
            if pos >= n:
                return pos, Status.MORE
            c = buf[pos]
            if state == "lead":
                if c == "[":
                    self.state = "call_or_end"
                    pos += 1
                    continue
                if c == "{":
                    self.json_block = JSONCallBlock(self.b, self.closer)
                    self.state = "json"
                    continue
                return pos, Status.ERROR
            if state == "call_or_end":
                if c == "]":
                    self.state = "end"
                    pos += 1
                    continue
                self.state = "call"
                continue
            if state == "call":
                m = _NAME.match(buf, pos)
                if m is None:
                    return pos, Status.ERROR
                after = WS.match(buf, m.end()).end()
                if after >= n:
                    return pos, Status.MORE
                if buf[after] != "(":
                    return pos, Status.ERROR
                self.call_index = self.b.call_start(m.group())
                self.reader = ValueReader(
                    JSONWriter(self.b.call_args), Dialect.PYTHON, kwargs_close=")"
                )
                pos = after + 1
                self.state = "args"
                continue
            if state == "after_call":
                if c == ",":
                    self.state = "call"
                    pos += 1
                    continue
                if c == "]":
                    self.state = "end"
                    pos += 1
                    continue
                return pos, Status.ERROR
            # state == "end": the list is closed, the block closer follows
            st = expect(buf, pos, self.closer, final)
            if st is Status.DONE:
                return pos + len(self.closer), Status.DONE
            if st is Status.MORE:
                return pos, Status.MORE
            return pos, Status.DONE

    def complete(self) -> bool:
        if self.json_block is not None:
            return self.json_block.complete()
        return self.state in ("after_call", "end")


def lfm2_block(builder: MessageBuilder, opener: str, closer: str) -> LFM2Block:
    return LFM2Block(builder, closer)
