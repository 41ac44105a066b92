"""OpenAI's Responses requests on the same pipeline: a request becomes a chat request (then
the same validation, worker request and constraints), with the conversation of
`previous_response_id` before its input (cut to the context with `truncation: "auto"`);
`responses_call` makes the ingress's Call for POST /v1/responses.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from actors.events import GenerateRequest
from deployments.body import PARTS_JOIN, decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.openai.request import convert_request, generate_request
from deployments.openai.schemas import ChatRequest
from deployments.responses.items import INCLUDABLE, LOGPROBS, input_items
from deployments.responses.reply import ResponseBuilder, ResponsesReply
from deployments.responses.store import ResponseStore
from deployments.responses.truncation import fit_context


class TextIn(msgspec.Struct, kw_only=True):
    format: dict | None = None


class ReasoningIn(msgspec.Struct, kw_only=True):
    effort: str | None = None
    summary: Any = None  # accepted; the reasoning itself is returned, never a summary


class ResponsesIn(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict] | None = None  # required (a 400 without it)
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
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    include: list[str] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    conversation: Any = None  # the Conversations API's: not served (a 400, not ignored)
    prompt: Any = None  # a stored prompt template's reference: none are stored (a 400)
    user: str | None = None


def decode(body: bytes) -> ResponsesIn:
    """A typed Responses request; a 400 naming the field otherwise."""
    return decode_json(body, ResponsesIn)


# -- the request ------------------------------------------------------------------------------
def _text(content: Any, where: str, sep: str = PARTS_JOIN) -> str:
    """A message's text: a string, or text parts (input_text / output_text / text, and a
    reasoning item's reasoning_text / summary_text) joined by `sep`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"'{where}' must be a string or a list of content parts.",
                       param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "reasoning_text", "summary_text"):
            raise ApiError(400, f"'{where}[{j}].type' is {kind!r}; this server's models read "
                                "text only, so parts must be 'input_text' or 'output_text' "
                                "(a reasoning item's: 'reasoning_text' or 'summary_text').",
                           param=f"{where}[{j}].type")
        if not isinstance(part.get("text"), str):
            raise ApiError(400, f"'{where}[{j}].text' must be a string.",
                           param=f"{where}[{j}].text")
        out.append(part["text"])
    return sep.join(out)


def input_messages(items: str | list[dict], history: list[dict]) -> list[dict]:
    """The chat messages of `history` (a stored conversation) followed by `items`."""
    messages = [dict(m) for m in history]
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls", [])}
    answered = {m.get("tool_call_id") for m in messages if m["role"] == "tool"}
    waiting = [i for i in names if i not in answered]  # the calls with no output yet
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    reasoning = ""
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message" and waiting and item.get("role") != "assistant":
            # as OpenAI: each call's output comes before the next user (or system) message;
            # the model's own text between its calls (preambles) is no answer it waits for
            raise ApiError(400, f"No tool output found for function call {waiting[0]}: "
                                f"'{where}' is a message, and a function_call_output for each "
                                "earlier call comes first.", param="input")
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
            if item.get("content"):  # one text cut into parts
                reasoning += _text(item["content"], f"{where}.content", sep="")
            else:  # OpenAI's summary: paragraphs
                reasoning += _text(item.get("summary") or [], f"{where}.summary", sep="\n\n")
        elif kind == "function_call":
            for field in ("call_id", "name", "arguments"):
                if not isinstance(item.get(field), str):
                    raise ApiError(400, f"'{where}.{field}' must be a string.",
                                   param=f"{where}.{field}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            names[item["call_id"]] = item["name"]
            waiting.append(item["call_id"])
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":  # else: the same turn's calls
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            if reasoning:
                last["reasoning_content"], reasoning = reasoning, ""
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ApiError(400, f"'{where}.call_id' must be a string.",
                               param=f"{where}.call_id")
            if call_id not in names:
                raise ApiError(400, f"'{where}.call_id' is {call_id!r}, which no function_call "
                                    "in the conversation has.", param=f"{where}.call_id")
            waiting = [w for w in waiting if w != call_id]
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
        tools = choice.get("tools") or []
        if not isinstance(tools, list):
            raise ApiError(400, "'tool_choice.tools' must be a list of tools.",
                           param="tool_choice.tools")
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice.get("mode", "auto"),
            "tools": [{"type": "function", "function": {"name": t.get("name")}}
                      for t in tools if isinstance(t, dict)]}}
    return choice


