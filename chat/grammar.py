"""structural_tag: the xgrammar structural tag (a JSON-able dict) for a format and request.

The tag is: an optional reasoning block (only when reasoning is allowed or forced; optional
so a prefill that already opened it is accepted), then the body: tool calls in the format's
own syntax (xgrammar's JSON, qwen_xml and gemma styles; our own EBNF for LFM2's Python
calls), or the `response_format` document. Numbers are bounded to 16 digits and runs of
whitespace, so a constrained model cannot pad forever: a call's arguments to a few
characters (every template renders a model's past calls compact, `tojson` on one line, so
that is how models write them), a document to a newline and six levels of a 4-space
indent (models pretty-print the documents they are asked for).
Pure data: xgrammar is only imported where tags are compiled (`chat.engine`).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from chat.formats.qwen_xml import TYPE_ALIASES, schema_types
from chat.request import ConstraintRequest, ToolSpec
from chat.schema_walk import (
    DATA_KEYWORDS,
    LISTED_SCHEMAS,
    NAMED_SCHEMAS,
    schemas_in,
    subschemas,
)
from chat.spec import (
    HARMONY_CALL,
    HARMONY_CHANNEL,
    HARMONY_CONSTRAIN,
    HARMONY_END,
    HARMONY_MESSAGE,
    HARMONY_RETURN,
    HARMONY_START,
    LLAMA3_CALL_BEGIN,
    MISTRAL_ARGS,
    QWEN_FUNCTION_START,
    FormatKind,
    FormatSpec,
)

MAX_DIGITS = 16
MAX_WHITESPACE = 4  # in a call's arguments
MAX_DOCUMENT_WHITESPACE = 28  # in a response_format document
INT_BOUND = 10**MAX_DIGITS - 1
_AFTER_REASONING = {"type": "regex", "pattern": "[ \\n]{0,4}"}
_WS = {"type": "regex", "pattern": "[ \\n]{0,2}"}

Tag = dict[str, Any]


def structural_tag(spec: FormatSpec, request: ConstraintRequest) -> Tag | None:
    """The structural tag for `request` on a model of format `spec`, or None when nothing
    is constrained (no tools to call and a text response)."""
    if spec.kind is FormatKind.HARMONY:
        return _harmony(spec, request)
    body = _body(spec, request)
    if body is None:
        return None
    reasoning = spec.reasoning and (request.allow_reasoning or spec.reasoning_forced)
    elements: list[Tag] = []
    if reasoning:
        elements.append({"type": "optional", "content": {
            "type": "tag", "begin": spec.reasoning_start, "content": {"type": "any_text"},
            "end": spec.reasoning_end}})
        elements.append(_AFTER_REASONING)
    elements.append(body)
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}


def text_markers(spec: FormatSpec) -> tuple[str, ...]:
    """Stop strings the grammar spells as text (kept out of the matcher's stop tokens)."""
    if spec.kind is FormatKind.HARMONY:
        return (HARMONY_CALL, HARMONY_RETURN, HARMONY_END)
    return ()


# -- bodies -------------------------------------------------------------------------------
def _document(spec: FormatSpec, request: ConstraintRequest) -> Tag | None:
    if request.response_format == "text":
        return None
    schema = request.json_schema if request.json_schema is not None else {"type": "object"}
    return _json(schema, excludes=markers(spec), whitespace=MAX_DOCUMENT_WHITESPACE)


def _body(spec: FormatSpec, request: ConstraintRequest) -> Tag | None:
    document = _document(spec, request)
    if not request.tools or request.tool_choice == "none" or not spec.has_tools:
        return document
    # Llama's templates render one call a turn (and raise on more)
    once = not request.parallel_tool_calls or spec.kind is FormatKind.LLAMA3_JSON
    tags = _tool_tags(spec, request.tools, once)
    if request.tool_choice == "required" or document is not None:
        one = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        calls = one if once or spec.kind in _ONE_BLOCK else {"type": "sequence", "elements": [
            one, {"type": "star", "content": {"type": "sequence", "elements": [_WS, one]}}]}
        if request.tool_choice == "required":
            return calls
        return {"type": "or", "elements": [calls, document]}  # auto with a response format
    if spec.bare_call and not any(t.strict for t in request.tools):
        # a bare call begins as a JSON answer may (`{"name": `): a trigger would make such an
        # answer a call, so auto leaves the text free (the parser reads a call by its tool);
        # a strict tool holds its schema, at that price
        return None
    if spec.kind is FormatKind.QWEN_XML:  # a bare call is a call to the parser too
        tags = tags + _qwen_bare_tags(spec, request.tools)
    # the openers its tags begin with (Llama's `<|python_tag|>` begins none)
    triggers = [o for o in spec.tool_openers if any(t["begin"].startswith(o) for t in tags)]
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags,
            "at_least_one": False, "stop_after_first": once}


