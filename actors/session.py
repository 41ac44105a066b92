"""Session: one request on a worker, from prompt to events.

It renders the template, tokenizes, builds the constraint and one `Choice` per `n`, and
turns each sampled token into events: detokenize -> stop strings -> ChatStream deltas.
Everything here runs on the worker's decode thread, except `build_session`, which runs in
a helper thread because it may compile a grammar.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from actors.errors import RequestError
from actors.events import (
    ChatGenerate,
    CompletionGenerate,
    Deltas,
    Event,
    Finished,
    GenerateRequest,
    Prompt,
    TokenLogprob,
)
from actors.infill import infill_ids
from actors.mixed import check_ids, mixed_ids
from actors.stops import StopMatcher
from chat import (
    ChatStream,
    ConstraintError,
    FormatKind,
    FormatSpec,
    format_prefill,
    make_constraint,
    spec_for_kind,
)
from chat.decode import mask_words
from npu import ChatTemplate, Model, ModelError, Sampler, SamplingParams, logprobs
from npu.load.template import PARTS_JOIN
from npu.sampler import row_logprobs

log = logging.getLogger(__name__)
_ids = itertools.count()
PROMPT_TAIL_TOKENS = 32
# template variables a request cannot set through its own ones (the thinking switch is its
# own field, passed as enable_thinking)
RESERVED_TEMPLATE_KEYS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                                    "eos_token", "_native", "enable_thinking", "continue_final"})


class Choice:
    """One of a request's `n` outputs: its sequence in the engine and its decode state."""

    def __init__(self, session: Session, index: int, sampler: Sampler, constraint: Any,
                 stream: ChatStream | None) -> None:
        self.session = session
        self.index = index
        self.seq_id = (session.id, index)
        self.sampler = sampler
        self.constraint = constraint
        self.stream = stream
        self.detok = session.model.tokenizer.detokenizer(at_start=session.at_start)
        request = session.request
        completion = isinstance(request, CompletionGenerate)
        self.stops = StopMatcher(session.stop_strings, request.min_indent if completion else 0)
        self.time_limit_s = request.time_limit_s if completion else None
        self.writing_since = time.monotonic()
        self.generated = 0
        self.tokens: list[int] = []  # sampled so far (the last one is next_token until fed)
        self.return_ids = completion and request.return_ids
        self.ids_sent = 0  # of `tokens`, those a Deltas named (`return_ids`)
        self.next_token: int | None = None
        self.done = False
        self.mask = np.zeros(mask_words(session.vocab_size), dtype=np.uint32)
        self.masked = False
        # the reasoning budget: tokens written while reasoning is open, and the tokens that
        # close it, written for the model once the budget is spent
        self.reasoning_tokens = 0
        # tokens that wrote reasoning (usage reports them): a token whose text is held
        # back, or is markup, counts with the field of the next text that goes out
        self.reasoned = 0
        self.unplaced = 0
        self.forced: list[int] = []
        self.budget_spent = False
        # speculative decoding: the drafter (made on the first draft), tokens drafted and
        # drafted tokens kept
        self.drafter: Any = None
        self.drafted = 0
        self.accepted = 0
        # per length of the n-gram matched: drafted tokens kept and tried (decided on: the
        # kept ones and the first rejected), recent ones weighing most
        self._rates: dict[int, list[float]] = {}
        self.idle = 0  # steps with drafts found but not worth verifying

    def note_drafts(self, matched: int, kept: int, tried: int) -> None:
        """A step kept `kept` of the drafted tokens the sampler decided on (`tried`: the
        kept ones and the first one rejected), drafted from a match of `matched` tokens."""
        rate = self._rates.setdefault(matched, [0.0, 0.0])
        rate[0] = 0.8 * rate[0] + kept
        rate[1] = 0.8 * rate[1] + tried

    def keep_rate(self, matched: int) -> float:
        """The chance this choice's next token drafted from a match of `matched` tokens is
        kept, from its recent such drafts (2 of 3 before any): longer matches are surer."""
        kept, tried = self._rates.get(matched, (0.0, 0.0))
        return (kept + 2.0) / (tried + 3.0)

    def prepare_mask(self) -> None:
        """Fill the mask for the next sample (runs while the forward pass runs)."""
        c = self.constraint
        self.masked = bool(c is not None and c.active and c.fill_mask(self.mask))

    def first(self, logits: np.ndarray) -> list[Event]:
        """The choice's first output after its prompt: `take`, or its end where it may
        write nothing (`max_tokens` 0: the prompt alone, scored)."""
        if self.session.request.max_tokens == 0:
            return self.finish("length")
        self.writing_since = time.monotonic()  # for a time limit (llama-server's)
        return self.take(logits)

    def take(self, logits: np.ndarray, token: int | None = None) -> list[Event]:
        """Sample from `logits` (unless the batch's sampling already drew `token`) and turn
        the token into events."""
        forced = bool(self.forced)
        if forced:  # the budget closes the reasoning: these tokens, whatever was sampled
            token = self.forced.pop(0)
        elif token is None:
            token = self.sampler.sample(logits, self.mask if self.masked else None)
        s = self.session
        if self.constraint is not None:
            if forced:
                self.constraint.accept_forced(token)
            else:
                self.constraint.accept(token)
        self.sampler.accept(token)
        self.generated += 1
        self.tokens.append(token)
        lp = None
        if s.request.logprobs:
            lp = [s.logprob(logits, token)]
        if token in s.eos_ids and not s.request.ignore_eos:
            return self.finish("stop")
        piece = self.detok.push(token)
        text = self.stops.push(piece, armed=self.generated >= s.request.min_tokens)
        events = self._emit(text, lp)
        self.unplaced += 1
        field = next((d.field for e in events if isinstance(e, Deltas) for d in e.deltas),
                     None)
        if field is not None:
            self.reasoned += self.unplaced if field == "reasoning_content" else 0
            self.unplaced = 0
        if s.reasoning_budget is not None and not forced:
            self._spend_reasoning(events, s.reasoning_budget)
        if self.stops.stopped or (self.constraint is not None and self.constraint.ended):
            return events + self.finish("stop")  # (a dedent: a limit, finish says)
        if s.request.max_tokens is not None and self.generated >= s.request.max_tokens:
            return events + self.finish("length")
        if self.time_limit_s is not None and "\n" in piece and \
                time.monotonic() - self.writing_since > self.time_limit_s:
            return events + self.finish("length")  # past the time, at a line's end
        if len(s.prompt_ids) + self.generated >= s.context_limit:  # (fed ones and this)
            return events + self.finish("length")
        self.next_token = token
        return events

    def _spend_reasoning(self, events: list[Event], budget: int) -> None:
        """Count a token that wrote reasoning; at the budget, the format's end of reasoning
        is queued to be written next (once: what follows is the answer)."""
        if self.budget_spent or not any(
                d.field == "reasoning_content" for e in events if isinstance(e, Deltas)
                for d in e.deltas):
            return
        self.reasoning_tokens += 1
        if self.reasoning_tokens >= budget:
            self.budget_spent = True
            self.forced = list(self.session.reasoning_end_ids)

    def _emit(self, text: str, lp: list | None, final: bool = False) -> list[Event]:
        if self.stream is not None:
            deltas = self.stream.update(text, final=final) if (text or final) else []
            if deltas or lp:
                return [Deltas(index=self.index, deltas=deltas, logprobs=lp,
                               tokens=self.generated)]
            return []
        ids = None
        if self.return_ids and len(self.tokens) > self.ids_sent:
            ids, self.ids_sent = self.tokens[self.ids_sent:], len(self.tokens)
        if text or lp or ids:
            return [Deltas(index=self.index, text=text, logprobs=lp, tokens=self.generated,
                           ids=ids)]
        return []

    def finish(self, reason: str) -> list[Event]:
        self.done = True
        tail = self.stops.push(self.detok.flush()) + self.stops.flush()
        if reason == "stop" and self.stops.dedented:
            reason = "length"  # a line's indentation ended it: a limit (llama-server's)
        # An output cut by max_tokens or the context is a partial output: a call it was
        # writing stays a call (arguments as far as they got), never markup in content;
        # so is one a stop string cut inside a call (a "}" or "\n\n" in its JSON)
        events = self._emit(tail, None)
        cut_short = reason == "length" or (self.stops.matched is not None and
                                           self.stream is not None and self.stream.in_call)
        if not cut_short:
            events += self._emit("", None, final=True)
        if (reason == "stop" and not cut_short and self.stream is not None
                and self.stream.message.tool_calls):
            reason = "tool_calls"
        cut = self.stream.cut_block if cut_short and self.stream else ""
        return events + [Finished(index=self.index, finish_reason=reason,
                                  completion_tokens=self.generated,
                                  message=self.stream.message if self.stream else None,
                                  stop=self.stops.matched, cut_block=cut,
                                  cut=cut_short and self.stream is not None
                                  and self.stream.in_call)]


