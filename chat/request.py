"""ConstraintRequest: the OpenAI options that restrict an output, validated and normalised.

`constraint_request_from_openai(body)` reads `tools`, `tool_choice` (auto, none, required, a
named function, allowed_tools), `parallel_tool_calls`, `response_format` (text, json_object,
json_schema) and the thinking switch (`think: false`, `reasoning_effort: "none"`,
`chat_template_kwargs.enable_thinking: false`). A JSON null reads as missing everywhere.
Invalid values raise `ConstraintError` naming the parameter (HTTP 400).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from chat.errors import ConstraintError
from chat.unenforced import refusal, unenforced

ToolChoice = Literal["auto", "none", "required"]
ResponseFormat = Literal["text", "json_object", "json_schema"]
# OpenAI's rule, plus '.', which LFM2's dotted function names use
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One function tool: its name and the JSON schema of its arguments (an object);
    `strict`: the client asked that the arguments follow the schema exactly (a schema the
    grammar cannot apply is then refused, not loosened)."""

    name: str
    parameters: dict = msgspec.field(default_factory=lambda: {"type": "object"})
    description: str = ""
    strict: bool = False


class ConstraintRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a request asks of the output's shape.

    Attributes:
        tools: the tools the model may call (after `allowed_tools` filtering).
        all_tools: every tool the request declared (for rendering the prompt).
        tool_choice: "auto", "none" or "required"; a named function is "required" with
            `tools` holding that one function.
        named: the function name when the request named one.
        parallel_tool_calls: False: at most one call (the default with a named function).
        response_format: "text", "json_object" or "json_schema".
        json_schema: the schema for "json_schema".
        allow_reasoning: False when the request turned thinking off.
    """

    tools: tuple[ToolSpec, ...] = ()
    all_tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    named: str | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat = "text"
    json_schema: dict | None = None
    allow_reasoning: bool = True

    @property
    def parse_tool_calls(self) -> bool:
        """Whether tool markup in the output is read as calls."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def constrains(self) -> bool:
        """Whether anything restricts the output beyond the thinking switch."""
        return bool(self.tools) or self.response_format != "text"

    def without_tools(self) -> ConstraintRequest:
        return msgspec.structs.replace(self, tools=(), tool_choice="auto", named=None)


def _get(body: dict, key: str) -> Any:
    value = body.get(key)
    return None if value is None else value


def _optional(obj: dict, key: str, kind: type, where: str) -> Any:
    """obj[key] (None when missing or null); a ConstraintError naming `where` when it is
    not a `kind` (str or bool)."""
    value = obj.get(key)
    if value is not None and not isinstance(value, kind):
        raise ConstraintError(f"'{where}' must be {_type_name(kind())}, got "
                              f"{_type_name(value)}.", param=where)
    return value


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _tools(body: dict) -> tuple[ToolSpec, ...]:
    raw = _get(body, "tools")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConstraintError(f"'tools' must be an array of tools, got {_type_name(raw)}.",
                              param="tools")
    out: list[ToolSpec] = []
    seen: set[str] = set()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ConstraintError(f"'{where}' must be an object.", param=where)
        kind = _get(tool, "type")
        if kind is None:
            kind = "function"
        if not isinstance(kind, str):
            raise ConstraintError(f"'{where}.type' must be a string, got {_type_name(kind)}.",
                                  param=f"{where}.type")
        if kind != "function":
            raise ConstraintError(
                f"'{where}.type' is {kind!r}; only 'function' tools are supported.",
                param=f"{where}.type")
        fn = _get(tool, "function")
        if fn is None and "name" in tool:
            fn = tool  # the flat (Responses API) shape
        if not isinstance(fn, dict):
            raise ConstraintError(f"'{where}.function' must be an object with a 'name'.",
                                  param=f"{where}.function")
        at = f"{where}.function" if fn is not tool else where
        name = _get(fn, "name")
        if not isinstance(name, str) or not name:
            raise ConstraintError(f"'{at}.name' must be a non-empty string.",
                                  param=f"{at}.name")
        if not _TOOL_NAME.fullmatch(name):
            raise ConstraintError(
                f"'{at}.name' is {name!r}; a tool name is 1 to 64 letters, digits, '_', '-' "
                "or '.'.", param=f"{at}.name")
        if name in seen:
            raise ConstraintError(f"Two tools are named {name!r}; tool names must be unique.",
                                  param=f"{at}.name")
        seen.add(name)
        params = _get(fn, "parameters")
        if params is None:  # OpenAI: "omitting parameters defines ... an empty parameter list"
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ConstraintError(
                f"'{at}.parameters' must be a JSON schema of type 'object'.",
                param=f"{at}.parameters")
        _check_object_schema(params, f"{at}.parameters")
        desc = _optional(fn, "description", str, f"{at}.description")
        strict = _optional(fn, "strict", bool, f"{at}.strict")
        found = unenforced(params, f"{at}.parameters") if strict else None
        if found:
            raise ConstraintError(refusal(found), param=f"{at}.parameters")
        out.append(ToolSpec(name=name, parameters=_arguments_schema(params),
                            description=desc or "", strict=bool(strict)))
    return tuple(out)