# formats whose calls are all in one block (a list)
_ONE_BLOCK = (FormatKind.LFM2_PYTHONIC, FormatKind.MISTRAL_JSON)


def _qwen_bare_tags(spec: FormatSpec, tools: tuple[ToolSpec, ...]) -> list[Tag]:
    return [{"type": "tag", "begin": f"{QWEN_FUNCTION_START}{t.name}>\n",
             "content": _json(t.parameters, style="qwen_xml", excludes=markers(spec)),
             "end": "</function>"} for t in tools]


def _tool_tags(spec: FormatSpec, tools: tuple[ToolSpec, ...], once: bool) -> list[Tag]:
    kind = spec.kind
    if kind is FormatKind.HERMES_JSON:
        # One tag: the call object is a JSON document
        schema, defs = _call_objects(tools)
        content = _json({**schema, "$defs": defs} if defs else schema, excludes=markers(spec))
        return [{"type": "tag", "begin": spec.tool_start,
                 "content": {"type": "sequence", "elements": [_WS, content, _WS]},
                 "end": spec.tool_end}]
    if kind is FormatKind.MISTRAL_JSON:
        # One tag to the end of the turn: the calls are one JSON list
        items, defs = _call_objects(tools)
        schema = {"type": "array", "items": items, "minItems": 1}
        if defs:  # the wrappers' references name the document's root
            schema["$defs"] = defs
        if once:
            schema["maxItems"] = 1
        return [{"type": "tag", "begin": spec.tool_start,
                 "content": _json(schema, excludes=markers(spec)), "end": ""}]
    if kind is FormatKind.MISTRAL_ARGS:
        return [{"type": "tag", "begin": f"{spec.tool_start}{t.name}{MISTRAL_ARGS}",
                 "content": _json(t.parameters, excludes=markers(spec)), "end": ""}
                for t in tools]
    if kind is FormatKind.LLAMA3_JSON:
        # the call as Llama's templates render one (`tojson`'s separators)
        return [{"type": "tag", "begin": f'{LLAMA3_CALL_BEGIN}{json.dumps(t.name)}, '
                                         f'"parameters": ',
                 "content": _json(t.parameters, excludes=markers(spec)), "end": "}"}
                for t in tools]
    if kind is FormatKind.QWEN_XML:
        return [{"type": "tag", "begin": f"{spec.tool_start}\n<function={t.name}>\n",
                 "content": _json(t.parameters, style="qwen_xml", excludes=markers(spec)),
                 "end": f"</function>\n{spec.tool_end}"} for t in tools]
    if kind is FormatKind.GEMMA4:
        return [{"type": "tag", "begin": f"{spec.tool_start}call:{t.name}",
                 "content": _json(t.parameters, style="gemma", excludes=markers(spec)),
                 "end": spec.tool_end}
                for t in tools]
    if kind is FormatKind.LFM2_PYTHONIC:
        return [{"type": "tag", "begin": f"{spec.tool_start}[",
                 "content": {"type": "grammar", "grammar": python_calls_ebnf(tools, once)},
                 "end": f"]{spec.tool_end}"}]
    raise ValueError(f"format {kind} has no tool syntax")


