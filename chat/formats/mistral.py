"""mistral_json and mistral_args: what follows Mistral's `[TOOL_CALLS]`.

Both syntaxes are read whichever the template writes (a model fine-tuned across tokenizer
versions may write either): a JSON list of `{"name": ..., "arguments": {...}}` objects
(tokenizers v3 / Tekken v7: Mistral 7B v0.3, Nemo), or `NAME[ARGS]{...}`, with an optional
`[CALL_ID]id` before `[ARGS]` (v11 on: Small 3.1+, Devstral, Magistral, Ministral 3), one
call per `[TOOL_CALLS]`. The calls run to the end of the turn: there is no closer.
"""

from __future__ import annotations

import re

from chat.builder import MessageBuilder
from chat.dialects import Dialect, Status, ValueReader
from chat.formats.block import WS, expect
from chat.formats.hermes_json import JSONCallBlock
from chat.jsonout import JSONWriter
from chat.spec import MISTRAL_ARGS, MISTRAL_CALL_ID

_NAME = re.compile(r"[^\[\]{}\s]*")
_CALL_ID = re.compile(r"[A-Za-z0-9_-]*")


class MistralBlock:
    """Reads one `[TOOL_CALLS]` block (see the module's docstring)."""

    def __init__(self, builder: MessageBuilder) -> None:
        self.b = builder
        self.state = "start"
        self.name = ""
        self.listed: JSONCallBlock | None = None
        self.reader: ValueReader | None = None

    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]:
        n = len(buf)
        if self.state == "start":
            pos = WS.match(buf, pos).end()
            if pos >= n:
                return pos, Status.MORE
            if buf[pos] == "[":
                self.listed = JSONCallBlock(self.b, "]", separators=",")
                self.state = "list"
                pos += 1
            else:
                self.state = "name"
        if self.state == "list":
            assert self.listed is not None
            return self.listed.feed(buf, pos, final)
        if self.state == "name":
            end = _NAME.match(buf, pos).end()
            if end >= n:
                return pos, Status.MORE
            if end == pos:
                return pos, Status.ERROR
            self.name = buf[pos:end]
            pos = end
            self.state = "marker"
        if self.state == "marker":  # [CALL_ID]id or [ARGS] after the name
            st = expect(buf, pos, MISTRAL_CALL_ID, final)
            if st is Status.MORE:
                return pos, Status.MORE
            if st is Status.DONE:
                end = _CALL_ID.match(buf, pos + len(MISTRAL_CALL_ID)).end()
                if end >= n:
                    return pos, Status.MORE
                pos = end
            self.state = "args_marker"
        if self.state == "args_marker":
            st = expect(buf, pos, MISTRAL_ARGS, final)
            if st is not Status.DONE:
                return pos, (Status.MORE if st is Status.MORE or pos >= n else Status.ERROR)
            after = WS.match(buf, pos + len(MISTRAL_ARGS)).end()
            if after >= n:
                return pos, Status.MORE  # read again once the arguments begin
            if buf[after] != "{":
                return pos, Status.ERROR
            pos = after
            self.b.call_start(self.name)
            self.reader = ValueReader(JSONWriter(self.b.call_args), Dialect.JSON)
            self.state = "args"
        assert self.reader is not None
        pos, status = self.reader.feed(buf, pos, final)
        if status is Status.DONE:
            self.state = "done"
        return pos, status

    def complete(self) -> bool:
        if self.listed is not None:
            return self.listed.complete()
        return self.state == "done"


def mistral_block(builder: MessageBuilder, opener: str, closer: str) -> MistralBlock:
    return MistralBlock(builder)
