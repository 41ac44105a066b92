"""The OpenAI request bodies the ingress accepts, as msgspec Structs.

Unknown fields are ignored (clients send many); a JSON null reads as missing. Constraint
options (tools, tool_choice, response_format, ...) are checked by the chat library on the
worker, which knows the model, and first by `deployments.openai.request` with the same code.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

PositiveInt = Annotated[int, Meta(ge=1)]


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str | dict = "{}"


class ToolCallIn(msgspec.Struct, kw_only=True):
    """A tool call in an assistant message of the conversation."""

    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    refusal: str | None = None  # an assistant's refusal part, as the SDK replays it


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ("system", "developer", "user", "assistant", "tool"):
            raise ValueError(f"unknown role {self.role!r}; use system, developer, user, "
                             "assistant or tool")


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: each chunk's counts so far


class SamplingFields(msgspec.Struct, kw_only=True):
    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    n: Annotated[int, Meta(ge=1, le=8)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    # llama.cpp's: the penalties read the last n tokens (-1: the whole sequence, 0: off)
    repeat_last_n: Annotated[int, Meta(ge=-1)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Meta(max_length=8)] | None = None
    # token id (as a string) -> bias added to its logit before sampling, as OpenAI's
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None  # vLLM's: no end token before


class ChatRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    think: Any = None
    reasoning_effort: Any = None
    chat_template_kwargs: Any = None
    continue_final_message: bool | None = None  # vLLM's: the last (assistant) message goes on


class CompletionRequest(SamplingFields, kw_only=True):
    # a string, token ids, or a list of one of those (deployments.openai.request: `_prompt`)
    prompt: str | list[Any]
    # 0 with `echo`: the prompt scored (its logprobs), nothing written
    max_tokens: Annotated[int, Meta(ge=0)] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Meta(ge=1)] | None = None  # only as many as `n` (see _check)
    response_format: Any = None  # vLLM's: the whole text a JSON document
