"""hermes_json: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/3, QwQ,
Hermes). Arguments stream as canonical JSON; arguments given as a JSON string holding an
object are decoded once."""

from __future__ import annotations

import json
from typing import Any

from chat.builder import MessageBuilder
from chat.dialects import Dialect, Status, ValueReader
from chat.formats.block import WS, expect
from chat.jsonout import JSONWriter

_ARG_KEYS = ("arguments", "parameters")


class CallObjectRouter:
    """Value-event handler for one `{"name": ..., "arguments": ...}` object.

    The name is held until complete, then the call starts and argument events stream
    through a `JSONWriter`; arguments seen before the name wait for it. `names`: the only
    names a call may have; `keys`: the only keys the object may hold (both where a plain
    JSON object could be taken for a call: llama3_json's bare calls).
    """

    def __init__(self, builder: MessageBuilder, *, names: frozenset[str] | None = None,
                 keys: frozenset[str] | None = None) -> None:
        self.b = builder
        self.names = names
        self.keys = keys
        self.writer = JSONWriter(builder.call_args)
        self.depth = 0
        self.cur = ""
        self.name: str | None = None
        self.name_parts: list[str] | None = None
        self.string_args: list[str] | None = None
        self.args_seen = False
        self.started = False
        self.queued: list[tuple[str, tuple]] = []
        self.error = False

    def _args(self, event: str, *args: Any) -> None:
        if self.started:
            getattr(self.writer, event)(*args)
        else:
            self.queued.append((event, args))

    def _route(self, event: str, *args: Any, opens: int = 0) -> None:
        """An event inside the object below depth 1: forward it if it is arguments."""
        if self.cur in _ARG_KEYS:
            self.args_seen = True
            self._args(event, *args)
        self.depth += opens

    def obj_start(self) -> None:
        if self.depth == 0:
            self.depth = 1
            return
        self._route("obj_start", opens=1)

    def arr_start(self) -> None:
        if self.depth == 0:
            self.error = True
            return
        self._route("arr_start", opens=1)

    def obj_end(self) -> None:
        if self.depth == 1:
            self.depth = 0
            self._finish()
            return
        self.depth -= 1
        self._route("obj_end")

    def arr_end(self) -> None:
        self.depth -= 1
        self._route("arr_end")

    def key(self, name: str) -> None:
        if self.depth == 1:
            self.cur = name
            if self.args_seen and name in _ARG_KEYS:
                self.error = True  # arguments given twice
            if self.keys is not None and name not in self.keys:
                self.error = True  # an object, not a call
            elif (name in _ARG_KEYS and self.name is not None and not self.started
                  and not self.error):
                self._begin()
            return
        self._route("key", name)

    def str_start(self) -> None:
        if self.depth == 1:
            if self.cur == "name":
                self.name_parts = []
                return
            if self.cur in _ARG_KEYS:
                self.args_seen = True
                self.string_args = []
                return
        self._route("str_start")

    def str_chunk(self, text: str) -> None:
        if self.depth == 1:
            if self.cur == "name" and self.name_parts is not None:
                self.name_parts.append(text)
                return
            if self.cur in _ARG_KEYS and self.string_args is not None:
                self.string_args.append(text)
                return
        self._route("str_chunk", text)

    def str_end(self) -> None:
        if self.depth == 1:
            if self.cur == "name" and self.name_parts is not None:
                self._start("".join(self.name_parts))
                self.name_parts = None
                return
            if self.cur in _ARG_KEYS and self.string_args is not None:
                self._decode_string_args("".join(self.string_args))
                self.string_args = None
                return
        self._route("str_end")

    def scalar(self, text: str) -> None:
        if self.depth == 1 and self.cur in _ARG_KEYS:
            self.error = True  # arguments must be an object
            return
        self._route("scalar", text)

    def _start(self, name: str) -> None:
        if self.error or self.name is not None or not name or (
                self.names is not None and name not in self.names):
            self.error = True
            return
        self.name = name
        if self.keys is not None and not self.args_seen:
            return  # an object that may not be a call is one once its arguments begin
        self._begin()

    def _begin(self) -> None:
        assert self.name is not None
        self.b.call_start(self.name)
        self.started = True
        for event, args in self.queued:
            getattr(self.writer, event)(*args)
        self.queued = []

    def _decode_string_args(self, text: str) -> None:
        try:
            value = json.loads(text)
        except ValueError:
            self.error = True
            return
        if not isinstance(value, dict):
            self.error = True
            return
        self._args("value", value)

    def _finish(self) -> None:
        if self.name is None or not self.started:  # no name; or no arguments where required
            self.error = True
            return
        if not self.args_seen:
            self.b.call_args("{}")

    @property
    def done(self) -> bool:
        return self.depth == 0 and self.name is not None


