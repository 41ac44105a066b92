"""TaggedParser: the scanner shared by every tag format (hermes_json, qwen_xml, gemma4,
lfm2_pythonic, content_only).

Content runs until a reasoning opener or a tool opener; reasoning until its closer; a tool
block is read by the format's `ToolBlock`. Reasoning comes first: once it has closed, or once
content has shown more than whitespace, a reasoning opener is the answer's own text (a reply
about `<think>` tags, a JSON string or code holding one), as the constraint's grammar reads
it (reasoning, then the answer), and so is a closer that follows one; a closer on its own
is dropped (a stray one). Gemma 4 is the exception: its channel markers are control tokens
and a thought block may follow the answer (an empty one, dropped, as llama.cpp reads it).
Text that could still become a marker is held back, and the parser keeps only the text it
has not consumed, so feeding text in any pieces gives the same events and each update costs
time in the new text only.
"""

from __future__ import annotations

from collections.abc import Callable

from chat.builder import MessageBuilder
from chat.dialects import Status
from chat.formats.block import WS, ToolBlock
from chat.scan import Markers
from chat.spec import LLAMA3_CALL_BEGIN, FormatSpec

REASONING = "reasoning_content"
CONTENT = "content"

BlockFactory = Callable[[MessageBuilder, str], ToolBlock]

# modes
_CONTENT, _REASONING, _HEADER, _TENTATIVE, _TOOL, _RAW, _POST_CALL, _STOPPED = range(8)


