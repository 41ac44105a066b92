"""parse: one assistant turn's text into reasoning, content and tool calls."""

from __future__ import annotations

import logging

from chat.builder import MessageBuilder
from chat.formats import make_parser
from chat.message import ChatMsg
from chat.spec import FormatSpec

log = logging.getLogger(__name__)


def parse(
    spec: FormatSpec,
    text: str,
    *,
    partial: bool,
    parse_tool_calls: bool = True,
    tools: list[dict] | None = None,
) -> ChatMsg:
    """Parse `text` (the prefill followed by the generated text).

    Args:
        spec: the model's format.
        text: `format_prefill(...)` + the generated text.
        partial: the text may go on: markers and values cut off at the end are held back,
            so every field is a prefix of the same field of any longer parse.
        parse_tool_calls: False when the request has no tools or `tool_choice` is "none":
            tool markup then stays in content.
        tools: the request's OpenAI `tools` list; types Qwen XML argument values, and
            names the calls llama3_json reads in a bare object (without it, any object of a
            call's keys is one).

    Returns:
        The parsed message. Never raises on model output: what does not parse is content.
    """
    builder = MessageBuilder()
    try:
        make_parser(spec, builder, parse_tool_calls=parse_tool_calls, tools=tools).feed(
            text, not partial
        )
    except Exception:  # a parser bug must not lose the text
        log.exception("chat parser failed on a %s output; returning it as content", spec.kind)
        return ChatMsg(content=text.strip())
    return builder.message()