def _response_format(fmt: dict | None) -> dict | None:
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):  # required here (chat's may leave it out)
            raise ApiError(400, "'text.format.schema' is required with type 'json_schema': "
                                "the JSON schema the output follows (an object).",
                           param="text.format.schema")
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": kind}


# chat's parameter -> the Responses field it came from (for the errors' `param`, the
# conversion's and the worker's)
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format",
           "reasoning_effort": "reasoning.effort", "messages": "input"}


def _param(param: str | None) -> str | None:
    if not param:
        return param
    nested = "response_format.json_schema."  # text.format holds json_schema's fields itself
    if param.startswith(nested):
        return "text.format." + param[len(nested):]
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
    for value in req.include or []:
        if value not in INCLUDABLE:
            raise ApiError(400, f"'include' has {value!r}; use one of "
                                f"{', '.join(sorted(INCLUDABLE))}.", param="include")
    if req.conversation is not None:
        raise ApiError(400, "'conversation' (the Conversations API) is not supported here; "
                            "continue a conversation with 'previous_response_id'.",
                       param="conversation")
    if req.prompt is not None:
        raise ApiError(400, "'prompt' (a stored prompt template) is not supported here: send "
                            "its text as 'instructions' and 'input'.", param="prompt")
    if req.input is None:
        raise ApiError(400, "'input' is required: the conversation's next items (a string, "
                            "or a list of messages and tool outputs).", param="input")
    if req.input == "" or req.input == []:
        raise ApiError(400, "'input' is empty.", param="input")
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
    if LOGPROBS in (req.include or []):  # the output text's tokens, and their alternatives
        raw.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    raw = {k: v for k, v in raw.items() if v is not None}
    try:
        return generate_request(convert_request(raw, ChatRequest), raw), conversation
    except ApiError as err:
        err.param = _param(err.param)
        # a named function as the Responses API writes it, not as chat completions do
        err.message = err.message.replace('{"type": "function", "function": {"name": ...}}',
                                          '{"type": "function", "name": ...}')
        raise


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
            "tools": req.tools or [], "top_p": req.top_p, "top_logprobs": req.top_logprobs,
            "truncation": req.truncation or "disabled",
            "user": req.user, "metadata": req.metadata or {}}


def stored_history(req: ResponsesIn, store: ResponseStore) -> tuple[list[dict], list[dict]]:
    """The conversation of `previous_response_id` (as chat messages) and its input items
    and outputs; empty without one.

    Raises:
        ApiError: 404 naming `previous_response_id`, a response the store does not hold.
    """
    if not req.previous_response_id:
        return [], []
    try:
        previous = store.get(req.previous_response_id)
    except ApiError as err:
        err.param = "previous_response_id"
        raise
    return previous.conversation, previous.items + previous.response["output"]


async def input_tokens(body: bytes, ingress: Ingress) -> dict:
    """POST /v1/responses/input_tokens: the tokens the request's input (with its stored
    conversation, instructions and tools) would prompt the model with, counted by a worker
    with the model's template (nothing generated, nothing stored)."""
    req = decode(body)
    ingress.check_model(req.model)
    history, _ = stored_history(req, ingress.state("responses", ResponseStore))
    greq, _ = chat_request(req, history)
    return {"object": "response.input_tokens",
            "input_tokens": await ingress.count_tokens(req.model, greq)}


async def responses_call(body: bytes, ingress: Ingress) -> Call:
    """POST /v1/responses's Call: the request with its stored conversation (cut to the
    model's context with `truncation: "auto"`, which counts the prompt on a worker), answered
    by a ResponsesReply that stores the finished response (unless `store: false`)."""
    req = decode(body)
    ingress.check_model(req.model)
    store = ingress.state("responses", ResponseStore)
    history, earlier = stored_history(req, store)
    greq, conversation = chat_request(req, history)
    items = earlier + input_items(req.input)
    if req.truncation == "auto":
        greq = await fit_context(ingress, req.model, greq, keep=int(bool(req.instructions)))
    builder = ResponseBuilder(response_base(req, "resp_" + greq.request_id))
    keep = store if req.store is not False else None
    names = {**_PARAMS, **{f"tools[{i}].function.parameters": f"tools[{i}].parameters"
                           for i in range(len(req.tools or []))}}  # (a strict tool's 400)
    return Call(model=req.model, request=greq, stream=bool(req.stream), params=names,
                reply=ResponsesReply(builder, keep, conversation, items))
