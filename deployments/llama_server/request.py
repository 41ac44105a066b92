"""llama-server's own completion bodies (not OpenAI's), typed once as the worker's
CompletionGenerate, through OpenAI's completion checks (a 400 names the field by this body's
name):

- /completion: `prompt` in llama-server's forms (`prompts`): a string, token ids, strings
  and ids mixed in one list (one prompt: BOS only before an opening string), an object
  with `prompt_string` (text only: `multimodal_data` is a 400), or a list of those (several
  prompts, none of them a bare id: answered as a JSON array, one object per prompt in
  order, each with its `index`; a list of one: that one's object). What SillyTavern's and
  scripts' llama.cpp backends send. Several prompts are not streamed (llama-server streams
  their pieces interleaved; here a 400 says to send one request a prompt);
- /infill: `input_prefix` and `input_suffix` (the text before and after the gap, both
  required), `input_extra` (other files, `{"filename", "text"}`), `prompt` (text already
  written at the start of the gap), what llama.vim and llama.vscode send.

Both take `model` (optional where the server serves one model) and llama-server's sampling
fields: `n_predict` (also `max_tokens`, `max_completion_tokens`; -1 or none: no limit; 0:
the prompt read into the cache, nothing written, as llama.vim warms its extra files),
`temperature`, `top_k`, `top_p`, `min_p` (clamped as llama-server clamps them, not OpenAI's
ranges), `repeat_penalty` (above 0, at most 10), `presence_penalty`, `frequency_penalty`
(any), `repeat_last_n` (the tokens the penalties read: 64 unless set, 0 none, -1 all),
`seed` (-1: random), `stop` (a string or a list), `logit_bias` (`[[id, bias]]` or
`{"id": bias}`; `false`: never that token; a token's text is a 400 asking for ids),
`ignore_eos`, `n_indent` (a line after
the first indented less ends the output), `t_max_predict_ms` (after that long
writing, the output ends at its next newline), `n_probs` (each token's logprob and its most
likely alternatives: llama-server's `completion_probabilities`), `json_schema` (the output
a JSON document of that schema), `return_tokens` (the ids of the tokens written, in
`tokens`), `stream`, `response_fields`. Fields of its slots and
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
from deployments.body import decode_json, is_token_id, several_prompts
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.llama_server.reply import NativeBatchReply, NativeReply
from deployments.openai.request import MAX_PROMPTS, convert_request, generate_request
from deployments.openai.schemas import CompletionRequest

MAX_PROBS = 100  # the most alternatives `n_probs` may ask for each token
MAX_STOPS = 64  # stop strings one request may give (llama-server sets none; OpenAI's 8)
REPEAT_LAST_N = 64  # the tokens llama-server's penalties read unless told
BANNED = -1e30  # a logit bias no logit comes back from (a finite number: JSON carries it)
MAX_TEMPERATURE = 1e6  # past this a float32 division gives inf: as good as uniform anyway
# llama-server's names of the OpenAI completion fields its bodies are typed as
NAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty",
         "response_format.json_schema.schema": "json_schema"}
INFILL_NAMES = {**NAMES, "prompt": "input_prefix", "suffix": "input_suffix"}
# one prompt: a string, token ids, or strings and token ids mixed (actors.mixed)
Prompt = str | list[int] | list[str | int]


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
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: list[Any] | dict[str, Any] | None = None
    ignore_eos: bool = False
    n_indent: int = 0
    t_max_predict_ms: float | None = None
    n_probs: int = 0
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    stream: bool = False
    return_tokens: bool = False
    response_fields: list[str] | None = None


class CompletionIn(_Sampling, kw_only=True):
    prompt: Any  # llama-server's forms (`prompts`)


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


def prompts(value: Any) -> list[Prompt]:
    """`prompt`'s prompts, as llama-server reads them (its `tokenize_input_prompts`): a list
    that holds no bare token id is several prompts, anything else one.

    Raises:
        ApiError: 400 naming the prompt that is none of the forms, or empty; more than
            MAX_PROMPTS prompts.
    """
    if not several_prompts(value):
        return [_prompt(value, "prompt")]
    if len(value) > MAX_PROMPTS:
        raise ApiError(400, f"'prompt' holds {len(value)} prompts; at most {MAX_PROMPTS} are "
                            "completed in one request.", param="prompt")
    return [_prompt(v, f"prompt[{k}]") for k, v in enumerate(value)]


def _prompt(value: Any, param: str) -> Prompt:
    """One prompt: a string, token ids, strings and ids mixed, or `{"prompt_string": one of
    those}` (its `multimodal_data`, media for a model that reads them, refused)."""
    if isinstance(value, dict) and "prompt_string" in value:
        if value.get("multimodal_data"):
            raise ApiError(400, f"'{param}.multimodal_data' is not supported: this server's "
                                "models read text only.", param=f"{param}.multimodal_data")
        value, param = value["prompt_string"], f"{param}.prompt_string"
    if value == "" or value == []:
        raise ApiError(400, f"'{param}' is empty.", param=param)
    if isinstance(value, str) or (isinstance(value, list) and all(
            is_token_id(v) or isinstance(v, str) for v in value)):
        return value
    raise ApiError(400, f"'{param}' must be a string, an array of token ids, an array of "
                        "strings and token ids (one prompt), or an object with "
                        "'prompt_string'; several prompts: an array of those.", param=param)


def _logit_bias(value: list[Any] | dict[str, Any] | None) -> dict[int, float] | None:
    """llama-server's `logit_bias`: `[[token id, bias], ...]` or `{"token id": bias}`, a
    bias of `false` never writing the token; a token's text (its tokens biased) is a 400
    here, which asks for the ids (the worker checks they are in the vocabulary)."""
    if not value:
        return None
    pairs = list(value.items()) if isinstance(value, dict) else value
    out: dict[int, float] = {}
    for i, pair in enumerate(pairs):
        where = "logit_bias" if isinstance(value, dict) else f"logit_bias[{i}]"
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise ApiError(400, f"'{where}' must be a [token id, bias] pair.", param=where)
        key, bias = pair
        if isinstance(key, str) and key.strip().isascii() and key.strip().isdecimal():
            key = int(key)
        if not isinstance(key, int) or isinstance(key, bool):
            raise ApiError(400, f"'{where}' names {key!r}; give token ids here (POST "
                                "/tokenize gives a text's).", param=where)
        if bias is False:
            out[key] = BANNED
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            out[key] = float(bias)
        else:
            raise ApiError(400, f"'{where}' has the bias {bias!r}: a number, or false (never "
                                "this token).", param=where)
    return out


def _typed(req: _Sampling, model: str, prompt: Prompt,
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
    mixed = not isinstance(prompt, str) and not all(map(is_token_id, prompt))
    raw: dict[str, Any] = {  # a mixed prompt goes to the worker as its parts (below)
        "model": model, "prompt": "" if mixed else prompt,
        "repetition_penalty": req.repeat_penalty,
        "repeat_last_n": REPEAT_LAST_N if req.repeat_last_n is None else max(-1, req.repeat_last_n),
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
        greq, prompt_parts=list(prompt) if mixed else None,
        max_tokens=_limit(req), min_indent=req.n_indent,
        time_limit_s=(req.t_max_predict_ms / 1e3 if req.t_max_predict_ms is not None
                      and req.t_max_predict_ms > 0 else None),
        temperature=(None if req.temperature is None
                     else min(MAX_TEMPERATURE, max(0.0, req.temperature))),
        top_k=None if req.top_k is None else max(0, req.top_k), stop=stops,
        top_p=_unit(req.top_p), min_p=_unit(req.min_p),
        logprobs=req.n_probs > 0, top_logprobs=req.n_probs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0, logit_bias=_logit_bias(req.logit_bias),
        echo_prompt=_shows_prompt(req.response_fields), return_ids=req.return_tokens)


def completion_request(req: CompletionIn, model: str, prompt: Prompt) -> CompletionGenerate:
    """/completion's worker request: `prompt` (one of the body's `prompts`) continued as it
    is, with the body's sampling.

    Raises:
        ApiError: 400 naming this body's field.
    """
    return _typed(req, model, prompt, NAMES)


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
    """/completion's Call: one prompt's, or several prompts' (a batch: each its own worker
    request, answered together as a JSON array).

    Raises:
        ApiError: 400 naming the field (several prompts streamed too); 404 an unknown model.
    """
    req = decode_json(body, CompletionIn)
    forms = prompts(req.prompt)
    if len(forms) == 1:
        return _call(req, ingress, lambda r, m: completion_request(r, m, forms[0]), NAMES)
    if req.stream:
        raise ApiError(400, f"'prompt' holds {len(forms)} prompts, which are answered "
                            "together: send them with 'stream': false, or stream each prompt "
                            "in a request of its own.", param="stream")
    model = ingress.served(req.model)
    parts = []
    for k, prompt in enumerate(forms):  # a worker's refusal of one names it: prompt[k]
        names = {**NAMES, "prompt": f"prompt[{k}]"}
        part = _call(req, ingress, lambda r, m, p=prompt: completion_request(r, m, p), names,
                     model=model, index=k)
        parts.append(part)
    return Call(model=model, parts=parts, reply=NativeBatchReply([p.reply for p in parts]))


def infill_call(body: bytes, ingress: Ingress) -> Call:
    """/infill's Call.

    Raises:
        ApiError: 400 naming the field; 404 an unknown model.
    """
    return _call(decode_json(body, InfillIn), ingress, infill_request, INFILL_NAMES)


def _call(req: Any, ingress: Ingress,
          typed: Callable[[Any, str], CompletionGenerate], names: dict[str, str], *,
          model: str | None = None, index: int = 0) -> Call:
    """`req` on the model it names (`model`: already resolved), typed by `typed`; `names`:
    this body's names of the fields a worker's refusal may name too; `index`: the prompt's
    in a batch."""
    model = model or ingress.served(req.model)
    greq = typed(req, model)
    reply = NativeReply(req.model or model, time.perf_counter(),
                        settings=_settings(req, greq), fields=req.response_fields,
                        stream=req.stream, index=index)
    return Call(model=model, request=greq, stream=req.stream, reply=reply, params=names)


def _settings(req: _Sampling, greq: CompletionGenerate) -> dict[str, Any]:
    """llama-server's `generation_settings`: the request's sampling as read (a field it
    does not set is the model's default, left out)."""
    settings = {"n_predict": -1 if greq.max_tokens is None else greq.max_tokens,
                "seed": -1 if greq.seed is None else greq.seed,
                "temperature": greq.temperature, "top_k": greq.top_k, "top_p": greq.top_p,
                "min_p": greq.min_p, "repeat_penalty": greq.repetition_penalty,
                "repeat_last_n": greq.repeat_last_n,
                "presence_penalty": greq.presence_penalty,
                "frequency_penalty": greq.frequency_penalty, "stop": greq.stop,
                "ignore_eos": greq.ignore_eos, "n_indent": greq.min_indent,
                "n_probs": greq.top_logprobs,
                "t_max_predict_ms": (-1 if greq.time_limit_s is None
                                     else greq.time_limit_s * 1e3),
                "stream": req.stream}
    return {k: v for k, v in settings.items() if v is not None}
