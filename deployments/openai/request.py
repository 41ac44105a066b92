"""OpenAI's chat and completion requests: `chat_call` and `completion_call` are the
ingress's Calls for them. decode_request: a request body to its typed request, or a 400
naming the parameter; generate_request: a typed request to what the worker runs (also for
the other APIs, whose requests are translated to OpenAI's first).

msgspec checks every field's type against `deployments.openai.schemas` (its error path becomes
the OpenAI `param`); then the rules types cannot say: the constraint options through the
chat library (the same check the worker makes, so a bad tool is a 400 before any worker is
asked), message content parts and tool calls, and the options that go together.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import msgspec

from actors.events import ChatGenerate, CompletionGenerate, GenerateRequest, Infill
from chat import ConstraintError, ConstraintRequest, constraint_request_from_openai
from deployments.body import decode_json, decode_raw, is_token_id, param_from
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.openai.legacy import LegacyChatReply, as_tools, asks_legacy, is_legacy
from deployments.openai.reply import ChatReply, CompletionBatchReply, CompletionReply
from deployments.openai.schemas import ChatRequest, CompletionRequest
from deployments.prefill import continuation

OpenAIRequest = ChatRequest | CompletionRequest
# prompts one completions request may hold (a batch: each one its own worker request)
MAX_PROMPTS = 64


def decode_request(body: bytes, schema: type[OpenAIRequest]) -> tuple[OpenAIRequest, dict]:
    """The typed chat or completion request and the raw JSON object.

    Raises:
        ApiError: 400 with `param` set to the offending field's path.
    """
    req = decode_json(body, schema)
    raw = decode_raw(body)
    _check(req)
    return req, raw


def convert_request(raw: dict, schema: type[OpenAIRequest]) -> OpenAIRequest:
    """`decode_request` for a JSON object already decoded (another API's request, translated
    to OpenAI's): the same types and rules."""
    try:
        req = msgspec.convert(raw, schema)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"Invalid request: {exc}", param=param_from(exc)) from None
    _check(req)
    return req


def _check(req: OpenAIRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "'stream_options' is only allowed with 'stream': true.",
                       param="stream_options")
    most = req.max_completion_tokens or req.max_tokens if isinstance(req, ChatRequest) \
        else req.max_tokens
    if req.min_tokens and most is not None and req.min_tokens > most:
        raise ApiError(400, f"'min_tokens' ({req.min_tokens}) is more than the most tokens "
                            f"asked for ({most}).", param="min_tokens")
    if isinstance(req, ChatRequest):
        _check_chat(req)
    elif req.best_of is not None and req.best_of != (req.n or 1):
        # best_of > n (sample more, return the likeliest) is not run here, as vLLM's V1
        # engine: refused, not ignored (best_of < n is OpenAI's own 400)
        raise ApiError(400, f"'best_of' is {req.best_of}; this server returns every choice it "
                            f"samples, so 'best_of' can only equal 'n' ({req.n or 1}): ask for "
                            "'n' choices (with 'logprobs') and pick among them.",
                       param="best_of")


def _check_chat(req: ChatRequest) -> None:
    if req.top_logprobs and not req.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                at = f"{where}.content[{j}]"
                if part.type == "refusal" and m.role == "assistant":
                    if part.refusal is None:
                        raise ApiError(400, f"'{at}.refusal' is missing; a refusal part needs "
                                            "its text.", param=f"{at}.refusal")
                    continue
                if part.type != "text":
                    raise ApiError(400, f"'{at}.type' is {part.type!r}; this server's models "
                                        "read text only, so content parts must be of type "
                                        "'text'.", param=f"{at}.type")
                if part.text is None:
                    raise ApiError(400, f"'{at}.text' is missing; a text part needs its text.",
                                   param=f"{at}.text")
        if m.tool_calls and m.role != "assistant":
            raise ApiError(400, f"'{where}.tool_calls' is only allowed on assistant messages, "
                                f"not on a {m.role!r} message.", param=f"{where}.tool_calls")


def _check_tool_results(req: ChatRequest) -> None:
    """OpenAI's own rule for its own clients: a tool message answers a call made before it
    (its tool_call_id one of those calls' ids). Not for other APIs' requests translated
    to this one: their histories may carry no ids."""
    ids: set[str] = set()
    for i, m in enumerate(req.messages):
        for call in m.tool_calls or []:
            if call.id is None:
                return  # calls without ids: nothing to match results against
            ids.add(call.id)
        if m.role == "tool" and m.tool_call_id is not None and m.tool_call_id not in ids:
            raise ApiError(400, f"'messages[{i}].tool_call_id' is {m.tool_call_id!r}, which no "
                                "earlier assistant message's tool_calls has: a tool message "
                                "answers a call made before it.",
                           param=f"messages[{i}].tool_call_id")


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's `logit_bias` with its keys read as token ids (the worker checks them
    against the model's vocabulary)."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (key.strip().isascii() and key.strip().isdecimal()):
            raise ApiError(400, f"'logit_bias' maps token ids to biases; {key!r} is not a "
                                "token id.", param="logit_bias")
        out[int(key)] = value
    return out


