"""llama-server's own completion bodies (not OpenAI's), typed once as the worker's
CompletionGenerate, through OpenAI's completion checks (a 400 names the field by this body's
name):

- /completion: `prompt` (a string, or token ids), what SillyTavern's and scripts' llama.cpp
  backends send;
- /infill: `input_prefix` and `input_suffix` (the text before and after the gap, both
  required), `input_extra` (other files, `{"filename", "text"}`), `prompt` (text already
  written at the start of the gap), what llama.vim and llama.vscode send.

Both take `model` (optional where the server serves one model) and llama-server's sampling
fields: `n_predict` (also `max_tokens`, `max_completion_tokens`; -1 or none: no limit; 0:
the prompt read into the cache, nothing written, as llama.vim warms its extra files),
`temperature`, `top_k`, `top_p`, `min_p` (clamped as llama-server clamps them, not OpenAI's
ranges), `repeat_penalty` (above 0, at most 10), `presence_penalty`, `frequency_penalty`
(any), `seed` (-1: random), `stop` (a string or a list), `ignore_eos`, `n_indent` (a line
after the first indented less ends the output), `t_max_predict_ms` (after that long
writing, the output ends at its next newline), `n_probs` (each token's logprob and its most
likely alternatives: llama-server's `completion_probabilities`), `json_schema` (the output
a JSON document of that schema), `stream`, `response_fields`. Fields of its slots and
samplers (`id_slot`, `cache_prompt`, `samplers`, `t_max_prompt_ms` (off in llama-server
too), `post_sampling_probs` (the logprobs are before sampling), `mirostat`, `dry_*`, ...)
are not read (prompts are cached here whatever they say); a `grammar` (GBNF) is a 400: the
constraints here are JSON schemas.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from actors.events import CompletionGenerate, Infill
from deployments.body import decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.llama_server.reply import NativeReply
from deployments.openai.request import convert_request, generate_request
from deployments.openai.schemas import CompletionRequest

MAX_PROBS = 100  # the most alternatives `n_probs` may ask for each token
MAX_STOPS = 64  # stop strings one request may give (llama-server sets none; OpenAI's 8)
MAX_TEMPERATURE = 1e6  # past this a float32 division gives inf: as good as uniform anyway
# llama-server's names of the OpenAI completion fields its bodies are typed as
NAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty",
         "response_format.json_schema.schema": "json_schema"}
INFILL_NAMES = {**NAMES, "prompt": "input_prefix", "suffix": "input_suffix"}


class _Sampling(msgspec.Struct, kw_only=True):
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
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    n_indent: int = 0
    t_max_predict_ms: float | None = None
    n_probs: int = 0
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    stream: bool = False
    response_fields: list[str] | None = None


class CompletionIn(_Sampling, kw_only=True):
    prompt: str | list[int]


class ExtraIn(msgspec.Struct, kw_only=True):
    """One extra file (llama-server's `input_extra` chunk)."""

    text: str
    filename: str = "tmp"


class InfillIn(_Sampling, kw_only=True):
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraIn] = msgspec.field(default_factory=list)
    prompt: str = ""


def _limit(req: _Sampling) -> int | None:
    """The most tokens to write (None: no limit, llama-server's -1, and its -2, until the
    context is full: the same here; 0: the prompt only read into the cache)."""
    field, n = next(((f, v) for f, v in (("n_predict", req.n_predict),
                                          ("max_completion_tokens", req.max_completion_tokens),
                                          ("max_tokens", req.max_tokens)) if v is not None),
                    ("n_predict", None))
    if n is not None and n < -2:
        raise ApiError(400, f"'{field}' is {n}; it must be -1 (no limit), -2 (until the "
                            "context is full) or more.", param=field)
    return None if n is None or n < 0 else n


def _unit(value: float | None) -> float | None:
    """A probability as llama-server clamps it: within [0, 1]."""
    return None if value is None else min(1.0, max(0.0, value))


def _shows_prompt(fields: list[str] | None) -> bool:
    """Whether the answer shows `prompt` (the worker then sends it back: an editor's
    `response_fields` usually leave it out, and with it the decoding of a long prompt)."""
    return not fields or any(f.split("/")[0] == "prompt" for f in fields)


