"""Tokenize and detokenize answers: the worker's `Tokens` or `Text` (actors.tokenize) in
llama-server's shape (`{"tokens": [ids]}`, or `[{"id", "piece"}]` with pieces: a piece is
its text where its bytes are whole UTF-8, else the list of its bytes) or vLLM's (`count`,
`max_model_len`, `tokens`, `token_strs`: each token's spelling in the vocabulary, `Ġworld`,
as transformers' `convert_ids_to_tokens` gives it; null unless asked). /detokenize answers
both APIs' names for the text: `content` (llama-server's) and `prompt` (vLLM's);
/apply-template its rendered conversation as `prompt`. Never streamed."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from actors.events import Failed
from actors.tokenize import Info, Text, Tokens
from deployments.errors import ApiError
from deployments.exchange import WholeReply

_encoder = msgspec.json.Encoder()


def piece(data: bytes) -> str | list[int]:
    """llama-server's piece: the text, or the bytes where they are not whole UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


class _Fold(WholeReply):
    """What every tokenize reply collects of the events: the one answer."""

    def __init__(self) -> None:
        self.result: Any = None

    def fold(self, batch: list) -> None:
        for ev in batch:
            if isinstance(ev, (Tokens, Text, Info)):
                self.result = ev
            elif isinstance(ev, Failed):
                raise ApiError(503, ev.message, type="server_error")

    def got(self, kind: type) -> Any:
        if not isinstance(self.result, kind):
            raise ApiError(503, "The model worker ended without an answer.", type="server_error")
        return self.result

    def json(self, body: dict[str, Any]) -> Response:
        return Response(_encoder.encode(body), media_type=self.media_type)



class LlamaTokenizeReply(_Fold):
    """llama-server's /tokenize answer (`pieces`: ids with their pieces)."""

    def __init__(self, *, pieces: bool = False) -> None:
        super().__init__()
        self.pieces = pieces

    def answer(self) -> Response:
        t: Tokens = self.got(Tokens)
        if not self.pieces:
            return self.json({"tokens": t.ids})
        return self.json({"tokens": [{"id": i, "piece": piece(p)}
                                     for i, p in zip(t.ids, t.pieces or [], strict=True)]})


class VllmTokenizeReply(_Fold):
    """vLLM's /tokenize answer (`token_strs`: each token's vocabulary spelling too)."""

    def __init__(self, *, token_strs: bool = False) -> None:
        super().__init__()
        self.token_strs = token_strs

    def answer(self) -> Response:
        t: Tokens = self.got(Tokens)
        strs = t.spellings if self.token_strs else None
        return self.json({"count": len(t.ids), "max_model_len": t.context_length,
                          "tokens": t.ids, "token_strs": strs})


class DetokenizeReply(_Fold):
    """/detokenize's answer, under llama-server's name and vLLM's."""

    def answer(self) -> Response:
        text = self.got(Text).text
        return self.json({"content": text, "prompt": text})


class TemplateReply(_Fold):
    """llama-server's /apply-template answer: `{"prompt": the rendered conversation}`."""

    def answer(self) -> Response:
        return self.json({"prompt": self.got(Text).text})


class TokenizerInfoReply(_Fold):
    """vLLM's /tokenizer_info answer: the tokenizer's configuration as transformers names
    it (the special tokens, `model_max_length`, `chat_template`), which
    lm-evaluation-harness's remote tokenizer reads."""

    def answer(self) -> Response:
        i: Info = self.got(Info)
        return self.json({"tokenizer_class": "PreTrainedTokenizerFast",
                          "bos_token": i.bos_token, "eos_token": i.eos_token,
                          "pad_token": i.pad_token, "unk_token": i.unk_token,
                          "model_max_length": i.context_length, "vocab_size": i.vocab_size,
                          "chat_template": i.chat_template or None})
