"""Chat completions' legacy function calling (`functions`, `function_call`, the `function`
role), which OpenAI still serves and older clients (LangChain's and AutoGen's first
releases, scripts written in 2023) still send: the request becomes a tools request (one
call a turn, as the legacy API makes at most one), and the answer says the call as
`message.function_call` (`delta.function_call` streamed) with `finish_reason`
"function_call", as OpenAI answers such a request.
"""

from __future__ import annotations

from typing import Any

from actors.events import Deltas, Finished
from deployments.errors import ApiError
from deployments.openai.reply import ChatReply, ChoiceFold

LEGACY_FIELDS = ("functions", "function_call")


def asks_legacy(raw: Any) -> bool:
    """Whether a chat request asks for legacy function calling (and its answer's shape)."""
    return isinstance(raw, dict) and any(raw.get(k) is not None for k in LEGACY_FIELDS)


def is_legacy(raw: Any) -> bool:
    """Whether a chat request uses the legacy function fields or role (in its history
    alone, with today's tools, it gets today's answer)."""
    if not isinstance(raw, dict):
        return False
    if any(raw.get(k) is not None for k in LEGACY_FIELDS):
        return True
    messages = raw.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "function" or m.get("function_call"))
        for m in messages)


def as_tools(raw: dict) -> dict:
    """The request with its functions as tools, its function_call as tool_choice, and its
    history's function calls and results as tool calls and tool results.

    Raises:
        ApiError: both `functions` and `tools`, or a field of the wrong shape (400 naming
            it).
    """
    out = {k: v for k, v in raw.items() if k not in LEGACY_FIELDS}
    functions = raw.get("functions")
    if functions is not None:
        if raw.get("tools") is not None:
            raise ApiError(400, "Send 'functions' or 'tools', not both ('functions' is the "
                                "older form of 'tools').", param="functions")
        if not isinstance(functions, list):
            raise ApiError(400, "'functions' must be a list of functions.", param="functions")
        out["tools"] = [{"type": "function", "function": f} for f in functions]
        out["parallel_tool_calls"] = False  # the legacy answer holds one call
    choice = raw.get("function_call")
    if choice is not None:
        if raw.get("tool_choice") is not None:
            raise ApiError(400, "Send 'function_call' or 'tool_choice', not both.",
                           param="function_call")
        if isinstance(choice, dict):
            out["tool_choice"] = {"type": "function", "function": choice}
        elif choice in ("auto", "none"):
            out["tool_choice"] = choice
        else:
            raise ApiError(400, f"'function_call' is {choice!r}; use 'auto', 'none' or "
                                '{"name": ...}.', param="function_call")
    if isinstance(raw.get("messages"), list):
        out["messages"] = _messages(raw["messages"])
    return out


def _messages(messages: list) -> list:
    out, last_id = [], None
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = dict(m)
        call = m.pop("function_call", None)
        if call is not None and m.get("role") == "assistant":
            last_id = f"call_{i}"
            m["tool_calls"] = [{"id": last_id, "type": "function", "function": call}]
        elif m.get("role") == "function":  # a function's result: the call before it
            m["role"] = "tool"
            m["tool_call_id"] = last_id or f"call_{i}"
        out.append(m)
    return out


def _legacy_delta(delta: dict) -> dict:
    calls = delta.pop("tool_calls", None)
    if calls:
        fn = calls[0].get("function", {})
        delta["function_call"] = ({"name": fn["name"], "arguments": fn.get("arguments", "")}
                                  if "name" in fn else {"arguments": fn.get("arguments", "")})
    return delta


def _legacy_reason(reason: str | None) -> str | None:
    return "function_call" if reason == "tool_calls" else reason


class LegacyChatReply(ChatReply):
    """A chat completion's answer in the legacy function-calling shape."""

    def delta_choice(self, ev: Deltas) -> dict:
        choice = super().delta_choice(ev)
        choice["delta"] = _legacy_delta(choice["delta"])
        return choice

    def finish_choice(self, ev: Finished) -> dict:
        choice = super().finish_choice(ev)
        choice["finish_reason"] = _legacy_reason(choice["finish_reason"])
        return choice

    def final_choice(self, index: int, fold: ChoiceFold) -> dict:
        choice = super().final_choice(index, fold)
        message = choice["message"]
        calls = message.pop("tool_calls", None)
        if calls:
            fn = calls[0]["function"]
            message["function_call"] = {"name": fn["name"], "arguments": fn["arguments"]}
        choice["finish_reason"] = _legacy_reason(choice["finish_reason"])
        return choice
