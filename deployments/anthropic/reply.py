"""Anthropic's answers: the worker's events become content blocks (`thinking`, `text`,
`tool_use`) and the stream events in Anthropic's order (`MessageBuilder`: the streamed
and the non-streamed message are built by the same code, so `get_final_message()` of the
SDK equals the non-streamed reply); `MessagesReply` is the ingress's reply over it.

Usage as Anthropic counts it: `input_tokens` is the prompt's tokens that were computed,
`cache_read_input_tokens` those taken from the prefix cache (their sum is the prompt,
what count_tokens says), `cache_creation_input_tokens` 0 (caching costs nothing here).
`message_start` comes with the worker's Accepted and carries the prompt's tokens with the
same split (the Accepted goes out with the first output, once the prompt has taken its
cached prefix; older clients read input usage there), and `message_delta` carries the
whole usage (as Anthropic's does: newer clients read all of it there).

Ids as Anthropic's: `tool_use` blocks are `toolu_...` (a client sends back whichever id it
got), and each answer has a `request-id` header (the SDK's `_request_id`).
"""

from __future__ import annotations

import uuid

import msgspec
from starlette.responses import JSONResponse, Response

from actors.events import Accepted, Deltas, Failed, Finished, Usage
from chat import Delta
from deployments.anthropic.errors import HEADER, request_id_of
from deployments.anthropic.partial import parse_partial
from deployments.errors import ApiError

# sent while a stream waits for its events (the ingress's keep-alive)
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
_encoder = msgspec.json.Encoder()


def new_id() -> str:
    return uuid.uuid4().hex


def usage_body(u: Usage | None) -> dict:
    """A message's usage (`service_tier` "standard", as Anthropic answers one that is not
    batched or priority)."""
    if u is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "service_tier": "standard"}
    return {"input_tokens": u.prompt_tokens - u.cached_tokens,
            "output_tokens": u.completion_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u.cached_tokens, "service_tier": "standard"}


def start_usage(accepted: Accepted | None) -> dict:
    """message_start's usage: the prompt's tokens, split as in message_delta (those
    computed, those the prefix cache served)."""
    n = accepted.prompt_tokens if accepted is not None else 0
    cached = min(n, accepted.cached_tokens) if accepted is not None else 0
    return {"input_tokens": n - cached, "output_tokens": 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "service_tier": "standard"}


def tool_use_id(call_id: str) -> str:
    """A tool call's id as Anthropic spells one: `toolu_` and the call's random part."""
    return "toolu_" + call_id.removeprefix("call_")


