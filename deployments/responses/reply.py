"""Responses' answers: the worker's events become output items (`reasoning`, `message`,
`function_call`) and the semantic stream events (`ResponseBuilder`: the streamed and the
non-streamed answer are built by the same code, so they agree); `ResponsesReply` is the
ingress's reply over it, storing a finished response for `previous_response_id`."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import msgspec
from starlette.responses import JSONResponse, Response

from actors.events import Deltas, Failed, Finished, TokenLogprob, Usage
from deployments.errors import ApiError
from deployments.responses.store import ResponseStore, Stored


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _logprobs(items: list[TokenLogprob]) -> list[dict]:
    """Tokens' logprobs in the Responses API's shape (`include` asks for them)."""
    return [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
             "top_logprobs": [{"token": s, "logprob": v, "bytes": b} for s, v, b in t.top]}
            for t in items]


class ResponseBuilder:
    """A response's output items and stream events, from the worker's events.

    Args:
        base: the response's fixed fields (id, model, tools, ...; see `response_base`).
    """

    def __init__(self, base: dict) -> None:
        self.base = base
        self.seq = 0
        self.items: list[dict] = []
        self.open: dict | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.error: str | None = None
        self.pending: list[dict] = []  # tokens' logprobs not yet given to output text

    def _event(self, kind: str, **fields: Any) -> dict:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start(self) -> list[dict]:
        """The first two events of a stream."""
        body = self.response("in_progress")
        return [self._event("response.created", response=body),
                self._event("response.in_progress", response=body)]

    def _open(self, item: dict, part: dict | None) -> list[dict]:
        out = self._close()
        index = len(self.items)
        self.items.append(item)
        self.open = item
        out.append(self._event("response.output_item.added", output_index=index,
                               item={**item, "status": "in_progress",
                                     **({"content": []} if "content" in item else {}),
                                     **({"arguments": ""} if "arguments" in item else {})}))
        if part is not None:
            out.append(self._event("response.content_part.added", item_id=item["id"],
                                   output_index=index, content_index=0, part=dict(part)))
        return out

    def _close(self, status: str = "completed") -> list[dict]:
        """Close the open item as `status` ("incomplete": the token limit cut it)."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.items) - 1
        item["status"] = status
        out = []
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", **ids,
                                   name=item["name"], arguments=item["arguments"]))
        else:
            part = item["content"][0]
            if item["type"] == "message":
                # tokens whose text was held back to the end
                part["logprobs"], self.pending = part["logprobs"] + self.pending, []
                out.append(self._event("response.output_text.done", **ids, content_index=0,
                                       text=part["text"], logprobs=part["logprobs"]))
            else:
                out.append(self._event("response.reasoning_text.done", **ids,
                                       content_index=0, text=part["text"]))
            out.append(self._event("response.content_part.done", **ids, content_index=0,
                                   part=dict(part)))
        out.append(self._event("response.output_item.done", output_index=index,
                               item=dict(item)))
        return out

    def _delta(self, field: str, text: str, call_id: str, name: str) -> list[dict]:
        out: list[dict] = []
        item = self.open
        if field == "reasoning_content":
            if item is None or item["type"] != "reasoning":
                out += self._open({"type": "reasoning", "id": _new_id("rs"), "summary": [],
                                   "content": [{"type": "reasoning_text", "text": ""}]},
                                  {"type": "reasoning_text", "text": ""})
            self.open["content"][0]["text"] += text
            out.append(self._event("response.reasoning_text.delta", item_id=self.open["id"],
                                   output_index=len(self.items) - 1, content_index=0,
                                   delta=text))
        elif field == "content":
            if item is None or item["type"] != "message":
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out += self._open({"type": "message", "id": _new_id("msg"), "role": "assistant",
                                   "content": [dict(part)]}, part)
            self.open["content"][0]["text"] += text
            logprobs, self.pending = self.pending, []
            part = self.open["content"][0]
            part["logprobs"] = part["logprobs"] + logprobs
            out.append(self._event("response.output_text.delta", item_id=self.open["id"],
                                   output_index=len(self.items) - 1, content_index=0,
                                   delta=text, logprobs=logprobs))
        else:  # a tool call: `name` opens one, the rest continue its arguments
            if name:
                out += self._open({"type": "function_call", "id": _new_id("fc"),
                                   "call_id": call_id, "name": name, "arguments": ""}, None)
            if self.open is None or self.open["type"] != "function_call":
                return out
            if text:
                self.open["arguments"] += text
                out.append(self._event("response.function_call_arguments.delta",
                                       item_id=self.open["id"],
                                       output_index=len(self.items) - 1, delta=text))
        return out

    def add(self, batch: list) -> list[dict]:
        """Fold a batch of the worker's events; returns the stream events they make."""
        out: list[dict] = []
        for ev in batch:
            if isinstance(ev, Deltas):
                fields = {d.field for d in ev.deltas if d.text or d.name}
                if ev.logprobs and fields <= {"content"}:  # (events joined across a change
                    self.pending += _logprobs(ev.logprobs)  # of field: whose is whose unknown)
                for d in ev.deltas:
                    if d.text or d.name:
                        out += self._delta(d.field, d.text, d.id, d.name)
                if ev.deltas and (self.open is None or self.open["type"] != "message"):
                    self.pending = []  # tokens of reasoning or a call: not output text
            elif isinstance(ev, Finished):  # the item being written when the limit hit
                self.finish_reason = ev.finish_reason  # was cut: an agent must not run it
                out += self._close("incomplete" if ev.finish_reason == "length" or ev.cut
                                   else "completed")
            elif isinstance(ev, Usage):
                self.usage = ev
                body = self.response()
                out.append(self._event(f"response.{body['status']}", response=body))
            elif isinstance(ev, Failed):
                self.error = ev.message
                out.append(self._event("error", code="server_error", message=ev.message,
                                       param=None))
        return out

    def response(self, status: str | None = None) -> dict:
        """The response object: `status` "in_progress" while it runs; at the end
        "completed", or "incomplete" when the token limit cut it."""
        if status is None:
            status = "incomplete" if self.finish_reason == "length" else "completed"
        u = self.usage
        usage = None if u is None else {  # no cache is written apart from the KV prefix cache
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}
        return {**self.base, "status": status,
                "incomplete_details": {"reason": "max_output_tokens"}
                if status == "incomplete" else None,
                "output": [dict(i) for i in self.items] if status != "in_progress" else [],
                "usage": usage}

    def assistant_messages(self) -> list[dict]:
        """The output as chat messages (what a follow-up's conversation continues from)."""
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        for item in self.items:
            if item["type"] == "reasoning":
                msg["reasoning_content"] = item["content"][0]["text"]
            elif item["type"] == "message":
                msg["content"] += item["content"][0]["text"]
            else:
                msg.setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item["name"], "arguments": item["arguments"]}})
        return [msg]


