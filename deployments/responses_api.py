"""OpenAI's Responses API on the same pipeline: a request becomes a chat request (then the
same validation, worker request and constraints), and the worker's events become output
items (`reasoning`, `message`, `function_call`) and the semantic stream events.

`chat_request` translates a request (with the conversation of `previous_response_id`);
`ResponseBuilder` turns a request's events into stream events and the final response
(the streamed and the non-streamed answer are built by the same code, so they agree);
`ResponseStore` keeps finished responses for `previous_response_id`, GET and DELETE.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from actors.events import Deltas, Failed, Finished, GenerateRequest, Usage
from deployments.errors import ApiError
from deployments.validate import convert_request, decode_json, generate_request

STORE_MAX = 1000
STORE_TTL_S = 3600.0


class TextIn(msgspec.Struct, kw_only=True):
    format: dict | None = None


class ReasoningIn(msgspec.Struct, kw_only=True):
    effort: str | None = None
    summary: Any = None  # accepted; the reasoning itself is returned, never a summary


class ResponsesIn(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict] = ""
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextIn | None = None
    reasoning: ReasoningIn | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    seed: int | None = None  # an extension (as in chat completions): same seed, same output
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    background: bool | None = None
    user: str | None = None


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def decode(body: bytes) -> ResponsesIn:
    """A typed Responses request; a 400 naming the field otherwise."""
    return decode_json(body, ResponsesIn)


# -- the request ------------------------------------------------------------------------------
def _text(content: Any, where: str) -> str:
    """A message's text: a string, or text parts (input_text / output_text / text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"'{where}' must be a string or a list of content parts.",
                       param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "reasoning_text"):
            raise ApiError(400, f"'{where}[{j}].type' is {kind!r}; this server's models read "
                                "text only, so parts must be 'input_text' or 'output_text'.",
                           param=f"{where}[{j}].type")
        if not isinstance(part.get("text"), str):
            raise ApiError(400, f"'{where}[{j}].text' must be a string.",
                           param=f"{where}[{j}].text")
        out.append(part["text"])
    return "".join(out)


def input_messages(items: str | list[dict], history: list[dict]) -> list[dict]:
    """The chat messages of `history` (a stored conversation) followed by `items`."""
    messages = [dict(m) for m in history]
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls", [])}
    reasoning = ""
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"'{where}.role' is {role!r}; use user, system, developer "
                                    "or assistant.", param=f"{where}.role")
            msg = {"role": "system" if role == "developer" else role,
                   "content": _text(item.get("content"), f"{where}.content")}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = reasoning, ""
            messages.append(msg)
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning += _text(parts, f"{where}.content")
        elif kind == "function_call":
            for field in ("call_id", "name", "arguments"):
                if not isinstance(item.get(field), str):
                    raise ApiError(400, f"'{where}.{field}' must be a string.",
                                   param=f"{where}.{field}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            names[item["call_id"]] = item["name"]
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":  # else: the same turn's calls
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            if reasoning:
                last["reasoning_content"], reasoning = reasoning, ""
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in names:
                raise ApiError(400, f"'{where}.call_id' is {call_id!r}, which no function_call "
                                    "in the conversation has.", param=f"{where}.call_id")
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": call_id, "name": names[call_id],
                             "content": output if isinstance(output, str)
                             else _text(output, f"{where}.output")})
        else:
            raise ApiError(400, f"'{where}.type' is {kind!r}; use message, function_call, "
                                "function_call_output or reasoning.", param=f"{where}.type")
    return messages


def _tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function":
            raise ApiError(400, f"'tools[{i}].type' is {t.get('type')!r}; this server runs "
                                "function tools only.", param=f"tools[{i}].type")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict")
              if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("type") == "allowed_tools":
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice.get("mode", "auto"),
            "tools": [{"type": "function", "function": {"name": t.get("name")}}
                      for t in choice.get("tools") or [] if isinstance(t, dict)]}}
    return choice


def _response_format(fmt: dict | None) -> dict | None:
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": kind}


# chat's parameter -> the Responses field it came from (for the errors' `param`)
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format",
           "reasoning_effort": "reasoning.effort", "messages": "input"}