def _call_objects(tools: tuple[ToolSpec, ...]) -> tuple[Any, dict[str, Any]]:
    """The schema of a `{"name": ..., "arguments": {...}}` call object, one wrapper per tool,
    and the `$defs` its document's root must hold: a tool whose schema refers into itself
    ("#/$defs/...", "#") is moved there and its references rebased, so they still name its
    own parts."""
    defs: dict[str, Any] = {}

    def arguments(i: int, t: ToolSpec) -> Any:
        if not _refers(t.parameters):
            return t.parameters
        defs[f"tool{i}"] = _rebased(t.parameters, f"#/$defs/tool{i}")
        return {"$ref": f"#/$defs/tool{i}"}

    wrappers = [{"type": "object", "properties": {
        "name": {"const": t.name}, "arguments": arguments(i, t)},
        "required": ["name", "arguments"]} for i, t in enumerate(tools)]
    return (wrappers[0] if len(wrappers) == 1 else {"anyOf": wrappers}), defs


def _is_pointer(ref: Any) -> bool:
    """A reference into the same document by JSON pointer ("#" or "#/...")."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _refers(node: Any) -> bool:
    """Whether a schema holds a local reference ("$ref": "#/..." or "#")."""
    if isinstance(node, dict):
        return _is_pointer(node.get("$ref")) or any(_refers(v) for v in schemas_in(node))
    if isinstance(node, list):
        return any(_refers(v) for v in node)
    return False


def _rebased(node: Any, base: str) -> Any:
    """A copy of a schema whose local references ("#/a/b", "#") point at the same parts of
    it once it lies at `base` ("#/$defs/tool0") in a larger document."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and _is_pointer(value):
                out[key] = base + value[1:]
            elif key in NAMED_SCHEMAS and isinstance(value, dict):
                out[key] = {name: _rebased(sub, base) for name, sub in value.items()}
            elif key in DATA_KEYWORDS:
                out[key] = value
            else:
                out[key] = _rebased(value, base)
        return out
    if isinstance(node, list):
        return [_rebased(v, base) for v in node]
    return node


JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


def schema_fault(node: Any, where: str = "") -> str | None:
    """What makes `node` no JSON schema at all (a type JSON Schema does not have, properties
    that are not an object, ...), or None: a schema the grammar compiler refuses for this
    reason is the client's mistake, not a keyword it cannot apply."""
    if isinstance(node, bool):
        return None
    if not isinstance(node, dict):
        return f"{where or 'the schema'} is not a schema (an object)"
    types = node.get("type")
    for t in types if isinstance(types, list) else [types] if types is not None else []:
        if not isinstance(t, str) or TYPE_ALIASES.get(t, t) not in JSON_TYPES:
            return f"{where or 'the schema'} has type {t!r}, which JSON Schema does not have"
    for key, value in node.items():
        if key in NAMED_SCHEMAS and not isinstance(value, dict):
            return f"{where}.{key} is not an object"
        if key in LISTED_SCHEMAS and not isinstance(value, list):
            return f"{where}.{key} is not a list"
    for sub, at in subschemas(node, where):
        fault = schema_fault(sub, at)
        if fault:
            return fault
    return None


_STYLES = {FormatKind.QWEN_XML: "qwen_xml", FormatKind.GEMMA4: "gemma"}


def tool_schema_tag(spec: FormatSpec, parameters: Any) -> Tag:
    """A structural tag of one tool's argument schema alone, as `spec`'s format writes its
    arguments (to learn whether it compiles there)."""
    return {"type": "structural_tag", "format": _json(
        parameters, style=_STYLES.get(spec.kind, "json"), excludes=markers(spec))}