# what lets an object schema take a key its `properties` do not name
_OPENS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "required",
          "propertyNames", "minProperties", "anyOf", "oneOf", "allOf", "$ref", "if")


def _arguments_schema(params: dict) -> dict:
    """The schema a tool's calls are held to: a tool that declares no parameters (none
    given, or MCP's `{"type": "object", "properties": {}}`) takes `{}` (JSON Schema would
    take any object there, and a model then fills it with whatever it invents); any other
    schema as it is."""
    if params.get("properties") == {} and not any(k in params for k in _OPENS):
        return {**params, "additionalProperties": False}
    return params


def _check_object_schema(schema: dict, where: str) -> None:
    """The parts of an object schema the grammar and the templates read: `properties` an
    object of schemas, `required` an array of names."""
    props = _get(schema, "properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ConstraintError(f"'{where}.properties' must be an object, got "
                                  f"{_type_name(props)}.", param=f"{where}.properties")
        for key, sub in props.items():
            if not isinstance(sub, (dict, bool)):
                raise ConstraintError(f"'{where}.properties.{key}' must be a JSON schema, got "
                                      f"{_type_name(sub)}.", param=f"{where}.properties.{key}")
    required = _get(schema, "required")
    if required is not None and (not isinstance(required, list)
                                 or not all(isinstance(r, str) for r in required)):
        raise ConstraintError(f"'{where}.required' must be an array of property names.",
                              param=f"{where}.required")


def _function_name(obj: Any, where: str) -> str:
    """The name in `{"type": "function", "function": {"name": ...}}` (or a flat `name`)."""
    if not isinstance(obj, dict):
        raise ConstraintError(f"'{where}' must be an object.", param=where)
    if _get(obj, "type") not in (None, "function"):
        raise ConstraintError(f"'{where}.type' must be 'function'.", param=f"{where}.type")
    fn = _get(obj, "function")
    name = _get(fn, "name") if isinstance(fn, dict) else _get(obj, "name")
    if not isinstance(name, str) or not name:
        raise ConstraintError(f"'{where}.function.name' must be a non-empty string.",
                              param=f"{where}.function.name")
    return name


def _tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> tuple[str, str | None, tuple]:
    raw = _get(body, "tool_choice")
    names = [t.name for t in tools]
    if raw is None:
        return "auto", None, tools
    if isinstance(raw, str):
        if raw not in ("auto", "none", "required"):
            raise ConstraintError(
                f"'tool_choice' is {raw!r}; use 'auto', 'none', 'required' or "
                '{"type": "function", "function": {"name": ...}}.', param="tool_choice")
        if raw == "required" and not tools:
            raise ConstraintError("'tool_choice' is 'required' but the request has no 'tools'.",
                                  param="tool_choice")
        return raw, None, tools
    if not isinstance(raw, dict):
        raise ConstraintError(f"'tool_choice' must be a string or an object, got "
                              f"{_type_name(raw)}.", param="tool_choice")
    kind = _get(raw, "type")
    if kind == "allowed_tools":
        allowed = _get(raw, "allowed_tools")
        if not isinstance(allowed, dict):
            raise ConstraintError("'tool_choice.allowed_tools' must be an object with 'mode' "
                                  "and 'tools'.", param="tool_choice.allowed_tools")
        mode = _get(allowed, "mode") or "auto"
        if mode not in ("auto", "required"):
            raise ConstraintError(f"'tool_choice.allowed_tools.mode' is {mode!r}; use 'auto' or "
                                  "'required'.", param="tool_choice.allowed_tools.mode")
        listed = _get(allowed, "tools")
        if not isinstance(listed, list) or not listed:
            raise ConstraintError("'tool_choice.allowed_tools.tools' must be a non-empty array.",
                                  param="tool_choice.allowed_tools.tools")
        chosen = []
        for i, item in enumerate(listed):
            where = f"tool_choice.allowed_tools.tools[{i}]"
            name = _function_name(item, where)
            if name not in names:
                raise ConstraintError(f"'{where}' names {name!r}, which is not in 'tools'.",
                                      param=f"{where}.function.name")
            chosen.append(name)
        subset = tuple(t for t in tools if t.name in chosen)
        return mode, None, subset
    if kind != "function":
        raise ConstraintError("'tool_choice.type' must be 'function' or 'allowed_tools'.",
                              param="tool_choice.type")
    name = _function_name(raw, "tool_choice")
    if not tools:
        raise ConstraintError("'tool_choice' names a function but the request has no 'tools'.",
                              param="tool_choice")
    if name not in names:
        raise ConstraintError(
            f"'tool_choice.function.name' is {name!r}, which is not in 'tools' "
            f"(known: {', '.join(names)}).", param="tool_choice.function.name")
    return "required", name, tuple(t for t in tools if t.name == name)