class Session:
    """A request on a worker."""

    def __init__(self, request: GenerateRequest, model: Model, prompt_ids: list[int], *,
                 spec: FormatSpec, prefill: str, constraints: list[Any],
                 parse_tool_calls: bool, tools: list[dict] | None, stop_strings: list[str],
                 eos_ids: set[int], at_start: bool, token_table: list[bytes]) -> None:
        self.id = next(_ids)
        self.request = request
        self.model = model
        self.prompt_ids = prompt_ids
        self.vocab_size = model.config.vocab_size
        self.stop_strings = stop_strings
        self.eos_ids = eos_ids
        self.at_start = at_start
        self.token_table = token_table
        self.cancelled = False
        self.prefilled = 0  # prompt tokens already through the engine
        self.prompt_scores: list[TokenLogprob] = []  # (`scores_prompt`) so far
        self.cached: int | None = None  # prompt tokens the KV cache held (None: not started)
        self.context_limit = context_limit(request, model)
        # a reasoning budget needs markers that end reasoning (none: no budget to keep)
        budget = request.reasoning_budget if isinstance(request, ChatGenerate) else None
        self.reasoning_end_ids = model.tokenizer.encode(spec.reasoning_end) \
            if budget is not None and spec.reasoning_end else []
        self.reasoning_budget = budget if self.reasoning_end_ids else None
        base = sampling_base(model.defaults, request.sampling_fallback)
        params = dict(
            temperature=_pick(request.temperature, base.temperature),
            top_p=_pick(request.top_p, base.top_p), top_k=_pick(request.top_k, base.top_k),
            min_p=_pick(request.min_p, base.min_p),
            repetition_penalty=_pick(request.repetition_penalty, base.repetition_penalty),
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repeat_last_n=_pick(request.repeat_last_n, base.repeat_last_n),
            logit_bias=request.logit_bias, min_tokens=request.min_tokens,
            end_ids=tuple(sorted(eos_ids)))
        self.choices: list[Choice] = []
        for i in range(request.n):
            seed = None if request.seed is None else request.seed + i
            sampler = Sampler(SamplingParams(seed=seed, **params), self.vocab_size, prompt_ids)
            constraint = constraints[i] if constraints else None
            if constraint is not None:
                constraint.start(prefill)
            stream = (ChatStream(spec, prefill=prefill, parse_tool_calls=parse_tool_calls,
                                 tools=tools, continuing=request.continue_final)
                      if isinstance(request, ChatGenerate) else None)
            self.choices.append(Choice(self, i, sampler, constraint, stream))

    @property
    def done(self) -> bool:
        return self.cancelled or all(c.done for c in self.choices)

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt's own logprobs are asked: it needs every row's logits, so it
        is computed in a forward of its own, and takes a cached prefix only as far as the
        scheduler's ScoreMemo has its scores."""
        return isinstance(self.request, CompletionGenerate) and self.request.prompt_logprobs

    def logprob(self, logits: np.ndarray, token: int) -> TokenLogprob:
        """`token`'s logprob under `logits`, with the request's `top_logprobs`."""
        return self._token_logprob(token, *logprobs(logits, token, self.request.top_logprobs))

    def _token_logprob(self, token: int, value: float | None,
                       top: list[tuple[int, float]]) -> TokenLogprob:
        table = self.token_table
        return TokenLogprob(token=_piece(table[token]), logprob=value, bytes=list(table[token]),
                            top=[(_piece(table[t]), v, list(table[t])) for t, v in top],
                            id=token, top_ids=[t for t, _ in top])

    def score(self, logits: np.ndarray, start: int) -> None:
        """Note the logprobs of the prompt tokens that `logits` (the rows after prompt
        tokens `start`, `start` + 1, ...) predict; the first token's entry has none."""
        ids = self.prompt_ids
        if start == 0:
            self.prompt_scores.append(self._token_logprob(ids[0], None, []))
        tokens = ids[start + 1 : start + 1 + len(logits)]
        self.prompt_scores += [self._token_logprob(t, *scored) for t, scored in zip(
            tokens, row_logprobs(logits, tokens, self.request.top_logprobs))]

    def prompt_event(self) -> list[Event]:
        """The Prompt event the request asks for (none if it does not)."""
        request = self.request
        if not isinstance(request, CompletionGenerate) or not request.echo_prompt:
            return []
        as_given = (request.prompt_ids is None and request.prompt_parts is None
                    and request.infill is None)
        text = request.prompt if as_given \
            else self.model.tokenizer.decode(self.prompt_ids, skip_special_tokens=False)
        return [Prompt(text=text,
                       logprobs=list(self.prompt_scores) if request.prompt_logprobs else None)]


