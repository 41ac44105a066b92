"""The worker's request, GenerateRequest (a chat, a completion or an embedding, typed once
at the ingress), and the events its stream yields, in order: one Accepted or Rejected, a
Prompt where asked, then Deltas and Finished per choice (an embedding: one Embeddings), then
Usage."""

from __future__ import annotations

import msgspec

from chat import ChatMsg, ConstraintRequest, Delta


class _Generate(msgspec.Struct, kw_only=True):
    """What every generating request carries: typed and validated at the ingress, in no
    API's field names."""

    request_id: str
    max_tokens: int | None = None
    n: int = 1
    stop: list[str] = msgspec.field(default_factory=list)
    # sampling (None: the model's generation_config default)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int | None = None  # the penalties' window (-1: the whole sequence, 0: off)
    seed: int | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # the API's own defaults (Ollama's) for a model whose generation_config sets none:
    # SamplingParams' fields -> values, below the request's and the model's own
    sampling_fallback: dict[str, float | int] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    min_tokens: int = 0  # the end tokens are not sampled before this many (vLLM's)
    # a context smaller than the model's: prompt and output within it
    context_limit: int | None = None


class ChatGenerate(_Generate, tag="chat"):
    """A conversation for the model's chat template.

    Attributes:
        messages: the conversation (OpenAI's message shape, as chat templates read it).
        constraint: what the output's shape must be (the tools it may call, whether it
            must, the response format, whether reasoning is allowed), validated.
        tools: the tool definitions as sent, for the template and for typing parsed
            arguments (None: no tools).
        thinking: the thinking switch the template gets as `enable_thinking` (None: the
            template's own default).
        template_kwargs: other variables for the template (a reasoning effort, a request's
            own template variables).
        reasoning_budget: the most tokens the reasoning may take: then the format's end of
            reasoning is written for the model and the answer follows (None: no cap).
        template: a Jinja chat template to render with instead of the model's (a library
            variant's, Ollama's /api/create TEMPLATE); None: the model's.
        continue_final: the last message is the assistant's answer begun (a prefill): the
            model goes on writing it, and the reply holds what it adds.
        require_thinking: a model whose format has no reasoning refuses the request (400;
            Ollama's `think: true`), rather than answering without thinking.
        require_tools: a model that cannot call the request's tools (its template shows
            none, or its format's calls are not read here) refuses the request (400;
            Ollama's), rather than answering as if none were given.
        drop_history: a conversation past the context drops its oldest messages (system
            messages and the last message kept) until it fits, as Ollama's /api/chat does,
            rather than being refused.
    """

    messages: list[dict] = msgspec.field(default_factory=list)
    constraint: ConstraintRequest = msgspec.field(default_factory=ConstraintRequest)
    tools: list[dict] | None = None
    thinking: bool | None = None
    template_kwargs: dict = msgspec.field(default_factory=dict)
    reasoning_budget: int | None = None
    template: str | None = None
    continue_final: bool = False
    require_thinking: bool = False
    require_tools: bool = False
    drop_history: bool = False


class Infill(msgspec.Struct, kw_only=True, frozen=True):
    """Fill in the middle: the completion's `prompt` is the text before a gap, `suffix` the
    text after it; the model reads them in its FIM tokens (actors.infill) and writes the
    middle.

    Attributes:
        suffix: the text after the gap.
        middle: text already written at the start of the gap (llama-server's `prompt`).
        extra: other files' (name, text), read before the gap's own file (llama-server's
            `input_extra`).
        repository: llama-server's layout: a repository-level header where the model has
            its tokens, the file's name, and the prefix, suffix and extra files cut to
            llama-server's shares of its batch; otherwise the gap alone, as Ollama's code
            models' templates write it.
    """

    suffix: str
    middle: str = ""
    extra: list[tuple[str, str]] = msgspec.field(default_factory=list)
    repository: bool = False