def generate_request(req: OpenAIRequest, raw: dict, *, prompt: str | list[int] | None = None,
                     **extra: Any) -> GenerateRequest:
    """The worker's request for a typed chat or completion request: typed once, here
    (`prompt`: the one of a completion's batch this request is for, else its only one;
    `extra`: fields no OpenAI request sets, as Ollama's `context_limit`).

    Raises:
        ApiError: 400 for constraint options (tools, tool_choice, response_format, the
            thinking switch) that are malformed or do not go together.
    """
    raw = _extension_format(raw)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    common = dict(
        request_id=uuid.uuid4().hex, n=req.n or 1, stop=stop,
        temperature=req.temperature, top_p=req.top_p,
        top_k=None if req.top_k in (None, -1) else req.top_k, min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0, repeat_last_n=req.repeat_last_n,
        seed=req.seed,
        logit_bias=_logit_bias(req.logit_bias), ignore_eos=bool(req.ignore_eos),
        min_tokens=req.min_tokens or 0, **extra)
    if isinstance(req, CompletionRequest):
        if prompt is None:
            [prompt] = _prompts(req.prompt, most=1)
        infill = None
        if req.suffix:  # fill in the middle: the prompt before the gap, the suffix after it
            if not isinstance(prompt, str):
                raise ApiError(400, "'suffix' fills in the middle of a text prompt; the "
                                    "prompt is token ids.", param="suffix")
            if req.echo:
                raise ApiError(400, "'echo' cannot be used with 'suffix': the prompt the "
                                    "model reads is the text around the gap in its "
                                    "fill-in-the-middle tokens.", param="echo")
            infill = Infill(suffix=req.suffix)
        if req.max_tokens == 0 and not req.echo:
            raise ApiError(400, "'max_tokens' 0 writes nothing: it is for scoring a prompt, "
                                "with 'echo' (and 'logprobs' for the prompt's logprobs).",
                           param="max_tokens")
        # a response format (vLLM's): the continuation is the document, no reasoning first
        constraint = msgspec.structs.replace(
            _constraint({"response_format": raw.get("response_format")}),
            allow_reasoning=False)
        return CompletionGenerate(prompt=prompt if isinstance(prompt, str) else "",
                                  prompt_ids=None if isinstance(prompt, str) else prompt,
                                  infill=infill,
                                  max_tokens=16 if req.max_tokens is None else req.max_tokens,
                                  logprobs=req.logprobs is not None,
                                  top_logprobs=req.logprobs or 0, constraint=constraint,
                                  echo_prompt=bool(req.echo),
                                  prompt_logprobs=bool(req.echo) and req.logprobs is not None,
                                  **common)
    constraint = _constraint(raw)
    messages = []
    for m in req.messages:
        msg = msgspec.to_builtins(m)
        if msg.get("role") == "developer":
            msg["role"] = "system"
        if msg.get("reasoning") and not msg.get("reasoning_content"):
            msg["reasoning_content"] = msg["reasoning"]
        if isinstance(msg.get("content"), list):  # a refusal is the assistant's text
            msg["content"] = [{"type": "text", "text": p["refusal"]} if p["type"] == "refusal"
                              else {k: v for k, v in p.items() if v is not None}
                              for p in msg["content"]]
        messages.append({k: v for k, v in msg.items() if v is not None})
    thinking, template_kwargs = _thinking(raw)
    prefilled = bool(req.continue_final_message)
    if prefilled and continuation(messages) != (messages, True):
        raise ApiError(400, "'continue_final_message' continues the last message: it must be "
                            "an assistant message with text (and no tool calls).",
                       param="continue_final_message")
    if prefilled and (constraint.response_format != "text"
                      or constraint.tool_choice == "required"):
        raise ApiError(400, "'continue_final_message' continues the last message as free "
                            "text: it cannot be under a response format or a required tool "
                            "call.", param="continue_final_message")
    return ChatGenerate(
        messages=messages, constraint=constraint, tools=raw.get("tools") or None,
        thinking=thinking, template_kwargs=template_kwargs, continue_final=prefilled,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0, **common)