def _harmony(spec: FormatSpec, request: ConstraintRequest) -> Tag | None:
    """gpt-oss: [analysis message] [commentary preambles] then a call or the final answer.

    The prefill's role (`assistant`) is dropped before matching, so the grammar starts at
    the first message's channel.
    """
    document = _document(spec, request)
    tools = request.tools if request.tool_choice != "none" else ()
    if not tools and document is None:
        return None
    head, next_message = HARMONY_CHANNEL, f"{HARMONY_END}{HARMONY_START}assistant"
    # free text must not spell the stop tokens the grammar matches as text
    text = {"type": "any_text", "excludes": [HARMONY_CALL, HARMONY_RETURN]}
    # gpt-oss names the recipient after the channel or in the role header:
    # `<|channel|>commentary to=functions.f <|constrain|>json<|message|>` or
    # ` to=functions.f<|channel|>commentary json<|message|>`
    constrain = {"type": "optional", "content": {
        "type": "regex", "pattern": "( ?<\\|constrain\\|>| )json"}}
    calls = [{"type": "sequence", "elements": [
        {"type": "or", "elements": [
            {"type": "const_string", "value": f"{head}commentary to=functions.{t.name}"},
            {"type": "const_string", "value": f" to=functions.{t.name}{head}commentary"}]},
        constrain,
        {"type": "const_string", "value": HARMONY_MESSAGE},
        _json(t.parameters, excludes=markers(spec)),
        {"type": "const_string", "value": HARMONY_CALL}]} for t in tools]
    final = {"type": "tag", "begin": f"{head}final{HARMONY_MESSAGE}",
             "content": document or text, "end": HARMONY_RETURN}
    options = calls if request.tool_choice == "required" else calls + [final]
    body = options[0] if len(options) == 1 else {"type": "or", "elements": options}
    elements: list[Tag] = []
    if request.allow_reasoning:
        elements.append({"type": "optional", "content": {
            "type": "tag", "begin": f"{head}analysis{HARMONY_MESSAGE}",
            "content": text, "end": next_message}})
    if tools and request.tool_choice != "required":
        elements.append({"type": "star", "content": {
            "type": "tag", "begin": f"{head}commentary{HARMONY_MESSAGE}",
            "content": text, "end": next_message}})
    elements.append(body)
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}


# -- JSON schemas -------------------------------------------------------------------------
def _json(schema: Any, *, style: str = "json", excludes: tuple[str, ...] = (),
          whitespace: int = MAX_WHITESPACE) -> Tag:
    """A JSON-schema format. `excludes`: the format's markers, which no string may contain
    (the parser would read them as markup); `whitespace`: the longest run of it."""
    tag: Tag = {"type": "json_schema", "json_schema": bounded_schema(schema), "style": style,
                "max_whitespace_cnt": whitespace}
    # xgrammar (0.2.9) drops a string's minLength / maxLength where strings exclude the
    # markers: the schema's lengths are kept then (a marker inside a string is the model's
    # choice against its own format; a length the request asked for is not); and a schema
    # whose own values or names hold a marker (`"const": "<think>"`) could not be written
    if excludes and not has_lengths(schema) and not _names(schema, excludes):
        tag["excludes"] = list(excludes)
    return tag


def _names(node: Any, texts: tuple[str, ...]) -> bool:
    """Whether a value the schema asks for (a const, an enum's value) or a property's name
    holds one of `texts` (descriptions, titles and examples say nothing of the output)."""
    def held(value: Any) -> bool:
        if isinstance(value, str):
            return any(t in value for t in texts)
        if isinstance(value, list):
            return any(held(v) for v in value)
        if isinstance(value, dict):
            return any(held(k) or held(v) for k, v in value.items())
        return False

    if isinstance(node, list):
        return any(_names(v, texts) for v in node)
    if not isinstance(node, dict):
        return False
    props = node.get("properties")
    return (held(node.get("const")) or held(node.get("enum"))
            or (isinstance(props, dict) and any(held(k) for k in props))
            or any(_names(v, texts) for v in schemas_in(node)))


def has_lengths(node: Any) -> bool:
    """Whether a schema bounds some string's length."""
    if isinstance(node, dict):
        if "minLength" in node or "maxLength" in node:
            return True
        return any(has_lengths(v) for v in schemas_in(node))
    if isinstance(node, list):
        return any(has_lengths(v) for v in node)
    return False


