"""decode_request: a request body to its typed request, or a 400 naming the parameter.

msgspec checks every field's type against `deployments.schemas` (its error path becomes
the OpenAI `param`); then the rules types cannot say: the constraint options through the
chat library (the same check the worker makes, so a bad tool is a 400 before any worker is
asked), message content parts and tool calls, and the options that go together.
"""

from __future__ import annotations

from typing import Any

import msgspec

from chat import ConstraintError, constraint_request_from_openai
from deployments.errors import ApiError
from deployments.schemas import ChatRequest, CompletionRequest

_DECODERS: dict[str, msgspec.json.Decoder] = {}


def decode_request(body: bytes, kind: str) -> tuple[Any, dict]:
    """The typed request (one reused decoder per kind) and the raw JSON object.

    Raises:
        ApiError: 400 with `param` set to the offending field's path.
    """
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(
            ChatRequest if kind == "chat" else CompletionRequest)
    try:
        req = decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"Invalid request: {exc}", param=_param_from(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}") from None
    raw = msgspec.json.decode(body)
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "'stream_options' is only allowed with 'stream': true.",
                       param="stream_options")
    if kind == "chat":
        _check_chat(req, raw)
    return req, raw


def _check_chat(req: ChatRequest, raw: dict) -> None:
    if req.top_logprobs and not req.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                at = f"{where}.content[{j}]"
                if part.type != "text":
                    raise ApiError(400, f"'{at}.type' is {part.type!r}; this server's models "
                                        "read text only, so content parts must be of type "
                                        "'text'.", param=f"{at}.type")
                if part.text is None:
                    raise ApiError(400, f"'{at}.text' is missing; a text part needs its text.",
                                   param=f"{at}.text")
        if m.tool_calls and m.role != "assistant":
            raise ApiError(400, f"'{where}.tool_calls' is only allowed on assistant messages, "
                                f"not on a {m.role!r} message.", param=f"{where}.tool_calls")
    try:
        constraint_request_from_openai(raw)
    except ConstraintError as exc:
        raise ApiError(400, exc.message, param=exc.param) from None


def _param_from(err: msgspec.ValidationError) -> str | None:
    """The OpenAI `param` of a msgspec error: its path, plus a missing field's name."""
    text = str(err)
    path = ""
    if " - at `$" in text:
        text, path = text.split(" - at `$", 1)
        path = path.rstrip("`").lstrip(".")
    if text.startswith("Object missing required field `"):
        field = text.split("`")[1]
        path = f"{path}.{field}" if path else field
    return path or None