class JSONCallBlock:
    """Reads `{...}` call objects up to `closer` (several objects may share a block, parted
    by whitespace or one of `separators`). With no closer the block ends where something
    other than a call follows one, or with the text. `names` and `keys`: see
    `CallObjectRouter`."""

    def __init__(self, builder: MessageBuilder, closer: str, *, separators: str = "",
                 names: frozenset[str] | None = None,
                 keys: frozenset[str] | None = None) -> None:
        self.b = builder
        self.closer = closer
        self.separators = separators
        self.names, self.keys = names, keys
        self.parted = False  # a separator was read after the last call
        self.first = builder.call_count  # the calls of the object being read start here
        self.raw: list[str] = []  # its text so far
        self.router: CallObjectRouter | None = None
        self.reader: ValueReader | None = None
        self.calls = 0

    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]:
        while True:
            if self.reader is not None:
                assert self.router is not None
                start = pos
                pos, status = self.reader.feed(buf, pos, final)
                self.raw.append(buf[start:pos])
                failed = self.router.error or status is Status.ERROR
                if failed and (self.closer or not self.calls):
                    return pos, Status.ERROR
                # a later object of a block with no closer that is no call, or that the
                # text ends in: read to its end (so where it ends does not depend on how
                # the text came in pieces), it is content; the calls before it are kept
                later = not self.closer and self.calls
                if failed or (later and final and status is Status.MORE):
                    if status is Status.MORE and not final:
                        return pos, Status.MORE
                    self.b.drop_calls(self.first)
                    self.b.text("content", "".join(self.raw))
                    self.reader = self.router = None
                    return pos, Status.DONE
                if status is Status.MORE:
                    return pos, Status.MORE
                self.reader = self.router = None
                self.calls += 1
                self.parted = False
            pos = WS.match(buf, pos).end()
            if pos >= len(buf):
                return pos, Status.MORE
            if self.calls and not self.parted and buf[pos] in self.separators:
                after = WS.match(buf, pos + 1).end()
                if after >= len(buf):
                    return pos, Status.MORE  # the separator is read with what follows it
                if buf[after] != "{":
                    return pos, Status.DONE  # no call follows: the separator is content
                self.parted = True
                pos = after
            st = expect(buf, pos, self.closer, final) if self.closer else None
            if st is Status.DONE:  # a block of no calls is not one
                return pos + len(self.closer), (Status.DONE if self.calls else Status.ERROR)
            if st is Status.MORE:
                return pos, Status.MORE
            if buf[pos] != "{":
                # no call object here: the block ends implicitly after a call
                return pos, (Status.DONE if self.calls else Status.ERROR)
            self.router = CallObjectRouter(self.b, names=self.names, keys=self.keys)
            self.reader = ValueReader(self.router, Dialect.JSON)
            self.first, self.raw = self.b.call_count, []

    def complete(self) -> bool:
        return self.reader is None and self.calls > 0


def hermes_block(builder: MessageBuilder, opener: str, closer: str) -> JSONCallBlock:
    return JSONCallBlock(builder, closer)