def _piece(token: bytes) -> str:
    return token.decode("utf-8", "replace")


def _pick(value, default):
    return default if value is None else value


def sampling_base(own: SamplingParams,
                  fallback: dict[str, float | int] | None) -> SamplingParams:
    """What a request's unset sampling fields take: the model's own defaults (its
    generation_config), or, where it has none (a GGUF file: SamplingParams' own values),
    the API's `fallback` (Ollama's temperature 0.8, top_k 40, top_p 0.9, repeat_penalty
    1.1 over the last 64 tokens)."""
    if not fallback or own != SamplingParams():
        return own
    return msgspec.structs.replace(own, **fallback)


def chosen_template(request: Any, model: Model) -> str | None:
    """The source of the template a chat request renders with when it is not the model's
    own: the request's (a library variant's), or the model's tool_use template for a
    conversation with tools (a model that has one: Hermes', Command-R's; as transformers
    picks it); None: the model's own template."""
    own = getattr(request, "template", None)
    if own is not None or not isinstance(request, ChatGenerate):
        return own
    if model.tool_template is not None and request.constraint.all_tools and request.tools:
        return model.tool_template.source
    return None


@functools.lru_cache(maxsize=16)
def request_template(source: str, bos_token: str, eos_token: str) -> ChatTemplate:
    """A request's own chat template (a library variant's), compiled once."""
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)


