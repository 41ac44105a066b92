"""llama3_json: Llama 3.1-3.3's calls, `{"name": NAME, "parameters": {...}}` written bare as
the turn's first text (what their templates ask for and render), or after `<|python_tag|>`
anywhere. Several calls may follow one another, parted by whitespace or `;`.

A bare object is only a call where it is one: its keys are a call's, and its name is one
of the request's tools (when the request lists them). Anything else, a JSON answer among
them, is content, as it would be without tools.
"""

from __future__ import annotations

from chat.builder import MessageBuilder
from chat.formats.block import tool_schemas
from chat.formats.hermes_json import JSONCallBlock

CALL_KEYS = frozenset({"name", "parameters", "arguments", "type"})


def llama3_block_factory(tools: list[dict] | None):
    """The block reader of llama3_json for a request's `tools`."""
    names = frozenset(tool_schemas(tools)) or None

    def make(builder: MessageBuilder, opener: str, closer: str) -> JSONCallBlock:
        return JSONCallBlock(builder, "", separators=";", names=names, keys=CALL_KEYS)

    return make
