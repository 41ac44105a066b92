"""OpenAI's answers: chat completion and completion chunks (SSE, then [DONE]) and their
non-streamed fold into one body (`ChatReply`, `CompletionReply`: the ingress's replies),
and the pieces other APIs reuse (`ChoiceFold`, `message_from`, `usage_body`)."""

from __future__ import annotations

import codecs
import functools
from typing import Any, ClassVar

import msgspec
from starlette.responses import Response

from actors.events import Accepted, Deltas, Failed, Finished, Prompt, TokenLogprob, Usage
from chat import ChatMsg
from deployments.errors import ApiError, error_body
from deployments.exchange import WholeReply

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def usage_body(u: Usage) -> dict:
    """OpenAI's `usage`: `prompt_tokens` is the whole prompt, of which
    `prompt_tokens_details.cached_tokens` came from the KV cache; with speculative
    decoding, `completion_tokens_details` counts the drafted tokens kept and rejected (the
    fields OpenAI's predicted outputs report), present once a token was drafted, and the
    tokens that wrote reasoning (`reasoning_tokens`), present once one did."""
    body = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}
    if u.accepted_prediction_tokens or u.rejected_prediction_tokens:
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": u.accepted_prediction_tokens,
            "rejected_prediction_tokens": u.rejected_prediction_tokens}
    if u.reasoning_tokens:
        body.setdefault("completion_tokens_details", {})["reasoning_tokens"] = u.reasoning_tokens
    return body


def chat_delta(event: Deltas, *, first: bool) -> dict:
    """The `delta` object of a chat chunk (several fields may grow in one event)."""
    delta: dict[str, Any] = {"role": "assistant"} if first else {}
    for d in event.deltas:
        if d.field == "tool_call":
            call: dict[str, Any] = {"index": d.index}
            if d.name:
                call.update(id=d.id, type="function",
                            function={"name": d.name, "arguments": d.text})
            else:
                call["function"] = {"arguments": d.text}
            delta.setdefault("tool_calls", []).append(call)
        else:
            delta[d.field] = delta.get(d.field, "") + d.text
    return delta


def chat_logprobs(items: list[TokenLogprob] | None) -> dict | None:
    if items is None:
        return None
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": b}
                                          for s, v, b in t.top]} for t in items]}


def completion_logprobs(items: list[TokenLogprob] | None, offsets: TextOffsets,
                        prompt: list[TokenLogprob] | None = None) -> dict | None:
    """A completion choice's `logprobs`: its tokens', placed by `offsets` (where the
    choice's text has got to), after the echoed `prompt`'s where given (from 0; its first
    token's are null). None where there are neither. Each position's `top_logprobs` holds
    the token itself beside the `logprobs` likeliest (as OpenAI's: "up to logprobs+1
    elements")."""
    if items is None and prompt is None:
        return None
    at = [*TextOffsets(0).place(prompt or []), *offsets.place(items or [])]
    items = [*(prompt or []), *(items or [])]
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [None if t.logprob is None
                             else {**{s: v for s, v, _ in t.top}, t.token: t.logprob}
                             for t in items],
            "text_offset": at}


class TextOffsets:
    """Where each of a choice's tokens starts in its text, in characters, counted from the
    tokens' bytes (not their pieces: a character split across tokens shows as U+FFFD in
    each, and is one character, at the token that completes it): the same whether the
    tokens come in one list or in chunks."""

    def __init__(self, start: int) -> None:
        self.at = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def place(self, items: list[TokenLogprob]) -> list[int]:
        out = []
        for t in items:
            out.append(self.at)
            self.at += len(self._decoder.decode(bytes(t.bytes)))
        return out


