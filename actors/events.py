"""The worker's request: GenerateRequest, and the events its stream yields, in order:
one Accepted or Rejected, then Deltas and Finished per choice, then Usage."""

from __future__ import annotations


import msgspec

from chat import ChatMsg, Delta


class GenerateRequest(msgspec.Struct, kw_only=True):
    """What the ingress sends a worker (already shape-checked; values still validated)."""

    request_id: str
    kind: str = "chat"  # "chat" | "completion"
    messages: list[dict] = msgspec.field(default_factory=list)
    prompt: str = ""
    body: dict = msgspec.field(default_factory=dict)  # the OpenAI options, for constraints
    max_tokens: int | None = None
    n: int = 1
    stop: list[str] = msgspec.field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False


class TokenLogprob(msgspec.Struct, array_like=True):
    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]]


class Accepted(msgspec.Struct, tag="accepted", tag_field="event"):
    request_id: str
    model: str
    prompt_tokens: int


class Rejected(msgspec.Struct, tag="rejected", tag_field="event"):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class Deltas(msgspec.Struct, tag="deltas", tag_field="event"):
    index: int
    deltas: list[Delta] = msgspec.field(default_factory=list)  # chat
    text: str = ""  # completions
    logprobs: list[TokenLogprob] | None = None


class Finished(msgspec.Struct, tag="finished", tag_field="event"):
    """A choice ended. `message` (chat) is its final parse: what a non-streamed reply
    shows (a stream cannot take back a call it started; the final parse can)."""

    index: int
    finish_reason: str
    completion_tokens: int
    message: ChatMsg | None = None


class Usage(msgspec.Struct, tag="usage", tag_field="event"):
    prompt_tokens: int
    completion_tokens: int


class Failed(msgspec.Struct, tag="failed", tag_field="event"):
    message: str


Event = Accepted | Rejected | Deltas | Finished | Usage | Failed

__all__ = ["Accepted", "Deltas", "Event", "Failed", "Finished", "GenerateRequest", "Rejected",
           "TokenLogprob", "Usage"]
