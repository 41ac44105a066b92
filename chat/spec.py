"""FormatKind and FormatSpec: the per-model description of a chat format.

A spec is detected once per model (see `chat.detect`) and drives both the output parser and
the decoding constraint, so the two never disagree on syntax.
"""

from __future__ import annotations

import enum

import msgspec

THINK_START = "<think>"
THINK_END = "</think>"
HERMES_TOOL_START = "<tool_call>"
HERMES_TOOL_END = "</tool_call>"
QWEN_FUNCTION_START = "<function="
GEMMA4_CHANNEL_START = "<|channel>"
GEMMA4_CHANNEL_END = "<channel|>"
GEMMA4_TOOL_START = "<|tool_call>"
GEMMA4_TOOL_END = "<tool_call|>"
GEMMA4_TOOL_RESPONSE = "<|tool_response>"
GEMMA4_QUOTE = '<|"|>'
LFM2_TOOL_START = "<|tool_call_start|>"
LFM2_TOOL_END = "<|tool_call_end|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"
LLAMA3_PYTHON_TAG = "<|python_tag|>"
LLAMA3_CALL_BEGIN = '{"name": '  # how Llama's templates begin a call (`tojson`'s separators)
MISTRAL_THINK_START = "[THINK]"
MISTRAL_THINK_END = "[/THINK]"
HARMONY_START = "<|start|>"
HARMONY_END = "<|end|>"
HARMONY_MESSAGE = "<|message|>"
HARMONY_CHANNEL = "<|channel|>"
HARMONY_CONSTRAIN = "<|constrain|>"
HARMONY_RETURN = "<|return|>"
HARMONY_CALL = "<|call|>"


class FormatKind(str, enum.Enum):
    """The chat formats; the values are the names used in logs and configs."""

    HERMES_JSON = "hermes_json"
    QWEN_XML = "qwen_xml"
    GEMMA4 = "gemma4"
    LFM2_PYTHONIC = "lfm2_pythonic"
    HARMONY = "harmony"
    # `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo)
    MISTRAL_JSON = "mistral_json"
    # `[TOOL_CALLS]NAME[ARGS]{...}` (Mistral Small 3.1+, Devstral, Magistral, Ministral 3)
    MISTRAL_ARGS = "mistral_args"
    # a bare `{"name": ..., "parameters": {...}}` opening the turn (Llama 3.1-3.3)
    LLAMA3_JSON = "llama3_json"
    CONTENT_ONLY = "content_only"

    def __str__(self) -> str:
        return self.value


class FormatSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Markers and switches of one model's chat format.

    Attributes:
        kind: the format.
        reasoning: whether the model may write a reasoning block (its markers are known).
        reasoning_forced: the template always opens reasoning in the generation prompt.
        thinking_switch: the template reads `enable_thinking`.
        reasoning_start / reasoning_end: reasoning markers ("" when there are none).
        tool_start / tool_end: the tool-call block markers ("" for content_only).
        stop_marker: text that ends the turn; everything after it is ignored.
        extra_stops: strings that end generation but are not in the model's eos list.
    """

    kind: FormatKind
    reasoning: bool = False
    reasoning_forced: bool = False
    thinking_switch: bool = False
    reasoning_start: str = ""
    reasoning_end: str = ""
    tool_start: str = ""
    tool_end: str = ""
    stop_marker: str = ""
    extra_stops: tuple[str, ...] = ()

    @property
    def has_tools(self) -> bool:
        """Whether the format has a tool-call syntax this library parses."""
        return self.kind is not FormatKind.CONTENT_ONLY

    @property
    def tool_openers(self) -> tuple[str, ...]:
        """The strings the parser reads as the start of a tool call (qwen_xml also takes a
        bare `<function=` without its `<tool_call>` wrapper, llama3_json a bare call)."""
        if self.kind is FormatKind.QWEN_XML:
            return (self.tool_start, QWEN_FUNCTION_START)
        if self.kind is FormatKind.LLAMA3_JSON:
            return (self.tool_start, LLAMA3_CALL_BEGIN)
        return (self.tool_start,)

    @property
    def bare_call(self) -> bool:
        """A call may be written with no marker (llama3_json): any object that opens the
        turn, or `{"name": ` anywhere, is read as one (and is content if it is not one)."""
        return self.kind is FormatKind.LLAMA3_JSON


def spec_for_kind(
    kind: FormatKind | str,
    *,
    reasoning: bool = True,
    reasoning_forced: bool = False,
    thinking_switch: bool = False,
    reasoning_markers: tuple[str, str] | None = None,
) -> FormatSpec:
    """Build the spec of a format with its standard markers.

    Args:
        kind: the format (a `FormatKind` or its name).
        reasoning: whether reasoning markers are known for this model. default: True.
        reasoning_forced: the generation prompt always opens reasoning.
        thinking_switch: the template reads `enable_thinking`.
        reasoning_markers: override the (start, end) reasoning markers of tag formats,
            e.g. Mistral's `[THINK]`/`[/THINK]`.

    Raises:
        ValueError: `kind` is not one of the formats; the message lists them.
    """
    try:
        kind = FormatKind(kind)
    except ValueError:
        names = ", ".join(k.value for k in FormatKind)
        raise ValueError(f"unknown chat format {kind!r}; expected one of: {names}") from None
    start, end = reasoning_markers or (THINK_START, THINK_END)
    tool = ("", "")
    stop = ""
    extra: tuple[str, ...] = ()
    if kind is FormatKind.HERMES_JSON or kind is FormatKind.QWEN_XML:
        tool = (HERMES_TOOL_START, HERMES_TOOL_END)
    elif kind is FormatKind.GEMMA4:
        start, end = GEMMA4_CHANNEL_START, GEMMA4_CHANNEL_END
        tool = (GEMMA4_TOOL_START, GEMMA4_TOOL_END)
        stop = GEMMA4_TOOL_RESPONSE
        extra = (GEMMA4_TOOL_RESPONSE,)
    elif kind is FormatKind.LFM2_PYTHONIC:
        tool = (LFM2_TOOL_START, LFM2_TOOL_END)
    elif kind is FormatKind.MISTRAL_JSON or kind is FormatKind.MISTRAL_ARGS:
        tool = (MISTRAL_TOOL_CALLS, "")  # the calls run to the end of the turn
    elif kind is FormatKind.LLAMA3_JSON:
        tool = (LLAMA3_PYTHON_TAG, "")
    elif kind is FormatKind.HARMONY:
        # The analysis channel is harmony's reasoning; it has no on/off switch.
        start, end = HARMONY_CHANNEL + "analysis" + HARMONY_MESSAGE, HARMONY_END
        tool = (" to=functions.", HARMONY_CALL)
        extra = (HARMONY_CALL,)
        reasoning = True
    if not reasoning:
        start = end = ""
    return FormatSpec(
        kind=kind,
        reasoning=reasoning,
        reasoning_forced=reasoning and reasoning_forced,
        thinking_switch=thinking_switch,
        reasoning_start=start,
        reasoning_end=end,
        tool_start=tool[0],
        tool_end=tool[1],
        stop_marker=stop,
        extra_stops=extra,
    )
