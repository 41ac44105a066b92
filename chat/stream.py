"""ChatStream: parses a turn as it is generated and returns what each piece added.

The parser resumes from its last stable point (it keeps only text it has not consumed),
so an update costs time in the new text only, and the fields it builds are exactly those
of `parse(spec, prefill + all_text, ...)`.
"""

from __future__ import annotations

import logging

from chat.builder import MessageBuilder
from chat.formats import make_parser
from chat.message import ChatMsg, Delta, new_call_id
from chat.spec import FormatSpec

log = logging.getLogger(__name__)


class ChatStream:
    """Streaming parse of one turn.

    Args:
        spec: the model's format.
        prefill: what `format_prefill` returned for the prompt.
        parse_tool_calls: see `parse`.
        tools: see `parse`.
        continuing: the turn's content was begun by the client (a prefill the model goes
            on writing): the first content keeps its leading whitespace.
    """

    def __init__(
        self,
        spec: FormatSpec,
        *,
        prefill: str = "",
        parse_tool_calls: bool = True,
        tools: list[dict] | None = None,
        continuing: bool = False,
    ) -> None:
        self.spec = spec
        self._builder = MessageBuilder()
        self._parser = make_parser(
            spec, self._builder, parse_tool_calls=parse_tool_calls, tools=tools
        )
        self._ids: dict[int, str] = {}  # builder call index -> id
        self._stream_index: dict[int, int] = {}  # builder call index -> index sent
        self._finished = False
        self._broken = False
        if prefill:
            self._feed(prefill, False)
        if continuing:
            self._builder.continue_segment("content")

    @property
    def message(self) -> ChatMsg:
        """The parse so far (tool calls carry the ids the stream gave them)."""
        return self._builder.message(self._ids)

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def cut_block(self) -> str:
        """The raw text of a tool block begun with no call in it named yet: what an output
        cut there (by a token limit) wrote that `message` does not show."""
        return "" if self._broken or self._finished else self._parser.cut_block

    @property
    def in_call(self) -> bool:
        """Whether the turn so far ends inside a tool call (or a tool block begun): an
        output cut there keeps the call (`update` without `final`), never its markup."""
        return not (self._broken or self._finished) and self._parser.in_call

    def update(self, text_piece: str, final: bool = False) -> list[Delta]:
        """Append `text_piece`; `final=True` ends the turn and releases held-back text.

        Returns:
            One delta per field that grew: reasoning, content, then tool calls.
        """
        if self._finished:
            if text_piece:
                log.warning("ChatStream.update after the final update; ignored")
            return []
        self._finished = final
        self._feed(text_piece, final)
        return self._deltas(self._builder.drain())

    def _feed(self, text: str, final: bool) -> None:
        if self._broken:
            self._builder.text("content", text)
            return
        try:
            self._parser.feed(text, final)
        except Exception:  # a parser bug must not lose the text
            log.exception("chat parser failed on a %s stream; the rest goes out as content",
                          self.spec.kind)
            self._broken = True
            self._builder.text("content", text)

    def _deltas(self, events: list[tuple]) -> list[Delta]:
        reasoning: list[str] = []
        content: list[str] = []
        calls: dict[int, list] = {}  # builder index -> [name or None, [args pieces]]
        for event in events:
            kind = event[0]
            if kind == "content":
                content.append(event[1])
            elif kind == "reasoning_content":
                reasoning.append(event[1])
            elif kind == "call":
                calls.setdefault(event[1], [None, []])[1].append(event[2])
            elif kind == "call_start":
                calls[event[1]] = [event[2], []]
            elif kind == "call_drop":
                index = event[1]
                if index in self._stream_index:
                    log.warning("chat parser took back streamed tool call %d", index)
                calls.pop(index, None)
        out: list[Delta] = []
        if reasoning:
            out.append(Delta(field="reasoning_content", text="".join(reasoning)))
        if content:
            out.append(Delta(field="content", text="".join(content)))
        for index in sorted(calls):
            name, parts = calls[index]
            args = "".join(parts)
            if name is not None:
                call_id = self._ids[index] = new_call_id()
                sent = self._stream_index[index] = len(self._stream_index)
                out.append(Delta(field="tool_call", text=args, index=sent, id=call_id, name=name))
            elif args and index in self._stream_index:
                out.append(Delta(field="tool_call", text=args, index=self._stream_index[index]))
        return out