class TaggedParser:
    """Parses one turn of a tag format into a `MessageBuilder`.

    Args:
        spec: the format.
        builder: where the turn goes.
        block: makes the reader of a tool block from (builder, opener); None: no tools.
        openers: the markers that open a tool block (the spec's tool_start and, for
            qwen_xml, a bare `<function=`).
        channel_name: Gemma4: the channel name after the reasoning opener, dropped.
        echo_after_call: LFM2: drop a call list echoed after a call block.

    A format whose calls may be bare (`spec.bare_call`, llama3_json) also opens a block at
    a `{` that begins the turn, and at its `{"name": ` opener, both read by the block
    itself (which falls back to content where they are no call).
    """

    def __init__(
        self,
        spec: FormatSpec,
        builder: MessageBuilder,
        *,
        block: BlockFactory | None = None,
        openers: tuple[str, ...] = (),
        channel_name: str = "",
        echo_after_call: bool = False,
    ) -> None:
        self.spec = spec
        self.b = builder
        self.block_factory = block
        self.channel_name = channel_name
        self.echo_after_call = echo_after_call
        r_start, r_end = (spec.reasoning_start, spec.reasoning_end) if spec.reasoning else ("", "")
        self.r_start, self.r_end = r_start, r_end
        self.tool_end = spec.tool_end
        self.openers = openers if block is not None else ()
        self.stop = spec.stop_marker
        self.content_markers = Markers(r_start, r_end, *self.openers, self.stop)
        self.answering = False  # reasoning is over: its opener is text
        self.reasoning_first = not channel_name  # (Gemma 4's thought blocks go anywhere)
        self.literal_openers = 0  # openers taken as text, not yet closed
        self.reasoning_markers = Markers(r_start, r_end, *self.openers, self.stop)
        self.tool_end_markers = Markers(self.tool_end)
        self.buf = ""
        self.mode = _CONTENT
        self.block: ToolBlock | None = None
        self.block_raw: list[str] = []
        self.block_first_call = 0
        self._scanned = 0  # _TENTATIVE: text after pos already searched for the closer
        bare = spec.bare_call and block is not None
        self.bare_opener = "{" if bare else ""  # until the turn's first text is seen
        self.inline_opener = LLAMA3_CALL_BEGIN if bare else ""

    # -- driver -----------------------------------------------------------------------
    def feed(self, text: str, final: bool) -> None:
        buf = self.buf + text if self.buf else text
        pos = 0
        while True:
            step = self._step(buf, pos, final)
            if step is None:
                break
            pos = step
        self.buf = buf[pos:]
        if final:
            self.buf = ""
            self.b.end_segments()

    def _step(self, buf: str, pos: int, final: bool) -> int | None:
        """One move; returns the new position, or None when nothing more can be done."""
        mode = self.mode
        if mode == _CONTENT:
            if self.bare_opener:
                return self._bare(buf, pos, final)
            return self._scan(buf, pos, final, CONTENT, self.content_markers)
        if mode == _REASONING:
            return self._scan(buf, pos, final, REASONING, self.reasoning_markers)
        if mode == _TOOL:
            return self._tool(buf, pos, final)
        if mode == _HEADER:
            return self._header(buf, pos, final)
        if mode == _TENTATIVE:
            return self._tentative(buf, pos, final)
        if mode == _RAW:
            return self._raw(buf, pos, final)
        if mode == _POST_CALL:
            return self._post_call(buf, pos, final)
        return None if pos >= len(buf) else len(buf)  # _STOPPED: ignore the rest

    # -- content and reasoning -----------------------------------------------------------
    def _scan(self, buf: str, pos: int, final: bool, field: str, markers: Markers) -> int | None:
        n = len(buf)
        if pos >= n:
            return None
        at, marker = markers.find(buf, pos)
        if at < 0:
            end = n if final else n - markers.hold(buf, pos)
            if end > pos:
                self._text(field, buf[pos:end])
                return end
            return None
        if at > pos:
            self._text(field, buf[pos:at])
        after = at + len(marker)
        if marker == self.stop:
            self.b.end_segment(field)
            self.mode = _STOPPED
            return n
        if field == REASONING:
            if marker == self.r_end:
                self.b.end_segment(REASONING)
                self.mode = _CONTENT
                self.answering = self.reasoning_first
                return after
            if marker == self.r_start:  # a repeated opener: drop it
                self.mode = _HEADER if self.channel_name else _REASONING
                return after
            # a tool opener inside reasoning: a call only if reasoning never closes
            self.mode = _TENTATIVE
            self._scanned = 0
            return at
        if marker == self.r_start and self.answering:  # the answer's own text
            self.literal_openers += 1
            self.b.text(CONTENT, marker)
            return after
        if marker == self.r_start:
            self.b.end_segment(CONTENT)
            self.mode = _HEADER if self.channel_name else _REASONING
            return after
        if marker == self.r_end and self.literal_openers:  # closes a literal opener
            self.literal_openers -= 1
            self.b.text(CONTENT, marker)
            return after
        if marker == self.r_end:  # a stray closer: drop it
            self.b.end_segment(CONTENT)
            return after
        return self._open_at(marker, at)

    def _text(self, field: str, text: str) -> None:
        self.b.text(field, text)
        if field == CONTENT and not self.answering and not text.isspace():
            self.answering = self.reasoning_first

    def _bare(self, buf: str, pos: int, final: bool) -> int | None:
        """The turn's first text: a block opened by `bare_opener`, or content."""
        start = WS.match(buf, pos).end()
        if start >= len(buf) and not final:
            return None  # only whitespace so far
        opener = self.bare_opener
        if not final and opener.startswith(buf[start:]) and start < len(buf):
            return None
        self.bare_opener = ""
        if buf.startswith(opener, start):
            self._open_block("", start)
            self.block_raw = [buf[pos:start]]
            return start
        return pos

    def _header(self, buf: str, pos: int, final: bool) -> int | None:
        name = self.channel_name
        rest_len = len(buf) - pos
        if buf.startswith(name + "\n", pos):
            self.mode = _REASONING
            return pos + len(name) + 1
        if buf.startswith(name, pos):
            tail = buf[pos + len(name) :]
            if tail.startswith(self.r_end):
                self.mode = _REASONING
                return pos + len(name)
            if not final and (self.r_end.startswith(tail) or tail == ""):
                return None
        elif not final and rest_len < len(name) and name.startswith(buf[pos:]):
            return None
        self.mode = _REASONING
        return pos

    def _tentative(self, buf: str, pos: int, final: bool) -> int | None:
        at = buf.find(self.r_end, pos + self._scanned)
        if at >= 0:
            self.b.text(REASONING, buf[pos:at])
            self.b.end_segment(REASONING)
            self.mode = _CONTENT
            self.answering = self.reasoning_first
            return at + len(self.r_end)
        if not final:
            self._scanned = max(0, len(buf) - pos - len(self.r_end) + 1)
            return None
        # reasoning never closed: the opener ended it implicitly
        self.b.end_segment(REASONING)
        self.mode = _CONTENT
        at, marker = self.content_markers.find(buf, pos)
        return self._open_at(marker, at)

    # -- tool blocks ----------------------------------------------------------------------
    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside a tool block."""
        return self.mode == _TOOL

    @property
    def cut_block(self) -> str:
        """The raw text of a tool block begun whose first call has no name yet (its opener
        and what followed, as far as it got); "" elsewhere."""
        if self.mode != _TOOL or self.b.call_count != self.block_first_call:
            return ""
        return "".join(self.block_raw) + self.buf

    def _open_at(self, opener: str, at: int) -> int:
        """Open a block at the opener found at `at`."""
        if opener == self.inline_opener:  # the block reads its opener itself
            return self._open_block("", at)
        return self._open_block(opener, at + len(opener))

    def _open_block(self, opener: str, after: int) -> int:
        assert self.block_factory is not None
        self.b.end_segment(CONTENT)
        self.block = self.block_factory(self.b, opener)
        self.block_raw = [opener]
        self.block_first_call = self.b.call_count
        self.mode = _TOOL
        return after

    def _tool(self, buf: str, pos: int, final: bool) -> int | None:
        assert self.block is not None
        end, status = self.block.feed(buf, pos, final)
        if end > pos:
            self.block_raw.append(buf[pos:end])
        if status is Status.DONE:
            self.block = None
            self.mode = _POST_CALL if self.echo_after_call else _CONTENT
            return end
        if status is Status.ERROR:
            self._fall_back()
            self.mode = _RAW
            return end
        if not final:
            return None if end == pos else end
        # the text ended inside the block
        if self.block.complete():
            self.block = None
            self.mode = _CONTENT
            return end
        self._fall_back()
        self.b.text(CONTENT, buf[end:])
        self.mode = _CONTENT
        return len(buf)

    def _fall_back(self) -> None:
        """The block did not parse: take its calls back and show it as content."""
        self.b.drop_calls(self.block_first_call)
        self.b.text(CONTENT, "".join(self.block_raw))
        self.block = None
        self.block_raw = []

    def _raw(self, buf: str, pos: int, final: bool) -> int | None:
        n = len(buf)
        if pos >= n:
            return None
        at, marker = self.tool_end_markers.find(buf, pos)
        if at >= 0:
            self.b.text(CONTENT, buf[pos : at + len(marker)])
            self.mode = _CONTENT
            return at + len(marker)
        end = n if final else n - self.tool_end_markers.hold(buf, pos)
        if end > pos:
            self.b.text(CONTENT, buf[pos:end])
            return end
        return None

    def _post_call(self, buf: str, pos: int, final: bool) -> int | None:
        """LFM2 may echo its call list after the block, closed by a second closer."""
        n = len(buf)
        p = WS.match(buf, pos).end()
        if p >= n:
            if final:
                self.mode = _CONTENT
                return pos
            return None
        if buf[p] == "[":
            at = buf.find(self.tool_end, p)
            if at >= 0:
                between = buf[p:at].rstrip()
                if between.endswith("]") and not any(o in between for o in self.openers):
                    return at + len(self.tool_end)
            elif not final:
                return None
        self.mode = _CONTENT
        return pos
