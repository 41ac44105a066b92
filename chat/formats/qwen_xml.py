"""qwen_xml: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n
</function>\\n</tool_call>` (Qwen3-Coder, Qwen3.5).

A value is raw text with exactly one leading and one trailing newline removed. Its type
comes from the tool's JSON schema: strings stream as they arrive; integer, number,
boolean, null, object and array values are decoded once the parameter closes (Python's
`True`/`False` accepted); a value that does not decode stays a string.
"""

from __future__ import annotations

import json
from typing import Any

from chat.builder import MessageBuilder
from chat.dialects import Status
from chat.formats.block import WS, expect, tool_schemas
from chat.jsonout import JSONWriter
from chat.spec import QWEN_FUNCTION_START as FUNCTION_START

FUNCTION_END = "</function>"
PARAMETER_START = "<parameter="
PARAMETER_END = "</parameter>"


TYPE_ALIASES = {"float": "number", "double": "number", "int": "integer", "bool": "boolean",
                 "str": "string", "dict": "object", "list": "array"}


def schema_types(schema: Any) -> set[str]:
    """The JSON types a schema allows (empty: unknown)."""
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    if isinstance(t, str):
        return {TYPE_ALIASES.get(t, t)}
    if isinstance(t, list):
        return {TYPE_ALIASES.get(x, x) for x in t if isinstance(x, str)}
    out: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            out |= schema_types(sub)
    if not out and isinstance(schema.get("enum"), list):
        for v in schema["enum"]:
            out.add(
                "string" if isinstance(v, str) else
                "boolean" if isinstance(v, bool) else
                "integer" if isinstance(v, int) else
                "number" if isinstance(v, float) else "null" if v is None else "object"
            )
    if not out and "properties" in schema:
        out.add("object")
    return out


def decode_typed(text: str, types: set[str]) -> Any:
    """Decode a parameter's text by its schema types; falls back to the text itself."""
    s = text.strip()
    if "null" in types and s in ("null", "None"):
        return None
    if "boolean" in types and s in ("true", "false", "True", "False"):
        return s in ("true", "True")
    if "integer" in types or "number" in types:
        try:
            return int(s)
        except ValueError:
            pass
        if "number" in types:
            try:
                value = float(s)
                if value == value and abs(value) != float("inf"):
                    return value
            except ValueError:
                pass
    if "object" in types or "array" in types:
        try:
            value = json.loads(s)
        except ValueError:
            value = None
        if isinstance(value, (dict, list)):
            return value
    return text


BOUNDED = "bounded string"  # (a value type of its own: decoded whole, stripped)
_BOUNDS = ("enum", "const", "maxLength", "pattern", "format")


def _bounded_string(schema: Any) -> bool:
    """A string property whose schema bounds its text (an enum or const of strings, a
    length, a pattern, a format): a value, not free text such as a file's content."""
    if not isinstance(schema, dict) or schema_types(schema) != {"string"}:
        return False
    return any(k in schema for k in _BOUNDS)