def _typed(req: _Sampling, model: str, prompt: str | list[int],
           names: dict[str, str]) -> CompletionGenerate:
    """The worker's completion of `prompt` with `req`'s sampling, checked as OpenAI's
    completions are (errors renamed by `names`)."""
    if req.grammar:
        raise ApiError(400, "'grammar' (GBNF) is not supported: constrain the output with "
                            "'json_schema'.", param="grammar")
    if not 0 <= req.n_probs <= MAX_PROBS:
        raise ApiError(400, f"'n_probs' is {req.n_probs}; it must be 0 to {MAX_PROBS}.",
                       param="n_probs")
    if req.n_indent < 0:
        raise ApiError(400, f"'n_indent' is {req.n_indent}; it must be 0 (no rule) or more.",
                       param="n_indent")
    stops = [s for s in ([req.stop] if isinstance(req.stop, str) else req.stop or []) if s]
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"'stop' holds {len(stops)} strings; at most {MAX_STOPS} are "
                            "allowed.", param="stop")
    # OpenAI's checks for the rest; the samplers' values and the stops as llama-server takes
    # them (a slider past OpenAI's ranges, a group chat's many stops, are not an error
    # there): temperature and top_k from 0 (top_k 0: off), top_p and min_p within [0, 1],
    # the penalties as they are
    raw: dict[str, Any] = {
        "model": model, "prompt": prompt, "repetition_penalty": req.repeat_penalty,
        "seed": None if req.seed is None or req.seed < 0 else req.seed,
        "ignore_eos": req.ignore_eos}
    if req.json_schema is not None:
        raw["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "json_schema",
                                                  "schema": req.json_schema}}
    raw = {k: v for k, v in raw.items() if v is not None}
    try:
        greq = generate_request(convert_request(raw, CompletionRequest), raw)
    except ApiError as err:  # named as this body names it
        raise err.renamed(names.get(err.param or "", err.param)) from None
    return msgspec.structs.replace(
        greq, max_tokens=_limit(req), min_indent=req.n_indent,
        time_limit_s=(req.t_max_predict_ms / 1e3 if req.t_max_predict_ms is not None
                      and req.t_max_predict_ms > 0 else None),
        temperature=(None if req.temperature is None
                     else min(MAX_TEMPERATURE, max(0.0, req.temperature))),
        top_k=None if req.top_k is None else max(0, req.top_k), stop=stops,
        top_p=_unit(req.top_p), min_p=_unit(req.min_p),
        logprobs=req.n_probs > 0, top_logprobs=req.n_probs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        echo_prompt=_shows_prompt(req.response_fields))


def completion_request(req: CompletionIn, model: str) -> CompletionGenerate:
    """/completion's worker request: `prompt` continued as it is.

    Raises:
        ApiError: 400 naming this body's field.
    """
    if isinstance(req.prompt, str) and not req.prompt:
        raise ApiError(400, "'prompt' is empty.", param="prompt")
    return _typed(req, model, req.prompt, NAMES)


def infill_request(req: InfillIn, model: str) -> CompletionGenerate:
    """/infill's worker request: a completion of `input_prefix` with llama-server's layout.

    Raises:
        ApiError: 400 naming this body's field.
    """
    greq = _typed(req, model, req.input_prefix, INFILL_NAMES)
    infill = Infill(suffix=req.input_suffix, middle=req.prompt,
                    extra=[(c.filename, c.text) for c in req.input_extra], repository=True)
    return msgspec.structs.replace(greq, infill=infill)


def completion_call(body: bytes, ingress: Ingress) -> Call:
    """/completion's Call.

    Raises:
        ApiError: 400 naming the field; 404 an unknown model.
    """
    return _call(decode_json(body, CompletionIn), ingress, completion_request, NAMES)


def infill_call(body: bytes, ingress: Ingress) -> Call:
    """/infill's Call.

    Raises:
        ApiError: 400 naming the field; 404 an unknown model.
    """
    return _call(decode_json(body, InfillIn), ingress, infill_request, INFILL_NAMES)


def _call(req: Any, ingress: Ingress,
          typed: Callable[[Any, str], CompletionGenerate], names: dict[str, str]) -> Call:
    """`req` on the model it names, typed by `typed`; `names`: this body's names of the
    fields a worker's refusal may name too."""
    model = ingress.served(req.model)
    greq = typed(req, model)
    reply = NativeReply(req.model or model, time.perf_counter(),
                        settings=_settings(req, greq), fields=req.response_fields,
                        stream=req.stream)
    return Call(model=model, request=greq, stream=req.stream, reply=reply, params=names)


def _settings(req: _Sampling, greq: CompletionGenerate) -> dict[str, Any]:
    """llama-server's `generation_settings`: the request's sampling as read (a field it
    does not set is the model's default, left out)."""
    settings = {"n_predict": -1 if greq.max_tokens is None else greq.max_tokens,
                "seed": -1 if greq.seed is None else greq.seed,
                "temperature": greq.temperature, "top_k": greq.top_k, "top_p": greq.top_p,
                "min_p": greq.min_p, "repeat_penalty": greq.repetition_penalty,
                "presence_penalty": greq.presence_penalty,
                "frequency_penalty": greq.frequency_penalty, "stop": greq.stop,
                "ignore_eos": greq.ignore_eos, "n_indent": greq.min_indent,
                "n_probs": greq.top_logprobs,
                "t_max_predict_ms": (-1 if greq.time_limit_s is None
                                     else greq.time_limit_s * 1e3),
                "stream": req.stream}
    return {k: v for k, v in settings.items() if v is not None}