def _param(param: str | None) -> str | None:
    if not param:
        return param
    for ours, theirs in _PARAMS.items():
        if param == ours or param.startswith((ours + ".", ours + "[")):
            return theirs
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".", 1)
    return param


def chat_request(req: ResponsesIn, history: list[dict]) -> tuple[GenerateRequest, list[dict]]:
    """The worker's request, and the conversation (without `instructions`) to store."""
    if req.background:
        raise ApiError(400, "'background' responses are not supported; use 'stream'.",
                       param="background")
    conversation = input_messages(req.input, history)
    if not conversation:
        raise ApiError(400, "'input' is empty.", param="input")
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    raw: dict[str, Any] = {
        "model": req.model, "messages": system + conversation, "tools": _tools(req.tools),
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req.text.format if req.text else None),
        "reasoning_effort": req.reasoning.effort if req.reasoning else None,
        "max_tokens": req.max_output_tokens, "temperature": req.temperature,
        "top_p": req.top_p, "seed": req.seed}
    raw = {k: v for k, v in raw.items() if v is not None}
    try:
        chat = convert_request(raw, "chat")
    except ApiError as err:
        err.param = _param(err.param)
        raise
    return generate_request(chat, raw, "chat"), conversation


# -- the answer -------------------------------------------------------------------------------
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

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.items) - 1
        item["status"] = "completed"
        out = []
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", **ids,
                                   name=item["name"], arguments=item["arguments"]))
        else:
            part = item["content"][0]
            if item["type"] == "message":
                out.append(self._event("response.output_text.done", **ids, content_index=0,
                                       text=part["text"], logprobs=[]))
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
            out.append(self._event("response.output_text.delta", item_id=self.open["id"],
                                   output_index=len(self.items) - 1, content_index=0,
                                   delta=text, logprobs=[]))
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
                for d in ev.deltas:
                    if d.text or d.name:
                        out += self._delta(d.field, d.text, d.id, d.name)
            elif isinstance(ev, Finished):
                out += self._close()
                self.finish_reason = ev.finish_reason
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
        usage = None if u is None else {
            "input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
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


def response_base(req: ResponsesIn, response_id: str) -> dict:
    """The fields of a response that its request decides."""
    fmt = (req.text.format if req.text else None) or {"type": "text"}
    return {"id": response_id, "object": "response", "created_at": int(time.time()),
            "error": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": req.model,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": None},
            "store": req.store is not False, "temperature": req.temperature,
            "text": {"format": fmt}, "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [], "top_p": req.top_p, "truncation": "disabled",
            "user": req.user, "metadata": req.metadata or {}}


_encoder = msgspec.json.Encoder()


def sse(events: list[dict]) -> bytes:
    """Stream events as SSE, each with its `event:` line as OpenAI sends them."""
    return b"".join(b"event: " + ev["type"].encode() + b"\ndata: " + _encoder.encode(ev)
                    + b"\n\n" for ev in events)


class ResponseStore:
    """Finished responses and their conversations, for `previous_response_id`, GET and
    DELETE: at most `max_items`, each kept `ttl_s` seconds (the oldest go first)."""

    def __init__(self, max_items: int = STORE_MAX, ttl_s: float = STORE_TTL_S) -> None:
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: OrderedDict[str, tuple[float, dict, list[dict]]] = OrderedDict()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._items:
            key, (at, _, _) = next(iter(self._items.items()))
            if now - at < self.ttl_s and len(self._items) <= self.max_items:
                break
            del self._items[key]

    def put(self, response: dict, conversation: list[dict]) -> None:
        self._items[response["id"]] = (time.monotonic(), response, conversation)
        self._expire()

    def get(self, response_id: str) -> tuple[dict, list[dict]]:
        """The response and its whole conversation (input and output as chat messages).

        Raises:
            ApiError: 404 for an unknown (or expired, or deleted) id.
        """
        self._expire()
        found = self._items.get(response_id)
        if found is None:
            raise ApiError(404, f"No response with id '{response_id}' is stored here "
                                "(unknown, deleted, or older than the store keeps).",
                           param="response_id", code="response_not_found")
        return found[1], found[2]

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]