def render_prompt(request: ChatGenerate, model: Model, *,
                  add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat request, as generation renders it (`add_generation_prompt`
    False: the conversation alone, without the assistant turn's opening; a continued last
    message has none either way).

    Raises:
        RequestError: the template cannot render the conversation (400).
    """
    return _render(request, model, add_generation_prompt=add_generation_prompt)[0]


def _render(request: ChatGenerate, model: Model, *,
            add_generation_prompt: bool = True) -> tuple[str, bool, bool]:
    """The prompt text of a chat request, whether the model thinks, whether its template
    shows tools (the request's own template when it brings one)."""
    creq = request.constraint
    extra = {k: v for k, v in request.template_kwargs.items()
             if k not in RESERVED_TEMPLATE_KEYS}
    tools = creq.all_tools and request.tools
    if request.continue_final and (creq.response_format != "text"
                                   or creq.tool_choice == "required"):
        raise RequestError("A conversation that ends with the assistant's own text (a "
                           "prefill) is continued as free text: it cannot be under a "
                           "response format or a required tool call.", param="messages")
    opening = add_generation_prompt and not request.continue_final
    if not model.generates:  # an encoder or a reranker: nothing to render a chat for
        raise RequestError(f"The model '{model.name}' is {model.role}: it does not chat.",
                           param="model")
    try:
        source = chosen_template(request, model)
        if source is None:
            text = model.render(request.messages, tools, enable_thinking=request.thinking,
                                continue_final=request.continue_final,
                                add_generation_prompt=opening, **extra)
            return text, model.thinking_enabled(request.thinking), model.tools_enabled()
        own = model.template
        template = request_template(source, own.bos_token if own else "",
                                    own.eos_token if own else "")
        text = template.render(request.messages, tools, enable_thinking=request.thinking,
                               continue_final=request.continue_final,
                               add_generation_prompt=opening, **extra)
    except ModelError as exc:
        raise RequestError(str(exc), param="messages") from None
    return text, template.thinking_enabled(request.thinking), template.tools_enabled()


def _before_final(tail: str, messages: list[dict]) -> str:
    """A continued prompt's tail without the assistant's text at its end (as sent, or as
    the template trimmed it): what the parser must see first is the turn's opening, not
    text the client wrote (harmony's prefill is all that follows `<|start|>`)."""
    content = messages[-1].get("content")
    finals = [content] if isinstance(content, str) else [join.join(  # (as templates join)
        p.get("text", "") for p in content or [] if isinstance(p, dict))
        for join in (PARTS_JOIN, "")]
    pieces = [p for final in finals for p in {final, final.lstrip(), final.rstrip(),
                                              final.strip()} if p and tail.endswith(p)]
    return tail[: len(tail) - max(map(len, pieces))] if pieces else tail


def prompt_tokens(request: ChatGenerate, model: Model) -> int:
    """The tokens of `request`'s prompt (the model's template with the request's messages,
    tools and thinking switch), as `build_session` counts them, with nothing set up.

    Raises:
        RequestError: the template cannot render the conversation (400).
    """
    text, _, _ = _render(request, model)
    return _count(text, model)


def _count(text: str, model: Model) -> int:
    return len(model.prompt_ids(text)) or int(model.tokenizer.bos_id is not None)


def context_limit(request: GenerateRequest, model: Model) -> int:
    """The tokens prompt and output may take: the model's context, or less if asked."""
    return min(model.context_length, request.context_limit or model.context_length)


def _constraints(request: GenerateRequest, spec: FormatSpec,
                 grammar_engine: Callable[[], Any], tools_enabled: bool,
                 thinking: bool, n: int) -> list[Any]:
    """`n` matchers, one per choice (the compiled grammar is cached); none when nothing is
    constrained.

    Raises:
        RequestError: a schema or tool the grammar refuses (400).
    """
    chat = isinstance(request, ChatGenerate)
    # a completion's text is the document itself: the format without reasoning or calls
    shape = spec if chat else spec_for_kind(FormatKind.CONTENT_ONLY)
    try:
        constraints = [make_constraint(shape, request.constraint, grammar_engine,
                                       request_id=request.request_id,
                                       tools_enabled=tools_enabled,
                                       thinking_enabled=thinking and chat)
                       for _ in range(n)]
    except ConstraintError as exc:
        raise RequestError(exc.message, param=exc.param) from None
    return [] if constraints[0] is None else constraints


def counted(request: ChatGenerate, model: Model, spec: FormatSpec,
            grammar_engine: Callable[[], Any]) -> int:
    """`prompt_tokens`, with the request's tools and format checked as `build_session`
    checks them (a schema that /v1/messages would refuse is refused when counting too)."""
    text, thinking, tools_enabled = _render(request, model)
    if request.constraint.constrains:
        _constraints(request, spec, grammar_engine, tools_enabled, thinking, n=1)
    return _count(text, model)


def _without_oldest(messages: list[dict], k: int) -> list[dict]:
    """The conversation without its k oldest messages other than system messages and the
    last one, and then without what would open it on anything but a user's message (an
    answer or a tool result whose question or call went: templates that make roles
    alternate, Gemma's and Mistral's, refuse a conversation that opens so)."""
    dropped = 0
    out = []
    for i, m in enumerate(messages):
        opening = not any(o.get("role") != "system" for o in out)
        if i == len(messages) - 1 or m.get("role") == "system":
            out.append(m)
        elif dropped < k or (opening and m.get("role") != "user"):
            dropped += 1
        else:
            out.append(m)
    return out


def _fitted(request: ChatGenerate, model: Model, limit: int, rendered: tuple) -> tuple:
    """`rendered` (the request, its text, thinking, tools shown, prompt ids) for the
    conversation without as few of its oldest messages as make its prompt fit in `limit`
    (Ollama's history truncation); as it was when even the last message alone does not."""
    droppable = sum(1 for m in request.messages[:-1] if m.get("role") != "system")
    lo, hi, best = 1, droppable, rendered
    while lo <= hi:  # a shorter conversation renders a shorter prompt
        k = (lo + hi) // 2
        shorter = msgspec.structs.replace(request,
                                          messages=_without_oldest(request.messages, k))
        try:
            text, thinking, tools_enabled = _render(shorter, model)
        except RequestError:  # a cut the template refuses: cut more
            lo = k + 1
            continue
        ids = model.prompt_ids(text)
        if len(ids) < limit:
            best, hi = (shorter, text, thinking, tools_enabled, ids), k - 1
        else:
            lo = k + 1
    if best is not rendered:
        log.info("request %s: %d of %d messages dropped to fit a context of %d tokens",
                 request.request_id, len(request.messages) - len(best[0].messages),
                 len(request.messages), limit)
    return best


def build_session(request: GenerateRequest, model: Model, spec: FormatSpec,
                  grammar_engine: Callable[[], Any]) -> Session:
    """Validate a request against the model and set it up.

    Raises:
        RequestError: what this model cannot do (400) or a prompt over the context (400).
    """
    chat = isinstance(request, ChatGenerate)
    if chat and request.require_thinking and not spec.reasoning:
        # the worker's own field (Ollama's errors, the only API that sets it, name no field)
        raise RequestError(f'"{model.name}" does not support thinking',
                           param="require_thinking")
    if chat:
        text, thinking, tools_enabled = _render(request, model)
        if request.require_tools and request.tools and (
                not tools_enabled or spec.kind is FormatKind.CONTENT_ONLY):
            raise RequestError(f'"{model.name}" does not support tools', param="require_tools")
    else:
        text, thinking, tools_enabled = request.prompt, True, True
    if request.logit_bias:
        vocab = model.config.vocab_size
        bad = next((t for t in request.logit_bias if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"'logit_bias' names token id {bad}, outside this model's "
                               f"vocabulary of {vocab}.", param="logit_bias")
    limit = context_limit(request, model)
    if not chat and request.infill is not None:
        prompt_ids = infill_ids(model, request.prompt, request.infill, limit=limit)
    elif not chat and (request.prompt_ids is not None or request.prompt_parts is not None):
        prompt_ids = (list(request.prompt_ids) if request.prompt_ids is not None
                      else mixed_ids(model, request.prompt_parts))
        check_ids(model, prompt_ids, "prompt")
    else:
        prompt_ids = model.prompt_ids(text)
        # room for the reply the request asks for: Ollama's runner shifts its context and
        # writes all of it; here the oldest messages go for it (if that can make it)
        room = min(request.max_tokens or 0, limit - 1) if chat and request.drop_history else 0
        if chat and request.drop_history and len(prompt_ids) + room >= limit:
            rendered = (request, text, thinking, tools_enabled, prompt_ids)
            fitted = _fitted(request, model, limit - room, rendered) if room else rendered
            if fitted is rendered and len(prompt_ids) >= limit:  # the prompt alone, then
                fitted = _fitted(request, model, limit, rendered)
            request, text, thinking, tools_enabled, prompt_ids = fitted
    if not prompt_ids:
        prompt_ids = [model.tokenizer.bos_id] if model.tokenizer.bos_id is not None else []
    if not prompt_ids:
        raise RequestError("The prompt is empty.", param="prompt")
    if len(prompt_ids) >= limit:
        if limit < model.context_length:
            what, param = "The requested context length", "context_limit"
        else:
            what = "This model's maximum context length"
            param = "messages" if chat else "prompt"
        raise RequestError(f"{what} is {limit} tokens; the prompt has {len(prompt_ids)}.",
                           param=param, code="context_length_exceeded")
    tail = model.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    if chat and request.continue_final:  # the format's state before the client's text
        tail = _before_final(tail, request.messages)
    prefill = format_prefill(spec, tail) if chat else ""
    creq = request.constraint
    parse_calls = chat and creq.parse_tool_calls and tools_enabled
    constraints = _constraints(request, spec, grammar_engine, tools_enabled, thinking,
                               request.n)
    stops = list(request.stop)
    if chat:
        stops += [s for s in spec.extra_stops if model.tokenizer.id_of(s) is None]
    eos = set(model.eos_token_ids)
    if not chat and request.infill is not None:  # (infill_ids refused a model without)
        eos.update(model.fim.stops)  # what ends a middle
    for s in spec.extra_stops:
        tid = model.tokenizer.id_of(s)
        if tid is not None:
            eos.add(tid)
    table = model.token_table
    at_start = all(not table[i] for i in prompt_ids)
    return Session(request, model, prompt_ids, spec=spec, prefill=prefill,
                   constraints=constraints, parse_tool_calls=parse_calls,
                   tools=request.tools if chat else None,
                   stop_strings=stops, eos_ids=eos, at_start=at_start,
                   token_table=table)