class CompletionGenerate(_Generate, tag="completion"):
    """A raw prompt, continued as it is (no template, no parsing): `prompt`, or the token
    ids `prompt_ids` where given, or `prompt_parts` (llama-server's mixed prompt: strings
    and token ids in one list, their ids joined in order: actors.mixed). `constraint`: a
    response format only (the continuation a JSON document: vLLM's `response_format` on
    completions, Ollama's `format` with `raw`); no tools, no reasoning.

    `echo_prompt`: a Prompt event (the prompt's text as the model read it) comes before
    any output; `prompt_logprobs`: with each prompt token's logprob after the tokens before
    it (and the `top_logprobs` most likely there): a cached prefix is taken only as far as
    an earlier scored prompt gave the same start its scores (actors.score_memo).
    `max_tokens` 0 scores the prompt and writes nothing. `infill`: the prompt is the text
    before a gap the model fills (a code model's fill-in-the-middle); `min_indent`: a line
    after the first indented less than this ends the output (llama-server's `n_indent`:
    an editor's completion ends where its block does; 0: no such rule); `return_ids`: each
    Deltas holds the token ids written since the last (llama-server's `return_tokens`);
    `time_limit_s`: once the output has been written for longer, it ends with the next
    token that writes a newline (llama-server's `t_max_predict_ms`: an editor waits no
    longer than that for a completion of whole lines; None: no limit).
    """

    prompt: str = ""
    prompt_ids: list[int] | None = None
    prompt_parts: list[str | int] | None = None
    infill: Infill | None = None
    min_indent: int = 0
    time_limit_s: float | None = None
    constraint: ConstraintRequest = msgspec.field(default_factory=ConstraintRequest)
    echo_prompt: bool = False
    prompt_logprobs: bool = False
    return_ids: bool = False


class EmbedGenerate(msgspec.Struct, kw_only=True, tag="embed"):
    """Inputs to embed: each one's pooled vector, L2-normalized.

    Attributes:
        inputs: texts (tokenized as the model does for embedding) or token ids.
        truncate: an input longer than the context is cut to it (else the request is
            refused, naming the input's index).
        dimensions: keep the first this many of each vector, then normalize again
            (Matryoshka); None: all of them.
        context_limit: a context smaller than the model's, for each input.
        keep_last: each input cut to its last this many tokens (a text's special tokens
            kept around them; -1: the context), before the context is checked; None: uncut.
    """

    request_id: str
    inputs: list[str | list[int]] = msgspec.field(default_factory=list)
    truncate: bool = False
    dimensions: int | None = None
    context_limit: int | None = None
    keep_last: int | None = None


# What the ingress sends a worker.
GenerateRequest = ChatGenerate | CompletionGenerate | EmbedGenerate


class TokenLogprob(msgspec.Struct, array_like=True):
    """A token's text, its log-probability (None: a prompt's first token, which follows
    nothing), its bytes, and the most likely tokens in its place (text, logprob, bytes);
    the token's id and those of `top` (llama-server's answers name them)."""

    token: str
    logprob: float | None
    bytes: list[int]
    top: list[tuple[str, float, list[int]]]
    id: int = -1
    top_ids: list[int] = msgspec.field(default_factory=list)


class Accepted(msgspec.Struct, tag="accepted", tag_field="event"):
    request_id: str
    model: str
    prompt_tokens: int
    load_s: float = 0.0  # seconds this request waited for its model to load (a library's)
    # of the prompt, taken from the KV cache (known when the prompt starts; it goes out then)
    cached_tokens: int = 0


class Rejected(msgspec.Struct, tag="rejected", tag_field="event"):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class Prompt(msgspec.Struct, tag="prompt", tag_field="event"):
    """The prompt as the model read it (a completion's `echo_prompt`), before any output:
    its text and, where asked (`prompt_logprobs`), one entry per prompt token."""

    text: str
    logprobs: list[TokenLogprob] | None = None


class Deltas(msgspec.Struct, tag="deltas", tag_field="event"):
    index: int
    deltas: list[Delta] = msgspec.field(default_factory=list)  # chat
    text: str = ""  # completions
    logprobs: list[TokenLogprob] | None = None
    tokens: int = 0  # the choice's tokens written so far (llama-server's running count)
    # a completion's `return_ids`: the token ids written since the last Deltas (an end
    # token's too; a token's text held back, as a stop string's start, comes later)
    ids: list[int] | None = None