class ChoiceFold:
    """A choice's final state, folded from its events exactly as a client folds chunks."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, dict] = {}
        self.logprobs: list[TokenLogprob] | None = None
        self.finish_reason: str | None = None
        self.final: ChatMsg | None = None

    def add(self, event: Deltas) -> None:
        for d in event.deltas:
            if d.field == "reasoning_content":
                self.reasoning.append(d.text)
            elif d.field == "content":
                self.content.append(d.text)
            elif d.name:
                self.calls[d.index] = {"id": d.id, "type": "function",
                                       "function": {"name": d.name, "arguments": d.text}}
            elif d.index in self.calls:
                self.calls[d.index]["function"]["arguments"] += d.text
        if event.text:
            self.content.append(event.text)
        if event.logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(event.logprobs)

    def chat_message(self) -> dict:
        if self.final is not None:
            return message_from(self.final)
        content = "".join(self.content)
        msg: dict[str, Any] = {"role": "assistant",
                               "content": content if content or not self.calls else None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return msg


def message_from(msg: ChatMsg) -> dict:
    """An OpenAI assistant message from a final parse."""
    calls = [{"id": c.id, "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}} for c in msg.tool_calls]
    out: dict[str, Any] = {"role": "assistant",
                           "content": msg.content if msg.content or not calls else None}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if calls:
        out["tool_calls"] = calls
    return out


class _Reply:
    """A chat completion's or a completion's answer (deployments.exchange.Reply).

    Args:
        meta: the body's fixed fields: id, created, model.
        include_usage: streamed: every chunk carries `usage` (null), and a last chunk with
            no choices carries the counts (`stream_options.include_usage`).
        continuous_usage: streamed: each choice's chunk carries the counts so far, its
            choice's tokens written (vLLM's `stream_options.continuous_usage_stats`: a
            chunk may hold several tokens); the last chunk's too, as `include_usage`.
    """

    media_type = "text/event-stream"
    headers: ClassVar[dict[str, str]] = {"Cache-Control": "no-cache"}
    chunk_object = final_object = ""

    def __init__(self, meta: dict, include_usage: bool = False,
                 continuous_usage: bool = False) -> None:
        self.meta, self.include_usage = meta, include_usage or continuous_usage
        self.continuous_usage = continuous_usage
        self.prompt_counts = Usage(prompt_tokens=0, completion_tokens=0)  # streamed: Accepted's
        self.started: set[int] = set()  # choices that have sent a chunk
        self.folds: dict[int, ChoiceFold] = {}
        self.counts = Usage(prompt_tokens=0, completion_tokens=0)

    # the choice objects, per API
    def delta_choice(self, ev: Deltas) -> dict:
        raise NotImplementedError

    def finish_choice(self, ev: Finished) -> dict:
        raise NotImplementedError

    def final_choice(self, index: int, fold: ChoiceFold) -> dict:
        raise NotImplementedError

    # -- streamed
    def lead(self) -> bytes:
        return b""

    def render(self, batch: list) -> bytes:
        return b"".join(self._chunks(batch))

    def _chunk(self, choices: list, usage: dict | None = None) -> bytes:
        body = {**self.meta, "object": self.chunk_object, "choices": choices}
        if self.include_usage:
            body["usage"] = usage
        return sse(body)

    def _so_far(self, tokens: int) -> dict | None:
        """A choice chunk's `usage`: the counts with the choice's `tokens` written where
        continuous usage was asked for (else null)."""
        if not self.continuous_usage:
            return None
        return usage_body(msgspec.structs.replace(self.prompt_counts, completion_tokens=tokens))

    def _chunks(self, batch: list):
        for ev in batch:
            if isinstance(ev, Accepted):
                self.prompt_counts = Usage(prompt_tokens=ev.prompt_tokens, completion_tokens=0,
                                           cached_tokens=ev.cached_tokens)
            elif isinstance(ev, Deltas):
                choice = self.delta_choice(ev)
                self.started.add(ev.index)
                yield self._chunk([choice], self._so_far(ev.tokens))
            elif isinstance(ev, Finished):
                choice = self.finish_choice(ev)
                self.started.add(ev.index)
                yield self._chunk([choice], self._so_far(ev.completion_tokens))
            elif isinstance(ev, Usage):
                if self.include_usage:
                    yield self._chunk([], usage_body(ev))
            elif isinstance(ev, Failed):
                yield sse(error_body(ev.message, type="server_error"))

    def broken(self) -> bytes:
        return sse(error_body("The model worker failed during the stream.",
                              type="server_error"))

    def tail(self) -> bytes:
        return DONE

    # -- not streamed
    def fold(self, batch: list) -> None:
        for ev in batch:
            if isinstance(ev, Deltas):
                self.folds.setdefault(ev.index, ChoiceFold()).add(ev)
            elif isinstance(ev, Finished):
                f = self.folds.setdefault(ev.index, ChoiceFold())
                f.finish_reason = ev.finish_reason
                f.final = ev.message
            elif isinstance(ev, Usage):
                self.counts = ev
            elif isinstance(ev, Failed):
                raise ApiError(503, ev.message, type="server_error")

    def choices(self) -> list[dict]:
        """The folded choices, by index."""
        return [self.final_choice(i, self.folds[i]) for i in sorted(self.folds)]

    def answer(self) -> Response:
        return Response(_encoder.encode({**self.meta, "object": self.final_object,
                                         "choices": self.choices(),
                                         "usage": usage_body(self.counts)}),
                        media_type="application/json")


class ChatReply(_Reply):
    chunk_object, final_object = "chat.completion.chunk", "chat.completion"

    def delta_choice(self, ev: Deltas) -> dict:
        return {"index": ev.index, "delta": chat_delta(ev, first=ev.index not in self.started),
                "logprobs": chat_logprobs(ev.logprobs), "finish_reason": None}

    def finish_choice(self, ev: Finished) -> dict:
        delta = {"role": "assistant"} if ev.index not in self.started else {}
        return {"index": ev.index, "delta": delta, "logprobs": None,
                "finish_reason": ev.finish_reason}

    def final_choice(self, index: int, fold: ChoiceFold) -> dict:
        return {"index": index, "message": fold.chat_message(),
                "logprobs": chat_logprobs(fold.logprobs), "finish_reason": fold.finish_reason}


class CompletionReply(_Reply):
    """A completion's chunks or object; with `echo` (the worker's Prompt event), each
    choice's text starts with the prompt, and its logprobs with the prompt's where they
    were asked (in its first chunk when streamed)."""

    chunk_object = final_object = "text_completion"

    def __init__(self, meta: dict, include_usage: bool = False,
                 continuous_usage: bool = False) -> None:
        super().__init__(meta, include_usage, continuous_usage)
        self.prompt = Prompt(text="")
        self.offsets: dict[int, TextOffsets] = {}  # where each choice's text has got to

    def _chunks(self, batch: list):
        self._note_prompt(batch)
        yield from super()._chunks(batch)

    def fold(self, batch: list) -> None:
        self._note_prompt(batch)
        super().fold(batch)

    def _note_prompt(self, batch: list) -> None:
        """The worker's Prompt event (echo), which comes before any choice's output."""
        self.prompt = next((ev for ev in batch if isinstance(ev, Prompt)), self.prompt)

    def _lead(self, index: int) -> tuple[str, list[TokenLogprob] | None]:
        """The prompt and its logprobs, before a choice's first text (once)."""
        if index in self.offsets:
            return "", None
        self.offsets[index] = TextOffsets(len(self.prompt.text))
        return self.prompt.text, self.prompt.logprobs

    def delta_choice(self, ev: Deltas) -> dict:
        lead, lead_lp = self._lead(ev.index)
        return {"index": ev.index, "text": lead + ev.text,
                "logprobs": completion_logprobs(ev.logprobs, self.offsets[ev.index], lead_lp),
                "finish_reason": None}

    def finish_choice(self, ev: Finished) -> dict:
        lead, lead_lp = self._lead(ev.index)
        return {"index": ev.index, "text": lead,
                "logprobs": completion_logprobs(None, TextOffsets(0), lead_lp),
                "finish_reason": ev.finish_reason}

    def final_choice(self, index: int, fold: ChoiceFold) -> dict:
        return {"index": index, "text": self.prompt.text + "".join(fold.content),
                "logprobs": completion_logprobs(fold.logprobs,
                                                TextOffsets(len(self.prompt.text)),
                                                self.prompt.logprobs),
                "finish_reason": fold.finish_reason}


class CompletionBatchReply(WholeReply):
    """The answer to a completions request of several prompts (a batch: each prompt its own
    worker request, folded by its own CompletionReply): one object with every prompt's
    choices, prompt k's choice i at index k * n + i (OpenAI's order), the usage summed.
    Never streamed (the request path refuses a streamed batch)."""

    def __init__(self, meta: dict, parts: list[CompletionReply], n: int) -> None:
        self.meta, self.parts, self.n = meta, parts, n

    def answer(self) -> Response:
        choices = []
        for k, part in enumerate(self.parts):
            for choice in part.choices():
                choices.append({**choice, "index": k * self.n + choice["index"]})
        usage = functools.reduce(Usage.plus, (p.counts for p in self.parts))
        return Response(_encoder.encode({**self.meta, "object": "text_completion",
                                         "choices": choices, "usage": usage_body(usage)}),
                        media_type=self.media_type)

    def fold(self, batch: list) -> None:  # the parts fold their own events
        raise NotImplementedError("a batch's parts fold their own events")