def _prompts(prompt: str | list[Any], most: int = MAX_PROMPTS) -> list[str | list[int]]:
    """A completion's prompts: a string, token ids, or a list of strings or of token-id
    lists (a batch, OpenAI's), at most `most`.

    Raises:
        ApiError: 400, more prompts than `most`, or a list that is none of these.
    """
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(map(is_token_id, prompt)):
        return [_token_ids(prompt, "prompt")]
    if not prompt or not (all(isinstance(p, str) for p in prompt)
                          or all(isinstance(p, list) and p for p in prompt)):
        raise ApiError(400, "'prompt' must be a string, an array of token ids, or an array of "
                            "strings or of token-id arrays (a batch).", param="prompt")
    if len(prompt) > most:
        detail = ("this route completes one prompt a request" if most == 1 else
                  f"at most {most} are completed in one request")
        raise ApiError(400, f"'prompt' holds {len(prompt)} prompts; {detail} (send the rest "
                            "in other requests; 'n' asks for several completions of one).",
                       param="prompt")
    return [p if isinstance(p, str) else _token_ids(p, f"prompt[{i}]")
            for i, p in enumerate(prompt)]


def _token_ids(ids: list[Any], param: str) -> list[int]:
    if not all(is_token_id(t) and t >= 0 for t in ids):
        raise ApiError(400, f"'{param}' as token ids must hold non-negative integers only.",
                       param=param)
    return list(ids)


# vLLM's and llama-server's own ways to ask for a JSON document: `response_format` here
_AS_SCHEMA = ("guided_json", "json_schema", "structured_outputs.json")
# theirs for other grammars (a regex, a choice, EBNF / GBNF), which the constraints here
# do not take: refused by name rather than ignored
_UNTAKEN = ("guided_regex", "guided_choice", "guided_grammar", "grammar",
            "structured_outputs.regex", "structured_outputs.choice",
            "structured_outputs.grammar", "structured_outputs.structural_tag")


def _extension_format(raw: dict) -> dict:
    """`raw` with vLLM's `guided_json` / `structured_outputs` and llama-server's
    `json_schema` as the `response_format` they ask for.

    Raises:
        ApiError: 400 for a grammar these constraints do not take (a regex, a choice, EBNF),
            or a second way to constrain the output beside `response_format`.
    """
    outputs = raw.get("structured_outputs")
    fields = {**{k: v for k, v in raw.items() if v is not None},
              **({f"structured_outputs.{k}": v for k, v in outputs.items() if v is not None}
                 if isinstance(outputs, dict) else {})}
    for name in _UNTAKEN:
        if name in fields:
            raise ApiError(400, f"'{name}' is not supported here: the output can be "
                                "constrained to a JSON schema ('response_format').",
                           param=name)
    asked = [n for n in (*_AS_SCHEMA, "structured_outputs.json_object") if n in fields]
    if not asked:
        return raw
    if len(asked) > 1 or raw.get("response_format") is not None:
        first = asked[0]
        other = asked[1] if len(asked) > 1 else "response_format"
        raise ApiError(400, f"'{first}' and '{other}' both constrain the output; send one.",
                       param=first)
    name, value = asked[0], fields[asked[0]]
    if name == "structured_outputs.json_object":
        return {**raw, "response_format": {"type": "json_object"} if value else None}
    if isinstance(value, str):  # vLLM takes a schema as JSON text too
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise ApiError(400, f"'{name}' must be a JSON schema (an object).", param=name)
    return {**raw, "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "schema", "schema": value}}}


def _constraint(raw: dict) -> ConstraintRequest:
    try:
        return constraint_request_from_openai(raw)
    except ConstraintError as exc:
        raise ApiError(400, exc.message, param=exc.param) from None


def _thinking(raw: dict) -> tuple[bool | None, dict]:
    """The thinking switch and the template's other variables: `chat_template_kwargs`
    (its `enable_thinking` first), then `think` (Ollama's, also accepted here) and
    `reasoning_effort` ("none": off; "low", "medium", "high": on, as Ollama reads an effort
    as `think: true`; any value also goes to the template, as gpt-oss's reads it). Types were
    checked with the constraint options."""
    kwargs = dict(raw.get("chat_template_kwargs") or {})
    thinking = kwargs.pop("enable_thinking", None)
    effort = raw.get("reasoning_effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    think = raw.get("think")
    if thinking is None and (think is False or effort == "none"):
        thinking = False
    if thinking is None and (think is True or effort in ("low", "medium", "high")):
        thinking = True
    return thinking, kwargs


# Ollama's Modelfile parameters (a library variant's defaults, /api/create) -> OpenAI's fields
VARIANT_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "min_p": "min_p", "seed": "seed", "stop": "stop",
                  "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                  "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens",
                  "repeat_last_n": "repeat_last_n"}


def with_defaults(raw: dict, system: str | None, options: dict[str, Any]) -> dict:
    """An OpenAI request (raw JSON object) with a variant's defaults where it sets nothing:
    its system prompt first when the messages have no system or developer message, and
    its parameters (Ollama's names, `VARIANT_FIELDS`)."""
    out = dict(raw)
    for key, value in options.items():
        field = VARIANT_FIELDS.get(key)
        if field is None or out.get(field) is not None:
            continue
        if field == "max_tokens" and (out.get("max_completion_tokens") is not None
                                      or value is None or value < 0):
            continue
        out[field] = [value] if field == "stop" and isinstance(value, str) else value
    messages = out.get("messages")
    if system and isinstance(messages, list) and not any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in messages):
        out["messages"] = [{"role": "system", "content": system}, *messages]
    return out