def _response_format(body: dict) -> tuple[str, dict | None]:
    raw = _get(body, "response_format")
    if raw is None:
        return "text", None
    if not isinstance(raw, dict):
        raise ConstraintError("'response_format' must be an object with a 'type'.",
                              param="response_format")
    kind = _get(raw, "type") or "text"
    if kind == "text":
        return "text", None
    if kind == "json_object":
        return "json_object", {"type": "object"}
    if kind != "json_schema":
        raise ConstraintError(f"'response_format.type' is {kind!r}; use 'text', 'json_object' "
                              "or 'json_schema'.", param="response_format.type")
    spec = _get(raw, "json_schema")
    if not isinstance(spec, dict):
        raise ConstraintError("'response_format.json_schema' must be an object with 'name' and "
                              "'schema'.", param="response_format.json_schema")
    _optional(spec, "name", str, "response_format.json_schema.name")
    strict = _optional(spec, "strict", bool, "response_format.json_schema.strict")
    schema = _get(spec, "schema")
    if schema is None:
        schema = {}
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("'response_format.json_schema.schema' must be a JSON schema object.",
                              param="response_format.json_schema.schema")
    if schema is True or schema == {}:
        schema = {}
    if schema is False:
        raise ConstraintError("'response_format.json_schema.schema' is false: nothing matches.",
                              param="response_format.json_schema.schema")
    found = unenforced(schema, "response_format.json_schema.schema") if strict else None
    if found:
        raise ConstraintError(refusal(found), param="response_format.json_schema.schema")
    return "json_schema", schema


def _allow_reasoning(body: dict) -> bool:
    allow = True
    think = _optional(body, "think", bool, "think")
    if think is not None:
        allow = allow and think
    effort = _get(body, "reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise ConstraintError(f"'reasoning_effort' is {effort!r}; use one of "
                                  f"{', '.join(REASONING_EFFORTS)}.", param="reasoning_effort")
        allow = allow and effort != "none"
    kwargs = _get(body, "chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise ConstraintError("'chat_template_kwargs' must be an object.",
                                  param="chat_template_kwargs")
        enable = _optional(kwargs, "enable_thinking", bool,
                           "chat_template_kwargs.enable_thinking")
        if enable is not None:
            allow = allow and enable
    return allow


def constraint_request_from_openai(body: dict) -> ConstraintRequest:
    """Validate and normalise a request's constraint options.

    Args:
        body: the decoded JSON body of a chat completion request.

    Returns:
        The normalised `ConstraintRequest`.

    Raises:
        ConstraintError: an option is malformed or inconsistent; `param` names it.
    """
    if not isinstance(body, dict):
        raise ConstraintError("The request body must be a JSON object.")
    all_tools = _tools(body)
    choice, named, tools = _tool_choice(body, all_tools)
    parallel = _optional(body, "parallel_tool_calls", bool, "parallel_tool_calls")
    fmt, schema = _response_format(body)
    return ConstraintRequest(
        tools=tools if choice != "none" else (),
        all_tools=all_tools,
        tool_choice=choice,  # type: ignore[arg-type]
        named=named,
        # a named function is called once unless the request says otherwise (OpenAI's
        # "forced function: call exactly one specific function")
        parallel_tool_calls=(named is None) if parallel is None else parallel,
        response_format=fmt,  # type: ignore[arg-type]
        json_schema=schema,
        allow_reasoning=_allow_reasoning(body),
    )