def markers(spec: FormatSpec) -> tuple[str, ...]:
    """The strings the parser reads as markup in this format."""
    if spec.kind is FormatKind.HARMONY:
        return (HARMONY_START, HARMONY_END, HARMONY_MESSAGE, HARMONY_CHANNEL, HARMONY_CALL,
                HARMONY_RETURN, HARMONY_CONSTRAIN)
    found = (spec.reasoning_start, spec.reasoning_end, *spec.tool_openers, spec.tool_end,
             spec.stop_marker)
    return tuple(dict.fromkeys(m for m in found if m))


def bounded_schema(schema: Any) -> Any:
    """A copy of `schema` whose integers and numbers have at most 16 digits."""
    schema = copy.deepcopy(schema)
    _bound(schema)
    return schema


def _bound(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _bound(item)
        return
    if not isinstance(node, dict):
        return
    types = node.get("type")
    if isinstance(types, str):
        types = node["type"] = TYPE_ALIASES.get(types, types)
    elif isinstance(types, list):  # (a type that is no string: the compiler says so)
        types = node["type"] = [TYPE_ALIASES.get(t, t) if isinstance(t, str) else t
                                for t in types]
    types = {types} if isinstance(types, str) else {t for t in types if isinstance(t, str)} \
        if isinstance(types, list) else set()
    # xgrammar compiles in strict mode: an array without `items` would allow only [], and
    # an object without properties only {}. JSON Schema means "anything" there.
    if "array" in types and "items" not in node and "prefixItems" not in node:
        node["items"] = {}
    if "object" in types and not node.get("properties") and "additionalProperties" not in node:
        node.pop("properties", None)
        node["additionalProperties"] = True
    if types & {"integer", "number"}:
        _draft4_bounds(node)
        if types - {"null"} <= {"integer"}:
            _whole_bounds(node)
            for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
                value = node.get(key)  # past any integer the compiler holds: no bound
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and abs(value) >= 2 ** 63:
                    del node[key]
        # bounded where the schema leaves a side open, never across its own bounds (a
        # minimum past 16 digits keeps its numbers' length: the schema asked for them);
        # beside multipleOf too, which the compiler then drops (chat.unenforced says so)
        low, high = _limit(node, "minimum", "exclusiveMinimum"), _limit(node, "maximum",
                                                                          "exclusiveMaximum")
        if low is None:  # 16 digits, or as many as a bound past them on the other side has
            node["minimum"] = -INT_BOUND if high is None or high > -INT_BOUND \
                else high - INT_BOUND
        if high is None:
            node["maximum"] = INT_BOUND if low is None or low < INT_BOUND else low + INT_BOUND
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            if isinstance(value, dict):
                for sub in value.values():
                    _bound(sub)
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "prefixItems",
                     "not", "contains"):
            _bound(value)


def _draft4_bounds(node: dict) -> None:
    """Draft 4's (and OpenAPI 3.0's) `exclusiveMinimum: true` beside `minimum` as the
    draft 6 bound the compiler reads (`false`: the minimum alone); the same for maximum."""
    for inclusive, exclusive in (("minimum", "exclusiveMinimum"),
                                 ("maximum", "exclusiveMaximum")):
        flag = node.get(exclusive)
        if isinstance(flag, bool):
            del node[exclusive]
            if flag and isinstance(node.get(inclusive), (int, float)):
                node[exclusive] = node.pop(inclusive)


