"""Tokenize and detokenize on a worker, with the model's own tokenizer and chat template;
nothing is scheduled (llama-server's and vLLM's /tokenize and /detokenize,
deployments/tokenize/).

A `Tokenize` or `Detokenize` goes through the worker's `generate` as the other requests do
(so the ingress's one request path serves it: retries, back-pressure, a library model loaded
for it); `answer` turns it into its events: Rejected alone, or Accepted and one `Tokens` or
`Text`.
"""

from __future__ import annotations

import logging

import msgspec

from actors.errors import RequestError
from actors.events import Accepted, ChatGenerate, Event, Rejected
from actors.mixed import check_ids, mixed_ids
from actors.session import render_prompt
from npu import Model

log = logging.getLogger(__name__)


class Tokenize(msgspec.Struct, kw_only=True, tag="tokenize"):
    """A text, or a conversation, to token ids.

    Attributes:
        text: tokenized as it is (special-token text, `<|im_end|>`, becomes that token).
        chat: a conversation instead, rendered as /v1/chat/completions renders it (the
            model's template, or a library variant's, with the request's tools and template
            variables); its ids are the ones generation would prefill (BOS included where
            the model's tokenizer adds one and the template does not write it). None: `text`.
        add_special: `text` with the special tokens the model puts around an input: BOS
            where its tokenizer adds one, as /v1/completions feeds a prompt (an encoder's:
            [CLS] ... [SEP], as /v1/embeddings does). default: False (the text's tokens only).
        add_generation_prompt: a chat ends with the opening of the assistant's turn, as for
            generation. False: the conversation alone. default: True.
        pieces: also each token's bytes (`Tokens.pieces`). default: False.
        spellings: also each token's spelling in the vocabulary (`Tokens.spellings`).
            default: False.
        parts: llama-server's mixed content instead of `text`: strings and token ids in one
            list (actors.mixed; `add_special`: BOS before an opening string). None: `text`.
        parse_special: special-token text reads as that token; False: as text (llama.cpp's
            `parse_special`; with `add_special`, BOS only). default: True.
        rendered: a chat's prompt text instead of its ids (llama-server's /apply-template),
            answered as `Text`. default: False.
    """

    request_id: str
    text: str = ""
    chat: ChatGenerate | None = None
    add_special: bool = False
    add_generation_prompt: bool = True
    pieces: bool = False
    spellings: bool = False
    parts: list[str | int] | None = None
    parse_special: bool = True
    rendered: bool = False


class Detokenize(msgspec.Struct, kw_only=True, tag="detokenize"):
    """Token ids to text; each id must be in the model's vocabulary (its logits' width)."""

    request_id: str
    tokens: list[int] = msgspec.field(default_factory=list)


class TokenizerInfo(msgspec.Struct, kw_only=True, tag="tokenizer_info"):
    """What a client needs to tokenize as the model does (vLLM's /tokenizer_info:
    lm-evaluation-harness reads the special tokens and the chat template from it)."""

    request_id: str


class Info(msgspec.Struct, tag="info", tag_field="event"):
    """A TokenizerInfo's answer: the special tokens' texts (None: the model has none),
    the chat template's source ("" for none), the context length and the vocabulary's size
    (the logits' width)."""

    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str
    context_length: int
    vocab_size: int


class Tokens(msgspec.Struct, tag="tokens", tag_field="event"):
    """A Tokenize's answer: the ids, the model's context length, and when asked each
    token's bytes (a special token's text where its bytes are none: BOS, PAD, UNK) or its
    spelling in the vocabulary (`Ġworld`)."""

    ids: list[int]
    context_length: int
    pieces: list[bytes] | None = None
    spellings: list[str] | None = None


class Text(msgspec.Struct, tag="text", tag_field="event"):
    """A Detokenize's answer (and a rendered chat's: `Tokenize.rendered`)."""

    text: str


def answer(request: Tokenize | Detokenize | TokenizerInfo, model: Model) -> list[Event]:
    """`request`'s events: [Rejected] (a bad id, a template that refuses the chat; a bug is a
    500), or [Accepted, Tokens | Text | Info]. Raises: never."""
    try:
        if isinstance(request, TokenizerInfo):
            out: Tokens | Text | Info = info(model)
            n = 0
        elif isinstance(request, Detokenize):
            out = Text(text=detokenize(request.tokens, model))
            n = len(request.tokens)
        elif request.rendered and request.chat is not None:
            out, n = Text(text=render_prompt(
                request.chat, model, add_generation_prompt=request.add_generation_prompt)), 0
        else:
            ids = token_ids(request, model)
            out = Tokens(ids=ids, context_length=model.context_length,
                         pieces=pieces(ids, model) if request.pieces else None,
                         spellings=(model.tokenizer.spellings(ids) if request.spellings
                                    else None))
            n = len(ids)
    except RequestError as exc:
        return [Rejected(status=exc.status, message=exc.message, param=exc.param,
                         code=exc.code, type=exc.type)]
    except Exception:  # a bug: answer cleanly, keep serving
        log.exception("tokenizing request %s failed", request.request_id)
        return [Rejected(status=500, message="Internal error while tokenizing.",
                         type="server_error")]
    return [Accepted(request_id=request.request_id, model=model.name, prompt_tokens=n), out]


def token_ids(request: Tokenize, model: Model) -> list[int]:
    """The ids of `request`'s text or chat (see `Tokenize`).

    Raises:
        RequestError: the chat cannot be rendered: the model does not chat (an encoder, a
            reranker: 400 naming `model`) or its template refuses the conversation (400
            naming `messages`).
    """
    if request.chat is not None:
        return model.prompt_ids(render_prompt(
            request.chat, model, add_generation_prompt=request.add_generation_prompt))
    if request.parts is not None or not request.parse_special:
        ids = mixed_ids(model, [request.text] if request.parts is None else request.parts,
                        add_special=request.add_special, parse_special=request.parse_special)
        check_ids(model, ids, "content")
        return ids
    if not request.add_special:
        return model.tokenizer.encode(request.text)
    return (model.prompt_ids(request.text) if model.generates
            else model.embedding_ids(request.text))


def info(model: Model) -> Info:
    tok = model.tokenizer
    return Info(bos_token=tok.bos_token, eos_token=tok.eos_token, pad_token=tok.pad_token,
                unk_token=tok.unk_token, chat_template=model.chat_template_source,
                context_length=model.context_length, vocab_size=model.config.vocab_size)


def detokenize(ids: list[int], model: Model) -> str:
    """The text of `ids`, special tokens written out (as llama-server's and vLLM's
    /detokenize write them).

    Raises:
        RequestError: an id outside the model's vocabulary: 400 naming it (`tokens[i]`).
    """
    vocab = model.config.vocab_size
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise RequestError(f"Token id {t} is outside this model's vocabulary: ids run from "
                               f"0 to {vocab - 1}.", param=f"tokens[{i}]")
    return model.tokenizer.decode(ids, skip_special_tokens=False)


def pieces(ids: list[int], model: Model) -> list[bytes]:
    """Each token's bytes (a byte-level token may hold part of a UTF-8 character); a
    special token that writes no bytes in generated text (BOS, PAD, UNK) its text."""
    table = model.token_table
    out = []
    for t in ids:
        data = table[t] if 0 <= t < len(table) else b""
        if not data:
            data = model.tokenizer.decode([t], skip_special_tokens=False).encode("utf-8")
        out.append(data)
    return out
