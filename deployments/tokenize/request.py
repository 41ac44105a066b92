"""Tokenize and detokenize requests in llama-server's and vLLM's shapes, on the same paths:
each route's Call, the shape read from the body's fields.

POST /tokenize takes one of:
- `content` (llama-server's): a string, or strings and token ids mixed in one list (the ids
  as they are, as llama-server's `tokenize_mixed` takes them); `add_special` (default
  false: the text's tokens only; true: BOS before an opening string, where the model adds
  one), `parse_special` (default true; false: special-token text, "<|im_end|>", reads as
  text), `with_pieces` (default false);
- `prompt` (vLLM's): `add_special_tokens` (default true: BOS where the model's tokenizer
  adds one), `return_token_strs` (default false);
- `messages` (vLLM's): the conversation rendered as /v1/chat/completions renders it
  (`tools`, `chat_template_kwargs`, `continue_final_message`; `add_generation_prompt`,
  default true), its ids the ones generation prefills (`add_special_tokens` changes
  nothing: the model's BOS rule is already applied), `return_token_strs`.
POST /detokenize takes `tokens` (ids of the model's vocabulary). GET /tokenizer_info
(vLLM's) answers the special tokens, the context length and the chat template. POST
/apply-template (llama-server's) takes `messages` as `messages` above (and
`add_generation_prompt`, `tools`, `chat_template_kwargs`; a last assistant message with text
is continued, as llama-server prefills it) and answers the rendered prompt, nothing
generated.
`model` (for /tokenizer_info, a query parameter) is optional where the server serves one
model (no models_dir), required otherwise.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from actors.tokenize import Detokenize, Tokenize, TokenizerInfo
from deployments.body import decode_raw, param_from
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.openai.request import convert_request, generate_request, with_defaults
from deployments.openai.schemas import ChatRequest
from deployments.prefill import continuation
from deployments.tokenize.reply import (
    DetokenizeReply,
    LlamaTokenizeReply,
    TemplateReply,
    TokenizerInfoReply,
    VllmTokenizeReply,
)

# the field that names a /tokenize body's shape, in the order they are looked for
SHAPES = ("content", "prompt", "messages")


class ContentIn(msgspec.Struct, kw_only=True):
    """llama-server's /tokenize body."""

    content: str | list[str | int]
    model: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class PromptIn(msgspec.Struct, kw_only=True):
    """vLLM's /tokenize body for a prompt."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class MessagesIn(msgspec.Struct, kw_only=True):
    """vLLM's /tokenize body for a conversation (the messages and tools are checked as
    /v1/chat/completions checks them)."""

    messages: Any
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    tools: Any = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeIn(msgspec.Struct, kw_only=True):
    """/detokenize's body (llama-server's and vLLM's: the same fields)."""

    tokens: list[int]
    model: str | None = None


def _object(body: bytes) -> dict[str, Any]:
    """The body's JSON object; anything else a 400 in JSON's words, as every route's."""
    raw = decode_raw(body)
    return raw if isinstance(raw, dict) else _convert(raw, dict[str, Any])