def _whole_bounds(node: dict) -> None:
    """An integer's fractional bounds as the whole ones they mean (`minimum: 0.5` is 1;
    `exclusiveMaximum: 2.5` is `maximum: 2`): the compiler takes whole bounds only. A side
    with a fractional bound becomes one inclusive bound, the tightest of its bounds."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)

    for inclusive, exclusive, pick, whole, step in (
            ("minimum", "exclusiveMinimum", max, math.ceil, 1),
            ("maximum", "exclusiveMaximum", min, math.floor, -1)):
        bounds = {k: node[k] for k in (inclusive, exclusive) if number(node.get(k))}
        if not any(isinstance(v, float) and not v.is_integer() for v in bounds.values()):
            continue
        wholes = []
        if inclusive in bounds:
            wholes.append(int(whole(bounds[inclusive])))
        if exclusive in bounds:  # the first whole number past it
            value = bounds[exclusive]
            wholes.append(int(value) + step if float(value).is_integer()
                          else int(whole(value)))
        for k in bounds:
            del node[k]
        node[inclusive] = pick(wholes)


def _limit(node: dict, inclusive: str, exclusive: str) -> float | None:
    """A schema's bound on one side (draft 4's boolean exclusiveMinimum is a flag, not a
    bound), or None."""
    for key in (inclusive, exclusive):
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


# -- LFM2: Python keyword arguments as EBNF -------------------------------------------------
_PY_RULES = r'''pysq ::= [^'\\\r\n] | "\\" ['"\\nrt]
pydq ::= [^"\\\r\n] | "\\" ['"\\nrt]
pystr ::= "'" pysq* "'" | "\"" pydq* "\""
pyint ::= "-"? ("0" | [1-9] [0-9]{0,15})
pynum ::= pyint ("." [0-9]{1,16})?
pybool ::= "True" | "False" | "true" | "false"
pynone ::= "None" | "null"
pyany ::= pystr | pynum | pybool | pynone | pylist | pydict
pylist ::= "[" (pyany (", " pyany){0,63})? "]"
pydict ::= "{" (pystr ": " pyany (", " pystr ": " pyany){0,63})? "}"
pyname ::= [A-Za-z_] [A-Za-z0-9_]*
pykwargs ::= (pyname "=" pyany (", " pyname "=" pyany){0,63})?
'''


MAX_PY_LENGTH = 4096  # the longest string a Python call's grammar counts characters to
# keywords a Python call's grammar (`python_calls_ebnf`) does not apply (it takes types,
# enums and consts, properties, string lengths and array sizes)
PY_UNENFORCED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                 "pattern", "format", "uniqueItems", "minProperties", "maxProperties",
                 "patternProperties", "$ref")


def python_unenforced(schema: Any, where: str) -> str | None:
    """The first keyword of `schema` a Python call's grammar does not apply, with its
    place, or None."""
    if isinstance(schema, list):
        return next((f for i, s in enumerate(schema)
                     if (f := python_unenforced(s, f"{where}[{i}]"))), None)
    if not isinstance(schema, dict):
        return None
    for key in PY_UNENFORCED:
        if key in schema:
            return f"`{key}` at {where}"
    for key in ("anyOf", "oneOf", "allOf"):
        found = python_unenforced(schema.get(key), f"{where}.{key}")
        if found:
            return found
    props = schema.get("properties")
    if isinstance(props, dict):
        for name, sub in props.items():
            found = python_unenforced(sub, f"{where}.properties.{name}")
            if found:
                return found
    return python_unenforced(schema.get("items"), f"{where}.items")


def _counts(schema: dict, low_key: str, high_key: str, most: int) -> tuple[int, int]:
    """A schema's bounds on a count (a string's characters, an array's items) within
    0..`most`, the lower at most the upper."""
    low, high = schema.get(low_key), schema.get(high_key)
    high = min(most, high) if isinstance(high, int) and high >= 0 else most
    low = max(0, min(low, high)) if isinstance(low, int) else 0
    return low, high


class _EBNF:
    def __init__(self) -> None:
        self.rules: list[str] = []
        self.count = 0

    def rule(self, body: str) -> str:
        name = f"r{self.count}"
        self.count += 1
        self.rules.append(f"{name} ::= {body}")
        return name

    def value(self, schema: Any, depth: int = 0) -> str:
        if not isinstance(schema, dict) or depth > 6:
            return "pyany"
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            return self.rule(" | ".join(_py_literal(v) for v in schema["enum"]))
        if "const" in schema:
            return self.rule(_py_literal(schema["const"]))
        for key in ("anyOf", "oneOf"):
            subs = schema.get(key)
            if isinstance(subs, list) and subs:
                return self.rule(" | ".join(self.value(s, depth + 1) for s in subs))
        types = schema_types(schema)
        if not types:
            return "pyany"
        alts = []
        for t in sorted(types):
            if t == "string" and ("minLength" in schema or "maxLength" in schema):
                low, high = _counts(schema, "minLength", "maxLength", MAX_PY_LENGTH)
                alts.append(self.rule(f'"\'" pysq{{{low},{high}}} "\'" | '
                                      f'"\\"" pydq{{{low},{high}}} "\\""'))
            elif t == "string":
                alts.append("pystr")
            elif t == "integer":
                alts.append("pyint")
            elif t == "number":
                alts.append("pynum")
            elif t == "boolean":
                alts.append("pybool")
            elif t == "null":
                alts.append("pynone")
            elif t == "array":
                item = self.value(schema.get("items"), depth + 1)
                low, high = _counts(schema, "minItems", "maxItems", 64)
                if high == 0:
                    alts.append('"[]"')
                elif low == 0:
                    alts.append(self.rule(f'"[" ({item} (", " {item}){{0,{high - 1}}})? "]"'))
                else:
                    alts.append(self.rule(f'"[" {item} (", " {item}){{{low - 1},{high - 1}}}'
                                          ' "]"'))
            elif t == "object":
                props = schema.get("properties")
                if isinstance(props, dict) and props:
                    body = self.members(props, schema.get("required") or [], ": ", depth, True)
                    alts.append(self.rule(f'"{{" {body} "}}"'))
                else:
                    alts.append("pydict")
            else:
                alts.append("pyany")
        return self.rule(" | ".join(alts)) if len(alts) > 1 else alts[0]

    def members(self, props: dict, required: list, sep: str, depth: int, quoted: bool) -> str:
        """Properties in declared order; required ones present, optional ones skippable."""
        names = list(props)
        kv = []
        for name in names:
            key = (f"({_py_str(name)}) {json.dumps(sep)}" if quoted
                   else json.dumps(name + sep))
            kv.append(f"{key} {self.value(props[name], depth + 1)}")
        n = len(names)
        rest = ['""'] * (n + 1)
        first = ['""'] * (n + 1)
        rest_names = [self.rule('""')] * (n + 1)
        first_names = [rest_names[n]] * (n + 1)
        for i in range(n - 1, -1, -1):
            req = names[i] in required
            nxt_rest, nxt_first = rest_names[i + 1], first_names[i + 1]
            rest[i] = f'(", " {kv[i]} {nxt_rest})' + ("" if req else f" | {nxt_rest}")
            first[i] = f"({kv[i]} {nxt_rest})" + ("" if req else f" | {nxt_first}")
            rest_names[i] = self.rule(rest[i])
            first_names[i] = self.rule(first[i])
        return first_names[0]


def _py_quote(text: str, quote: str = "'") -> str:
    inner = text.replace("\\", "\\\\").replace(quote, "\\" + quote).replace("\n", "\\n")
    return quote + inner + quote


def _py_str(text: str) -> str:
    """EBNF alternatives matching `text` as a Python string in either quote style (LFM2
    writes both)."""
    return f"{json.dumps(_py_quote(text))} | {json.dumps(_py_quote(text, chr(34)))}"


def _py_literal(value: Any) -> str:
    """EBNF matching the Python literal of `value`."""
    if isinstance(value, bool):
        return json.dumps("True" if value else "False")
    if value is None:
        return json.dumps("None")
    if isinstance(value, str):
        return f"({_py_str(value)})"
    return json.dumps(json.dumps(value))


def python_calls_ebnf(tools: tuple[ToolSpec, ...], once: bool) -> str:
    """EBNF for LFM2's call list body: `f(k=v, ...)` (`, ` separated unless `once`)."""
    g = _EBNF()
    calls = []
    for tool in tools:
        schema = tool.parameters
        props = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(props, dict) and props:
            kwargs = g.members(props, schema.get("required") or [], "=", 0, False)
        elif schema.get("additionalProperties") is False:  # no arguments (chat.request)
            kwargs = '""'
        else:
            kwargs = "pykwargs"
        calls.append(g.rule(f'{json.dumps(tool.name + "(")} {kwargs} ")"'))
    call = g.rule(" | ".join(calls))
    root = call if once else f'{call} (", " {call}){{0,15}}'
    return f"root ::= {root}\n" + "\n".join(g.rules) + "\n" + _PY_RULES
