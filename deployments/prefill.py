"""A reply begun by the client (a prefill): a conversation whose last message is the
assistant's own text is continued from that text, as Anthropic's Messages API and Ollama's
chat do; the reply holds what the model adds. A last assistant message without text, or
only whitespace (and without tool calls), is the turn left for the model: it is dropped."""

from __future__ import annotations

from typing import Any


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def continuation(messages: list[dict]) -> tuple[list[dict], bool]:
    """The conversation to render and whether its last message is continued (the
    ChatGenerate's `continue_final`)."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return messages, False
    if not _text(last.get("content")).strip():
        return messages[:-1], False
    return messages, True