_encoder = msgspec.json.Encoder()


def sse(events: list[dict]) -> bytes:
    """Stream events as SSE, each with its `event:` line as OpenAI sends them."""
    return b"".join(b"event: " + ev["type"].encode() + b"\ndata: " + _encoder.encode(ev)
                    + b"\n\n" for ev in events)


class ResponsesReply:
    """A Responses request's answer (deployments.exchange.Reply): SSE events with their
    `event:` lines, or the response object; kept in `store` (None: not kept) once it has
    finished without an error, with `conversation` and the output as its history, and
    `items`: the input items it was made from."""

    media_type = "text/event-stream"
    headers: ClassVar[dict[str, str]] = {"Cache-Control": "no-cache"}

    def __init__(self, builder: ResponseBuilder, store: ResponseStore | None,
                 conversation: list[dict], items: list[dict] | None = None) -> None:
        self.builder, self.store, self.conversation = builder, store, conversation
        self.items = items or []

    def _keep(self) -> None:  # once the response is finished (idempotent)
        b = self.builder
        if self.store is not None and b.usage is not None and b.error is None:
            self.store.put(Stored(response=b.response(), items=self.items,
                                  conversation=self.conversation + b.assistant_messages()))

    def lead(self) -> bytes:  # response.created and .in_progress before the first token
        return sse(self.builder.start())

    def render(self, batch: list) -> bytes:
        events = self.builder.add(batch)
        if self.builder.usage is not None:
            self._keep()
        return sse(events)

    def broken(self) -> bytes:
        return sse([{"type": "error", "code": "server_error",
                     "message": "The model worker failed during the stream.", "param": None,
                     "sequence_number": -1}])

    def tail(self) -> bytes:
        return b""

    def fold(self, batch: list) -> None:
        self.builder.add(batch)

    def answer(self) -> Response:
        if self.builder.error is not None:
            raise ApiError(503, self.builder.error, type="server_error")
        self._keep()
        return JSONResponse(self.builder.response())
