"""The format registry: one parser per `FormatKind`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from chat.builder import MessageBuilder
from chat.formats.gemma4 import CHANNEL_NAME, gemma4_block
from chat.formats.harmony import HarmonyParser
from chat.formats.hermes_json import hermes_block
from chat.formats.lfm2_pythonic import lfm2_block
from chat.formats.llama3_json import llama3_block_factory
from chat.formats.mistral import mistral_block
from chat.formats.qwen_xml import qwen_xml_block_factory
from chat.formats.tagged import TaggedParser
from chat.spec import FormatKind, FormatSpec


class Parser(Protocol):
    """Consumes a turn's text piece by piece into its builder; `final` ends the turn.
    `cut_block`: the raw text of a tool block begun with no call in it named yet (what a
    turn cut there would lose: the parse shows nothing of it); `in_call`: whether the text
    so far ends inside a tool call or its block."""

    def feed(self, text: str, final: bool) -> None: ...

    @property
    def cut_block(self) -> str: ...

    @property
    def in_call(self) -> bool: ...


def make_parser(
    spec: FormatSpec,
    builder: MessageBuilder,
    *,
    parse_tool_calls: bool = True,
    tools: list[dict] | None = None,
) -> Parser:
    """The parser of `spec`'s format, writing into `builder`."""
    kind = spec.kind
    if kind is FormatKind.HARMONY:
        return HarmonyParser(builder, parse_tool_calls=parse_tool_calls)
    closer = spec.tool_end
    block: Callable | None = None
    if kind is FormatKind.HERMES_JSON:
        block = hermes_block
    elif kind is FormatKind.QWEN_XML:
        block = qwen_xml_block_factory(tools)
    elif kind is FormatKind.GEMMA4:
        block = gemma4_block
    elif kind is FormatKind.LFM2_PYTHONIC:
        block = lfm2_block
    elif kind is FormatKind.MISTRAL_JSON or kind is FormatKind.MISTRAL_ARGS:
        block = mistral_block
    elif kind is FormatKind.LLAMA3_JSON:
        block = llama3_block_factory(tools)
    if block is None or not parse_tool_calls:
        return TaggedParser(spec, builder, channel_name=_channel(kind))
    make = block
    return TaggedParser(
        spec,
        builder,
        block=lambda b, opener: make(b, opener, closer),
        openers=spec.tool_openers,
        channel_name=_channel(kind),
        echo_after_call=kind is FormatKind.LFM2_PYTHONIC,
    )


def _channel(kind: FormatKind) -> str:
    return CHANNEL_NAME if kind is FormatKind.GEMMA4 else ""


__all__ = ["Parser", "make_parser"]