class QwenXMLBlock:
    def __init__(self, builder: MessageBuilder, opener: str, closer: str, schemas: dict) -> None:
        self.b = builder
        self.closer = closer
        self.wrapped = opener != FUNCTION_START
        self.schemas = schemas
        self.state = "lead" if self.wrapped else "name"
        self.writer: JSONWriter | None = None
        self.props: dict[str, Any] = {}
        self.value_types: set[str] = set()
        self.value_started = False
        self.calls = 0

    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]:
        n = len(buf)
        while True:
            state = self.state
            if state == "value":
                pos, status = self._value(buf, pos, final)
                if status is not None:
                    return pos, status
                continue
            if state == "name":
                end = buf.find(">", pos)
                if end < 0:
                    if "\n" in buf[pos:] or "<" in buf[pos:]:
                        return pos, Status.ERROR
                    return pos, Status.MORE
                name = buf[pos:end].strip()
                if not name:
                    return pos, Status.ERROR
                self.b.call_start(name)
                self.writer = JSONWriter(self.b.call_args)
                self.writer.obj_start()
                schema = self.schemas.get(name) or {}
                props = schema.get("properties") if isinstance(schema, dict) else None
                self.props = props if isinstance(props, dict) else {}
                pos = end + 1
                self.state = "params"
                continue
            if state == "key":
                end = buf.find(">", pos)
                if end < 0:
                    if "\n" in buf[pos:] or "<" in buf[pos:]:
                        return pos, Status.ERROR
                    return pos, Status.MORE
                key = buf[pos:end].strip()
                assert self.writer is not None
                self.writer.key(key)
                prop = self.props.get(key)
                types = schema_types(prop)
                self.value_types = ({BOUNDED} if _bounded_string(prop)
                                    else types if types - {"string"} else set())
                self.value_started = False
                pos = end + 1
                self.state = "value"
                continue
            pos = WS.match(buf, pos).end()
            if pos >= n:
                return pos, Status.MORE
            if state == "lead":
                st = expect(buf, pos, FUNCTION_START, final)
                if st is Status.DONE:
                    pos += len(FUNCTION_START)
                    self.state = "name"
                    continue
                if st is Status.MORE:
                    return pos, Status.MORE
                st = expect(buf, pos, self.closer, final)
                if st is Status.DONE and self.calls:
                    return pos + len(self.closer), Status.DONE
                if st is Status.MORE and self.calls:
                    return pos, Status.MORE
                return pos, (Status.DONE if self.calls else Status.ERROR)
            if state == "params":
                st = expect(buf, pos, PARAMETER_START, final)
                if st is Status.DONE:
                    pos += len(PARAMETER_START)
                    self.state = "key"
                    continue
                st2 = expect(buf, pos, FUNCTION_END, final)
                if st2 is Status.DONE:
                    assert self.writer is not None
                    self.writer.obj_end()
                    self.calls += 1
                    pos += len(FUNCTION_END)
                    if not self.wrapped:
                        self.state = "closed"
                        return pos, Status.DONE
                    self.state = "lead"
                    continue
                if st is Status.MORE or st2 is Status.MORE:
                    return pos, Status.MORE
                return pos, Status.ERROR
            return pos, Status.DONE

    def _value(self, buf: str, pos: int, final: bool) -> tuple[int, Status | None]:
        assert self.writer is not None
        n = len(buf)
        end = buf.find(PARAMETER_END, pos)
        if self.value_types:  # typed: decode once the parameter closes
            if end < 0:
                return pos, Status.MORE
            text = _strip_one_newline(buf[pos:end])
            # a bounded string is the value alone: the whitespace the grammar lets in
            # around it (its runs between tags) is no part of it
            self.writer.value(text.strip() if BOUNDED in self.value_types
                              else decode_typed(text, self.value_types))
            self.state = "params"
            return end + len(PARAMETER_END), None
        # a string: stream it, holding what may still be the closer or the last newline
        if not self.value_started:
            if pos >= n:
                return pos, Status.MORE
            if buf[pos] == "\n":
                pos += 1
            self.value_started = True
            self.writer.str_start()
        if end >= 0:
            text = buf[pos:end]
            if text.endswith("\n"):
                text = text[:-1]
            self.writer.str_chunk(text)
            self.writer.str_end()
            self.state = "params"
            return end + len(PARAMETER_END), None
        stop = n - _held(buf, pos)
        if stop > pos:
            self.writer.str_chunk(buf[pos:stop])
        return stop, Status.MORE

    def complete(self) -> bool:
        return self.calls > 0 and self.state in ("lead", "closed")


def _strip_one_newline(text: str) -> str:
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    return text


def _held(buf: str, pos: int) -> int:
    """Tail to hold in a streamed value: a partial `</parameter>`, after a newline."""
    n = len(buf)
    for k in range(min(len(PARAMETER_END) - 1, n - pos), 0, -1):
        if PARAMETER_END.startswith(buf[n - k :]):
            break
    else:
        k = 0
    if n - k > pos and buf[n - k - 1] == "\n":
        k += 1
    return k


def qwen_xml_block_factory(tools: list[dict] | None):
    schemas = tool_schemas(tools)

    def make(builder: MessageBuilder, opener: str, closer: str) -> QwenXMLBlock:
        return QwenXMLBlock(builder, opener, closer, schemas)

    return make