class Finished(msgspec.Struct, tag="finished", tag_field="event"):
    """A choice ended. `message` (chat) is its final parse: what a non-streamed reply
    shows (a stream cannot take back a call it started; the final parse can). `stop`: the
    stop string that ended it (None: an end token, the grammar or a limit ended it).
    `cut_block`: a chat cut by a limit inside a tool block before any call in it was
    named: the block's raw text, which `message` does not show."""

    index: int
    finish_reason: str
    completion_tokens: int
    message: ChatMsg | None = None
    stop: str | None = None
    cut_block: str = ""
    cut: bool = False  # the output ended inside a tool call (a limit or a stop string)


class Usage(msgspec.Struct, tag="usage", tag_field="event"):
    prompt_tokens: int  # the whole prompt, cached tokens included
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt, taken from the KV cache (not computed)
    # speculative decoding: of the tokens drafted from the prompt and output, those kept
    # (part of completion_tokens) and those the model did not produce (not part of it)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # of completion_tokens, those whose text went to the reasoning (a token whose text
    # the stream held back counts where its text went out)
    reasoning_tokens: int = 0

    def plus(self, other: Usage) -> Usage:
        """Both requests' counts (the prompts of a batch)."""
        return Usage(*(a + b for a, b in zip(msgspec.structs.astuple(self),
                                             msgspec.structs.astuple(other), strict=True)))


class Embeddings(msgspec.Struct, tag="embeddings", tag_field="event"):
    """An embedding request's vectors: `vectors` is float32 little-endian, row-major
    [len(tokens), dims]; `tokens`: each input's token count (as embedded)."""

    vectors: bytes
    dims: int
    tokens: list[int]


class Failed(msgspec.Struct, tag="failed", tag_field="event"):
    message: str


Event = Accepted | Rejected | Prompt | Deltas | Finished | Embeddings | Usage | Failed

__all__ = ["Accepted", "ChatGenerate", "CompletionGenerate", "Deltas", "EmbedGenerate",
           "Embeddings", "Event", "Failed", "Finished", "GenerateRequest", "Infill", "Prompt",
           "Rejected", "TokenLogprob", "Usage", "coalesce"]


def coalesce(events: list[Event]) -> list[Event]:
    """The same events with each choice's consecutive outputs joined into one Deltas (a
    message that carries several tokens then becomes one chunk per choice): text and field
    suffixes are concatenated, a tool call's argument pieces joined, logprobs listed in
    order. A client folding the result gets exactly what it folds from `events`."""
    out: list[Event] = []
    open_: dict[int, Deltas] = {}
    for ev in events:
        if isinstance(ev, Deltas):
            acc = open_.get(ev.index)
            if acc is None:
                acc = open_[ev.index] = Deltas(index=ev.index, deltas=list(ev.deltas),
                                               text=ev.text, tokens=ev.tokens,
                                               logprobs=None if ev.logprobs is None
                                               else list(ev.logprobs),
                                               ids=None if ev.ids is None else list(ev.ids))
                out.append(acc)
                continue
            for d in ev.deltas:
                last = acc.deltas[-1] if acc.deltas else None
                if last is not None and last.field == d.field and last.index == d.index \
                        and not d.name:
                    acc.deltas[-1] = Delta(field=last.field, text=last.text + d.text,
                                           index=last.index, id=last.id, name=last.name)
                else:
                    acc.deltas.append(d)
            acc.text += ev.text
            acc.tokens = max(acc.tokens, ev.tokens)
            if ev.logprobs is not None:
                acc.logprobs = (acc.logprobs or []) + list(ev.logprobs)
            if ev.ids is not None:
                acc.ids = (acc.ids or []) + list(ev.ids)
        else:
            if isinstance(ev, Finished):
                open_.pop(ev.index, None)
            out.append(ev)
    return out
