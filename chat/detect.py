"""detect_format and format_prefill: a model's chat format from its template and vocabulary.

Markers are checked from most specific to least. A marker is "known" when the template
mentions it or the vocabulary has it as a single token.
"""

from __future__ import annotations

from collections.abc import Callable

from chat.spec import (
    GEMMA4_CHANNEL_START,
    GEMMA4_TOOL_START,
    HARMONY_CHANNEL,
    HARMONY_MESSAGE,
    HARMONY_START,
    HERMES_TOOL_START,
    LFM2_TOOL_START,
    LLAMA3_PYTHON_TAG,
    MISTRAL_ARGS,
    MISTRAL_THINK_END,
    MISTRAL_THINK_START,
    MISTRAL_TOOL_CALLS,
    QWEN_FUNCTION_START,
    THINK_END,
    THINK_START,
    FormatKind,
    FormatSpec,
    spec_for_kind,
)


def detect_format(template: str, is_token: Callable[[str], bool]) -> FormatSpec:
    """Detect the chat format of a model.

    Args:
        template: the Jinja chat template source ("" when the model has none).
        is_token: says whether a string is a single token of the model's vocabulary.

    Returns:
        The detected `FormatSpec`.
    """

    def known(marker: str) -> bool:
        return marker in template or is_token(marker)

    thinking_switch = "enable_thinking" in template
    if HARMONY_MESSAGE in template and HARMONY_CHANNEL in template:
        kind = FormatKind.HARMONY
    elif GEMMA4_TOOL_START in template or (
        GEMMA4_CHANNEL_START in template and is_token(GEMMA4_TOOL_START)
    ):
        kind = FormatKind.GEMMA4
    elif known(LFM2_TOOL_START):
        kind = FormatKind.LFM2_PYTHONIC
    elif QWEN_FUNCTION_START in template and "<parameter=" in template:
        kind = FormatKind.QWEN_XML
    elif HERMES_TOOL_START in template:
        kind = FormatKind.HERMES_JSON
    elif MISTRAL_TOOL_CALLS in template:
        kind = FormatKind.MISTRAL_ARGS if MISTRAL_ARGS in template else FormatKind.MISTRAL_JSON
    elif _llama3_calls(template):
        kind = FormatKind.LLAMA3_JSON
    else:
        kind = FormatKind.CONTENT_ONLY

    markers = (THINK_START, THINK_END)
    if kind is FormatKind.GEMMA4:
        reasoning = known(GEMMA4_CHANNEL_START)
    elif kind is FormatKind.HARMONY:
        reasoning = True
    elif known(THINK_START) or known(THINK_END):
        reasoning = True
    elif known(MISTRAL_THINK_START) and known(MISTRAL_THINK_END):
        reasoning, markers = True, (MISTRAL_THINK_START, MISTRAL_THINK_END)
    else:
        reasoning = False
    return spec_for_kind(
        kind,
        reasoning=reasoning,
        reasoning_forced=reasoning and _opens_reasoning_always(template, markers[0]),
        thinking_switch=thinking_switch,
        reasoning_markers=markers,
    )


def _llama3_calls(template: str) -> bool:
    """Llama 3.1-3.3's templates: the header tokens, and calls written (and asked for) as
    `{"name": ..., "parameters": ...}`, or the `<|python_tag|>` of their built-in tools."""
    return "<|start_header_id|>" in template and (
        LLAMA3_PYTHON_TAG in template or '"parameters": ' in template)


def _opens_reasoning_always(template: str, start: str) -> bool:
    """The generation prompt ends with the reasoning opener, whatever the switches say."""
    at = template.rfind("add_generation_prompt")
    if at < 0:
        return False
    tail = template[at:]
    opens = (start + "\\n") in tail or (start + "\n") in tail
    return opens and "enable_thinking" not in tail


def format_prefill(spec: FormatSpec, prompt_tail: str) -> str:
    """The text the parser and the constraint must see before the generated text.

    Args:
        spec: the model's format.
        prompt_tail: the decoded end of the rendered prompt (its last few tokens).

    Returns:
        harmony: everything after the last `<|start|>`; tag formats: the reasoning opener
        when the tail opened a reasoning block it did not close, else "".
    """
    if spec.kind is FormatKind.HARMONY:
        at = prompt_tail.rfind(HARMONY_START)
        return prompt_tail[at + len(HARMONY_START) :] if at >= 0 else ""
    if not spec.reasoning:
        return ""
    opened = prompt_tail.rfind(spec.reasoning_start)
    closed = prompt_tail.rfind(spec.reasoning_end)
    if opened >= 0 and closed < opened:
        return spec.reasoning_start
    return ""