class MessageBuilder:
    """A message's content blocks and stream events, from the worker's events.

    Args:
        base: the message's fixed fields: id, model.
        stop_sequences: the request's; a stop among them is `stop_reason: "stop_sequence"`.
        omit_thinking: thinking blocks without their text (`thinking.display: "omitted"`).
    """

    def __init__(self, base: dict, stop_sequences: list[str], *,
                 omit_thinking: bool = False) -> None:
        self.base = base
        self.stops = set(stop_sequences)
        self.omit_thinking = omit_thinking
        self.blocks: list[dict] = []
        self.arguments: dict[int, str] = {}  # a tool_use block's input JSON so far
        self.open: int | None = None  # the index of the block being written
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: Usage | None = None
        self.error: str | None = None
        self.started = False

    def _start(self, accepted: Accepted | None) -> list[dict]:
        """The stream's first event, with the prompt's tokens (the rest of the usage comes
        whole with message_delta)."""
        self.started = True
        return [{"type": "message_start",
                 "message": {**self.message(), "content": [], "stop_reason": None,
                             "stop_sequence": None, "usage": start_usage(accepted)}}]

    def _kind(self) -> str | None:
        return None if self.open is None else self.blocks[self.open]["type"]

    def _open(self, block: dict) -> list[dict]:
        out = self._close()
        self.open = len(self.blocks)
        self.blocks.append(block)
        return out + [{"type": "content_block_start", "index": self.open,
                       "content_block": dict(block)}]

    def _close(self) -> list[dict]:
        index, self.open = self.open, None
        return [] if index is None else [{"type": "content_block_stop", "index": index}]

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.open, "delta": delta}

    def _add(self, d: Delta) -> list[dict]:
        out: list[dict] = []
        if d.field == "reasoning_content":
            if self._kind() != "thinking":
                out += self._open({"type": "thinking", "thinking": "", "signature": ""})
            if d.text and not self.omit_thinking:
                self.blocks[self.open]["thinking"] += d.text
                out.append(self._delta({"type": "thinking_delta", "thinking": d.text}))
        elif d.field == "content":
            if self._kind() != "text":
                out += self._open({"type": "text", "text": ""})
            self.blocks[self.open]["text"] += d.text
            out.append(self._delta({"type": "text_delta", "text": d.text}))
        else:  # a tool call: `name` opens one, the rest continue its arguments
            if d.name:
                out += self._open({"type": "tool_use", "id": tool_use_id(d.id),
                                   "name": d.name, "input": {}})
                self.arguments[self.open] = ""
            if self._kind() == "tool_use" and d.text:
                self.arguments[self.open] += d.text
                out.append(self._delta({"type": "input_json_delta", "partial_json": d.text}))
        return out

    def add(self, batch: list) -> list[dict]:
        """Fold a batch of the worker's events; returns the stream events they make
        (message_start with the Accepted; a failure before it is the error alone)."""
        out: list[dict] = []
        for ev in batch:
            if not self.started and not isinstance(ev, Failed):
                out += self._start(ev if isinstance(ev, Accepted) else None)
            if isinstance(ev, Deltas):
                for d in ev.deltas:
                    if d.text or d.name:
                        out += self._add(d)
            elif isinstance(ev, Finished):
                out += self._close()
                if ev.stop is not None and ev.stop in self.stops:
                    self.stop_reason, self.stop_sequence = "stop_sequence", ev.stop
                else:
                    self.stop_reason = _STOP_REASONS.get(ev.finish_reason, "end_turn")
            elif isinstance(ev, Usage):
                self.usage = ev
                out += [{"type": "message_delta",
                         "delta": {"stop_reason": self.stop_reason,
                                   "stop_sequence": self.stop_sequence},
                         "usage": usage_body(ev)},
                        {"type": "message_stop"}]
            elif isinstance(ev, Failed):
                self.error = ev.message
                out.append(error_event(ev.message))
        return out

    def message(self) -> dict:
        """The message object (as far as it got; a call that max_tokens cut has the members
        of its input that were whole, as the SDK reads the streamed call)."""
        content = [{**b, "input": parse_partial(self.arguments[i])} if b["type"] == "tool_use"
                   else dict(b) for i, b in enumerate(self.blocks)]
        return {"id": self.base["id"], "type": "message", "role": "assistant",
                "model": self.base["model"], "content": content,
                "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence,
                "usage": usage_body(self.usage)}


def error_event(message: str) -> dict:
    return {"type": "error", "error": {"type": "api_error", "message": message}}


def sse(events: list[dict]) -> bytes:
    """Stream events as SSE, each with its `event:` line as Anthropic sends them."""
    return b"".join(b"event: " + ev["type"].encode() + b"\ndata: " + _encoder.encode(ev)
                    + b"\n\n" for ev in events)


class MessagesReply:
    """A Messages request's answer (deployments.exchange.Reply): SSE events with their
    `event:` lines, or the message object; its `request-id` header either way."""

    media_type = "text/event-stream"

    def __init__(self, builder: MessageBuilder) -> None:
        self.builder = builder
        self.request_id = request_id_of(builder.base["id"])
        self.headers = {"Cache-Control": "no-cache", HEADER: self.request_id}

    def lead(self) -> bytes:
        """Nothing: message_start comes with the worker's first event, which carries the
        prompt's tokens (a stream that waits for it starts with pings)."""
        return b""

    def render(self, batch: list) -> bytes:
        return sse(self.builder.add(batch))

    def broken(self) -> bytes:
        return sse([error_event("The model worker failed during the stream.")])

    def tail(self) -> bytes:
        return b""

    def fold(self, batch: list) -> None:
        self.builder.add(batch)

    def answer(self) -> Response:
        if self.builder.error is not None:
            raise ApiError(500, self.builder.error, type="server_error",
                           headers={HEADER: self.request_id})
        return JSONResponse(self.builder.message(), headers={HEADER: self.request_id})