def _convert(raw: dict[str, Any], kind: type) -> Any:
    """`raw` as a `kind`; a 400 naming the offending field otherwise."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"Invalid request: {exc}", param=param_from(exc)) from None


def _request_id() -> str:
    return f"tok-{uuid.uuid4().hex}"


def tokenize_call(body: bytes, ingress: Ingress) -> Call:
    """POST /tokenize's Call, in the shape of the field the body holds (`SHAPES`).

    Raises:
        ApiError: 400 for none or several of those fields, a field of the wrong type, an
            option this server does not do; 404 an unknown model.
    """
    raw = _object(body)
    given = [k for k in SHAPES if raw.get(k) is not None]
    if len(given) > 1:
        raise ApiError(400, f"The body holds {' and '.join(repr(k) for k in given)}; send one: "
                            "'content' (llama-server's /tokenize), 'prompt' or 'messages' "
                            "(vLLM's).", param=given[1])
    if not given:
        raise ApiError(400, "Nothing to tokenize: send 'content' (llama-server's /tokenize), "
                            "'prompt' or 'messages' (vLLM's).", param="content")
    if given[0] == "content":
        return _content_call(_convert(raw, ContentIn), ingress)
    if given[0] == "prompt":
        req = _convert(raw, PromptIn)
        model = ingress.served(req.model)
        job = Tokenize(request_id=_request_id(), text=req.prompt,
                       add_special=req.add_special_tokens,
                       spellings=bool(req.return_token_strs))
        return Call(model=model, request=job,
                    reply=VllmTokenizeReply(token_strs=bool(req.return_token_strs)))
    return _messages_call(raw, _convert(raw, MessagesIn), ingress)


def _content_call(req: ContentIn, ingress: Ingress) -> Call:
    model = ingress.served(req.model)
    text, parts = (req.content, None) if isinstance(req.content, str) else ("", req.content)
    if parts is not None and any(isinstance(p, int) and p < 0 for p in parts):
        raise ApiError(400, "'content' holds a negative token id.", param="content")
    job = Tokenize(request_id=_request_id(), text=text, parts=parts,
                   add_special=req.add_special, parse_special=req.parse_special,
                   pieces=req.with_pieces)
    return Call(model=model, request=job, reply=LlamaTokenizeReply(pieces=req.with_pieces))


def _messages_call(raw: dict[str, Any], req: MessagesIn, ingress: Ingress, *,
                   rendered: bool = False) -> Call:
    """A conversation's Call: the chat typed as /v1/chat/completions types it (a library
    variant's system prompt and template included), so its count is that route's
    `prompt_tokens`; `rendered`: its prompt text instead (/apply-template)."""
    if req.continue_final_message and raw.get("add_generation_prompt") is True:
        raise ApiError(400, "'continue_final_message' and 'add_generation_prompt' cannot both "
                            "be true: a continued message has no generation prompt after it.",
                       param="add_generation_prompt")
    if req.chat_template is not None:
        raise ApiError(400, "'chat_template' is not supported: the model's own template "
                            "renders the conversation, as on /v1/chat/completions.",
                       param="chat_template")
    model = ingress.served(req.model)
    chat_raw = {k: v for k, v in (("model", model), ("messages", req.messages),
                                  ("tools", req.tools),
                                  ("chat_template_kwargs", req.chat_template_kwargs),
                                  ("continue_final_message", req.continue_final_message))
                if v is not None}
    variant = ingress.variant(model)
    if variant is not None:  # a library variant's system prompt (Ollama's /api/create)
        chat_raw = with_defaults(chat_raw, *variant)
    chat = generate_request(convert_request(chat_raw, ChatRequest), chat_raw)
    if model not in ingress.streams:  # a library variant's template
        chat = ingress.with_variant_template(model, chat)
    if rendered:
        job = Tokenize(request_id=_request_id(), chat=chat, rendered=True,
                       add_generation_prompt=req.add_generation_prompt)
        return Call(model=model, request=job, reply=TemplateReply())
    token_strs = bool(req.return_token_strs)
    job = Tokenize(request_id=_request_id(), chat=chat,
                   add_generation_prompt=req.add_generation_prompt, spellings=token_strs)
    return Call(model=model, request=job, reply=VllmTokenizeReply(token_strs=token_strs))


def apply_template_call(body: bytes, ingress: Ingress) -> Call:
    """POST /apply-template's Call (llama-server's): the conversation rendered with the
    model's chat template as /v1/chat/completions renders it; a last assistant message with
    text continued (llama-server prefills it: the prompt ends with that text), one without
    text dropped.

    Raises:
        ApiError: 400 for no `messages` or a conversation /v1/chat/completions refuses; 404
            an unknown model.
    """
    raw = _object(body)
    if raw.get("messages") is None:
        raise ApiError(400, "'messages' is required: the conversation to render.",
                       param="messages")
    messages = raw["messages"]
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        messages, prefilled = continuation(messages)
        raw = {**raw, "messages": messages}
        if prefilled and raw.get("continue_final_message") is None:  # no opening after it
            raw = {**{k: v for k, v in raw.items() if k != "add_generation_prompt"},
                   "continue_final_message": True}
    return _messages_call(raw, _convert(raw, MessagesIn), ingress, rendered=True)


def detokenize_call(body: bytes, ingress: Ingress) -> Call:
    """POST /detokenize's Call (ids outside the vocabulary: the worker's 400 names one)."""
    req = _convert(_object(body), DetokenizeIn)
    model = ingress.served(req.model)
    return Call(model=model, request=Detokenize(request_id=_request_id(), tokens=req.tokens),
                reply=DetokenizeReply())


def tokenizer_info_call(model: str | None, ingress: Ingress) -> Call:
    """GET /tokenizer_info's Call (vLLM's; `model` from the query, optional where the server
    serves one model)."""
    return Call(model=ingress.served(model),
                request=TokenizerInfo(request_id=_request_id()), reply=TokenizerInfoReply())