# a body that may use legacy function calling (then read whole to tell: deployments.openai.legacy)
_LEGACY = re.compile(rb'"functions"|"function_call"|"role"\s*:\s*"function"')


def chat_call(body: bytes, ingress: Ingress) -> Call:
    """POST /v1/chat/completions's Call (legacy function calling as tools, answered in its
    own shape)."""
    if _LEGACY.search(body):
        raw = decode_raw(body)
        if is_legacy(raw):
            reply = LegacyChatReply if asks_legacy(raw) else ChatReply
            raw = as_tools(raw)
            return _call(convert_request(raw, ChatRequest), raw, ingress, reply, "chatcmpl-")
    req, raw = decode_request(body, ChatRequest)
    _check_tool_results(req)
    return _call(req, raw, ingress, ChatReply, "chatcmpl-")


def completion_call(body: bytes, ingress: Ingress) -> Call:
    """POST /v1/completions's Call: one prompt's, or a batch's (several prompts, each its
    own worker request, their choices in one answer: prompt k's choice i at k * n + i)."""
    req, raw = decode_request(body, CompletionRequest)
    prompts = _prompts(req.prompt)
    if len(prompts) == 1:
        return _call(req, raw, ingress, CompletionReply, "cmpl-", prompt=prompts[0])
    if req.stream:
        raise ApiError(400, "A batch of prompts is answered whole: send it with 'stream': "
                            "false, or stream each prompt in a request of its own.",
                       param="stream")
    req, raw = _with_variant(req, raw, ingress)
    parts = []
    for k, p in enumerate(prompts):  # a worker's refusal of one names it: prompt[k]
        greq = generate_request(req, raw, prompt=p)
        parts.append(Call(model=req.model, request=greq, params={"prompt": f"prompt[{k}]"},
                          reply=CompletionReply(_meta("cmpl-", greq, req.model))))
    meta = {**parts[0].reply.meta, "id": f"cmpl-{uuid.uuid4().hex}"}
    return Call(model=req.model, parts=parts,
                reply=CompletionBatchReply(meta, [p.reply for p in parts], req.n or 1))


def _call(req: OpenAIRequest, raw: dict, ingress: Ingress,
          reply: type[ChatReply | CompletionReply], prefix: str,
          prompt: str | list[int] | None = None) -> Call:
    req, raw = _with_variant(req, raw, ingress)
    greq = generate_request(req, raw, prompt=prompt)
    answer = reply(_meta(prefix, greq, req.model), *_usage_options(req))
    return Call(model=req.model, request=greq, stream=bool(req.stream), reply=answer)


def _with_variant(req: OpenAIRequest, raw: dict,
                  ingress: Ingress) -> tuple[OpenAIRequest, dict]:
    """The request with a library variant's defaults (Ollama's /api/create) where its model
    is one; 404 for an unknown model."""
    ingress.check_model(req.model)
    variant = ingress.variant(req.model)
    if variant is None:
        return req, raw
    raw = with_defaults(raw, *variant)
    return convert_request(raw, type(req)), raw


def _meta(prefix: str, greq: GenerateRequest, model: str) -> dict:
    return {"id": prefix + greq.request_id, "created": int(time.time()), "model": model}


def _usage_options(req: ChatRequest | CompletionRequest) -> tuple[bool, bool]:
    """A stream's usage: the last chunk's (`include_usage`), each chunk's
    (`continuous_usage_stats`, with the last chunk's unless that is turned off, as
    vLLM's)."""
    options = req.stream_options if req.stream else None
    if options is None:
        return False, False
    last = options.include_usage
    if last is None:
        last = bool(options.continuous_usage_stats)
    return last, last and bool(options.continuous_usage_stats)
