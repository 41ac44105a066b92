"""llama-server's /infill body: `input_prefix` and `input_suffix` (the text before and after
the gap, both required), `input_extra` (other files, `{"filename", "text"}`), `prompt`
(text already written at the start of the gap), `model` (optional where the server serves
one model), and the sampling fields of llama-server's /completion: `n_predict` (also
`max_tokens`, `max_completion_tokens`; negative or none: no limit), `temperature`,
`top_k`, `top_p`, `min_p`, `repeat_penalty`, `presence_penalty`, `frequency_penalty`,
`seed` (-1: random), `stop`, `ignore_eos`, `n_indent` (a line after the first indented
less ends the middle, as llama.vim and llama.vscode ask), `stream`, `response_fields`;
`n_predict` 0 reads the prompt into the cache and writes nothing (llama.vim's warm-up of
its extra files). Fields of its
slots and timing limits (`id_slot`, `cache_prompt`, `samplers`, `t_max_prompt_ms`,
`t_max_predict_ms`, ...) are not read: prompts are cached here whatever they say.

The fields are checked and typed as OpenAI's completions type them (the same worker
request), a 400 naming the field by this body's name.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from actors.events import CompletionGenerate, Infill
from deployments.body import decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.infill.reply import InfillReply
from deployments.ingress import Ingress
from deployments.openai.request import convert_request, generate_request
from deployments.openai.schemas import CompletionRequest

# this body's names of the OpenAI completion fields it is typed as
NAMES = {"prompt": "input_prefix", "suffix": "input_suffix", "max_tokens": "n_predict",
         "repetition_penalty": "repeat_penalty"}


class ExtraIn(msgspec.Struct, kw_only=True):
    """One extra file (llama-server's `input_extra` chunk)."""

    text: str
    filename: str = "tmp"


class InfillIn(msgspec.Struct, kw_only=True):
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraIn] = msgspec.field(default_factory=list)
    prompt: str = ""
    model: str | None = None
    n_predict: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    n_indent: int = 0
    stream: bool = False
    response_fields: list[str] | None = None


def _limit(req: InfillIn) -> int | None:
    """The most tokens to write (None: no limit, llama-server's -1; 0: the prompt only read
    into the cache, as llama.vim warms it with the files it will send)."""
    n = next((v for v in (req.n_predict, req.max_completion_tokens, req.max_tokens)
              if v is not None), None)
    if n is not None and n < -1:
        raise ApiError(400, f"'n_predict' is {n}; it must be -1 (no limit) or more.",
                       param="n_predict")
    return None if n is None or n < 0 else n


def infill_request(req: InfillIn, model: str) -> CompletionGenerate:
    """The worker's request: a completion of `input_prefix` with llama-server's layout.

    Raises:
        ApiError: 400 naming this body's field.
    """
    raw: dict[str, Any] = {
        "model": model, "prompt": req.input_prefix, "temperature": req.temperature,
        "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "repetition_penalty": req.repeat_penalty,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "seed": None if req.seed is None or req.seed < 0 else req.seed,
        "stop": req.stop, "ignore_eos": req.ignore_eos}
    raw = {k: v for k, v in raw.items() if v is not None}
    try:
        greq = generate_request(convert_request(raw, CompletionRequest), raw)
    except ApiError as err:  # named as this body names it
        param = NAMES.get(err.param or "", err.param)
        if param != err.param:
            err.message = err.message.replace(f"`$.{err.param}`", f"`$.{param}`")
            err.param = param
        raise
    infill = Infill(suffix=req.input_suffix, middle=req.prompt,
                    extra=[(c.filename, c.text) for c in req.input_extra], repository=True)
    return msgspec.structs.replace(greq, infill=infill, max_tokens=_limit(req),
                                   min_indent=max(0, req.n_indent),
                                   echo_prompt=True)  # the reply's `prompt`


def infill_call(body: bytes, ingress: Ingress) -> Call:
    """/infill's Call.

    Raises:
        ApiError: 400 naming the field; 404 an unknown model.
    """
    req = decode_json(body, InfillIn)
    model = ingress.served(req.model)
    greq = infill_request(req, model)
    reply = InfillReply(req.model or model, time.perf_counter(),
                        settings=_settings(req, greq), fields=req.response_fields,
                        stream=req.stream)
    return Call(model=model, request=greq, stream=req.stream, reply=reply,
                params={"suffix": "input_suffix", "prompt": "input_prefix"})


def _settings(req: InfillIn, greq: CompletionGenerate) -> dict[str, Any]:
    """llama-server's `generation_settings`: the request's sampling as read (a field it
    does not set is the model's default, left out)."""
    settings = {"n_predict": -1 if greq.max_tokens is None else greq.max_tokens,
                "seed": -1 if greq.seed is None else greq.seed,
                "temperature": greq.temperature, "top_k": greq.top_k, "top_p": greq.top_p,
                "min_p": greq.min_p, "repeat_penalty": greq.repetition_penalty,
                "presence_penalty": greq.presence_penalty,
                "frequency_penalty": greq.frequency_penalty, "stop": greq.stop,
                "ignore_eos": greq.ignore_eos, "stream": req.stream}
    return {k: v for k, v in settings.items() if v is not None}
