"""A request set up on a model (build_session), without a worker: the prompt it renders,
the constraint it gets, the choices, and what this model cannot do as a 400 naming the
field."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from actors.errors import RequestError
from actors.events import ChatGenerate, CompletionGenerate
from actors.session import build_session
from chat import GrammarEngine, constraint_request_from_openai, detect_format
from npu import load_model
from npu.load.tiny import ensure_tiny

TOOL = {"type": "function", "function": {"name": "say", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(ensure_tiny(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def spec(model):
    return detect_format(model.chat_template_source, model.tokenizer.is_token)


def _session(model, spec, request):
    """The session, and how often the grammar engine was made (once at most: the worker
    keeps the one it made, as this maker does)."""
    made: list[GrammarEngine] = []

    def engine() -> GrammarEngine:
        if not made:
            made.append(GrammarEngine(model.token_table, list(model.eos_token_ids)))
        return made[0]

    return build_session(request, model, spec, engine), made


def test_a_chat_request_renders_its_tools_and_gets_a_grammar_only_when_constrained(
        model, spec) -> None:
    plain, made = _session(model, spec, ChatGenerate(request_id="a", messages=MSG))
    assert not made and all(c.constraint is None for c in plain.choices)
    body = {"tools": [TOOL], "tool_choice": "required"}
    req = ChatGenerate(request_id="b", messages=MSG, n=2, tools=[TOOL],
                       constraint=constraint_request_from_openai(body))
    session, made = _session(model, spec, req)
    assert len(made) == 1 and len(session.choices) == 2
    assert all(c.constraint is not None and c.stream is not None for c in session.choices)
    prompt = model.tokenizer.decode(session.prompt_ids, skip_special_tokens=False)
    assert '"name": "say"' in prompt and len(session.prompt_ids) > len(plain.prompt_ids)


def test_a_conversation_with_tools_renders_with_the_tool_use_template(model, monkeypatch
                                                                      ) -> None:
    """A model with a tool_use template (Hermes-3's, Command-R's) renders a conversation
    with tools with it, as transformers does, and reads its output in that template's
    format; without tools, the default template (here a plain one without tools: content
    only) serves."""
    from actors.session import chosen_template, render_prompt
    from actors.worker import Worker
    from chat import FormatKind
    from npu import ChatTemplate

    tool_use = model.template  # flm-tiny's own: tools, and calls in a format it reads
    plain = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                         "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    monkeypatch.setattr(model, "template", plain)
    monkeypatch.setattr(model, "tool_template", tool_use)
    body = {"tools": [TOOL], "tool_choice": "required"}
    with_tools = ChatGenerate(request_id="t", messages=MSG, tools=[TOOL],
                              constraint=constraint_request_from_openai(body))
    without = ChatGenerate(request_id="p", messages=MSG)
    assert chosen_template(with_tools, model) == tool_use.source
    assert chosen_template(without, model) is None
    assert '"name": "say"' in render_prompt(with_tools, model)
    assert render_prompt(without, model) == "<|im_start|>user\nHi<|im_end|>\n" \
                                            "<|im_start|>assistant"
    worker = Worker(lambda: model, max_batch=1)
    assert worker.spec.kind is FormatKind.CONTENT_ONLY
    assert worker.tool_spec.kind is not FormatKind.CONTENT_ONLY
    assert worker.spec_for(with_tools) == worker.tool_spec
    assert worker.spec_for(without) == worker.spec
    session, _ = _session(model, worker.spec_for(with_tools), with_tools)
    assert all(c.constraint is not None for c in session.choices)


def test_a_completion_is_its_prompt_as_it_is(model, spec) -> None:
    session, made = _session(model, spec, CompletionGenerate(request_id="c", prompt="The sea"))
    assert session.prompt_ids == model.prompt_ids("The sea")
    assert not made and all(c.stream is None for c in session.choices)


@pytest.mark.parametrize("request_,param", [
    (ChatGenerate(request_id="d", messages=[{"role": "user", "content": "x " * 5000}]),
     "messages"),
    (CompletionGenerate(request_id="e", prompt="x " * 5000), "prompt"),
    (ChatGenerate(request_id="f", messages=MSG, context_limit=3), "context_limit"),
])
def test_a_prompt_over_the_context_is_a_400_naming_the_field(model, spec, request_,
                                                             param: str) -> None:
    with pytest.raises(RequestError) as info:
        _session(model, spec, request_)
    assert info.value.status == 400 and info.value.param == param
    assert info.value.code == "context_length_exceeded"


def test_ollamas_long_conversation_drops_its_oldest_messages_to_fit(model, spec) -> None:
    """Ollama's /api/chat past num_ctx: the fewest oldest messages go (the system message
    and the last one stay, a tool result whose call went goes too) and the reply is
    written; other APIs refuse the same conversation (400)."""
    turns = [{"role": "system", "content": "Be brief."}]
    for i in range(12):
        turns.append({"role": "user", "content": f"question {i} " + "word " * 20})
        if i == 5:
            turns.append({"role": "assistant", "content": "",
                          "tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "say", "arguments": "{}"}}]})
            turns.append({"role": "tool", "tool_call_id": "c1", "content": "done"})
        turns.append({"role": "assistant", "content": f"answer {i}"})
    turns.append({"role": "user", "content": "and the last one?"})
    limit = 120
    with pytest.raises(RequestError) as info:
        _session(model, spec, ChatGenerate(request_id="t0", messages=turns, context_limit=limit))
    assert info.value.code == "context_length_exceeded"
    session, _ = _session(model, spec, ChatGenerate(request_id="t1", messages=turns,
                                                    context_limit=limit, drop_history=True))
    kept = session.request.messages
    assert len(session.prompt_ids) < limit and 2 < len(kept) < len(turns)
    assert kept[0] == turns[0] and kept[-1] == turns[-1]
    assert kept[1:] == turns[len(turns) - len(kept) + 1:]  # the newest, in order
    assert kept[1]["role"] == "user"  # whole turns: no answer or result opens it
    first = len(turns) - len(kept) + 1
    before = max(i for i in range(1, first) if turns[i]["role"] == "user")
    more = ChatGenerate(request_id="t2", messages=[turns[0]] + turns[before:],
                        context_limit=limit)  # one turn more than kept: over the limit
    with pytest.raises(RequestError):
        _session(model, spec, more)
    alone = [turns[0], {"role": "user", "content": "word " * 400}]
    with pytest.raises(RequestError):  # the last message alone does not fit: refused
        _session(model, spec, ChatGenerate(request_id="t3", messages=alone, context_limit=limit,
                                           drop_history=True))


def test_ollamas_long_conversation_leaves_room_for_the_reply_it_asks_for(model, spec) -> None:
    """A conversation just under num_ctx with num_predict: older messages go until the
    reply fits too, as Ollama's runner (shifting its context) writes all of it; a reply
    that no cut makes room for keeps the conversation as it fits."""
    turns = []
    for i in range(12):
        turns += [{"role": "user", "content": f"question {i} " + "word " * 20},
                  {"role": "assistant", "content": f"answer {i}"}]
    turns.append({"role": "user", "content": "and the last one?"})
    limit = 120
    fitted, _ = _session(model, spec, ChatGenerate(request_id="r0", messages=turns,
                                                   context_limit=limit, drop_history=True))
    short = len(fitted.prompt_ids)
    assert limit - short < 40  # without a reply's length: the history fills the context
    session, _ = _session(model, spec, ChatGenerate(request_id="r1", messages=turns,
                                                    context_limit=limit, drop_history=True,
                                                    max_tokens=40))
    assert len(session.prompt_ids) + 40 < limit
    assert session.request.messages[-1] == turns[-1]
    session, _ = _session(model, spec, ChatGenerate(request_id="r2", messages=turns,
                                                    context_limit=limit, drop_history=True,
                                                    max_tokens=limit))  # no cut makes room
    assert len(session.prompt_ids) == short


def test_a_logit_bias_outside_the_vocabulary_is_a_400_naming_it(model, spec) -> None:
    vocab = model.config.vocab_size
    with pytest.raises(RequestError) as info:
        _session(model, spec, ChatGenerate(request_id="g", messages=MSG,
                                           logit_bias={3: 1.0, vocab: -100.0}))
    assert info.value.param == "logit_bias" and str(vocab) in str(info.value)
    session, _ = _session(model, spec, ChatGenerate(request_id="h", messages=MSG,
                                                    logit_bias={vocab - 1: 100.0}))
    logits = np.zeros(vocab, np.float32)
    assert session.choices[0].sampler.sample(logits) == vocab - 1


def test_the_thinking_switch_reaches_the_template(model, spec) -> None:
    on, _ = _session(model, spec, ChatGenerate(request_id="g", messages=MSG, thinking=True))
    off, _ = _session(model, spec, ChatGenerate(request_id="h", messages=MSG, thinking=False))
    assert on.prompt_ids != off.prompt_ids


def test_a_request_with_its_own_template_renders_with_it(model, spec) -> None:
    from actors.session import prompt_tokens

    own = "{% for m in messages %}<<{{ m.role }}|{{ m.content }}>>{% endfor %}OUT:"
    session, _ = _session(model, spec, ChatGenerate(request_id="t", messages=MSG,
                                                    template=own))
    prompt = model.tokenizer.decode(session.prompt_ids, skip_special_tokens=False)
    assert prompt.endswith("<<user|Hi>>OUT:") and "<|im_start|>" not in prompt
    req = ChatGenerate(request_id="u", messages=MSG, template=own)
    assert prompt_tokens(req, model) == len(session.prompt_ids)
    with pytest.raises(RequestError) as err:  # a template that fails: the request's 400
        _session(model, spec, ChatGenerate(request_id="v", messages=MSG,
                                           template="{{ raise_exception('no') }}"))
    assert err.value.status == 400 and err.value.param == "messages"


def test_a_completion_with_a_response_format_gets_the_documents_grammar(model, spec) -> None:
    """A completion's response format constrains the continuation itself: the whole text
    is the JSON document (no reasoning, no calls), whatever the model's chat format."""
    body = {"response_format": {"type": "json_object"}}
    creq = msgspec.structs.replace(constraint_request_from_openai(body), allow_reasoning=False)
    session, made = _session(model, spec, CompletionGenerate(request_id="g", prompt="{", n=2,
                                                             constraint=creq))
    assert len(made) == 1 and all(c.constraint is not None for c in session.choices)
    assert all(c.stream is None for c in session.choices)
    choice = session.choices[0]
    assert choice.constraint.fill_mask(choice.mask)
    bits = np.unpackbits(choice.mask.view(np.uint8), bitorder="little")
    allowed = np.flatnonzero(bits[: model.config.vocab_size]).tolist()
    first = {model.token_table[i].lstrip()[:1] for i in allowed}  # a document's first byte
    assert allowed and first <= {b"{", b"["}, first


def test_a_last_assistant_message_is_continued_not_closed(model, spec) -> None:
    begun = MSG + [{"role": "assistant", "content": "Once upon a"}]
    session, _ = _session(model, spec, ChatGenerate(request_id="p", messages=begun,
                                                    continue_final=True))
    prompt = model.tokenizer.decode(session.prompt_ids, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\nOnce upon a")
    closed, _ = _session(model, spec, ChatGenerate(request_id="q", messages=begun))
    assert model.tokenizer.decode(closed.prompt_ids, skip_special_tokens=False).endswith(
        "Once upon a<|im_end|>\n<|im_start|>assistant\n")  # without: a new turn


def test_a_continued_message_cannot_be_under_a_format(model, spec) -> None:
    begun = MSG + [{"role": "assistant", "content": "{"}]
    creq = constraint_request_from_openai({"response_format": {"type": "json_object"}})
    with pytest.raises(RequestError) as err:
        _session(model, spec, ChatGenerate(request_id="r", messages=begun, constraint=creq,
                                           continue_final=True))
    assert err.value.status == 400 and "prefill" in err.value.message


def test_a_completion_of_token_ids_is_those_ids(model, spec) -> None:
    ids = model.prompt_ids("The sea")
    session, _ = _session(model, spec, CompletionGenerate(request_id="w", prompt_ids=ids))
    assert session.prompt_ids == ids
    with pytest.raises(RequestError) as err:
        _session(model, spec, CompletionGenerate(request_id="x",
                                                 prompt_ids=[1, model.config.vocab_size]))
    assert err.value.status == 400 and err.value.param == "prompt"


def test_a_request_that_must_think_is_refused_by_a_model_that_cannot(model, spec) -> None:
    req = ChatGenerate(request_id="y", messages=MSG, thinking=True, require_thinking=True)
    assert spec.reasoning  # flm-tiny's format thinks: taken
    _session(model, spec, req)
    plain = msgspec.structs.replace(spec, reasoning=False)  # as SmolLM2's: no reasoning
    with pytest.raises(RequestError) as err:
        _session(model, plain, req)
    assert err.value.status == 400 and "does not support thinking" in err.value.message
    _session(model, plain, ChatGenerate(request_id="z", messages=MSG, thinking=True))


def test_a_request_that_must_call_tools_is_refused_by_a_model_that_cannot(
        model, spec, monkeypatch) -> None:
    """Ollama refuses tools on a model without the capability; a GGUF whose template shows
    no tools (SmolLM2's own) answered as if none were sent (found probing live)."""
    from chat import FormatKind, spec_for_kind
    from npu import ChatTemplate

    body = {"tools": [TOOL]}
    req = ChatGenerate(request_id="t", messages=MSG, tools=[TOOL], require_tools=True,
                       constraint=constraint_request_from_openai(body))
    _session(model, spec, req)  # flm-tiny's template shows tools, its format reads calls
    for plain in (spec_for_kind(FormatKind.CONTENT_ONLY), spec):
        with monkeypatch.context() as patch:
            if plain is spec:  # a template that leaves the tools out
                patch.setattr(model, "template", ChatTemplate(
                    "{% for m in messages %}{{ m.content }}{% endfor %}"))
            with pytest.raises(RequestError) as err:
                _session(model, plain, req)
        assert err.value.status == 400 and err.value.message == \
            f'"{model.name}" does not support tools'
    # the OpenAI API's auto: the tools are dropped and the model answers
    _session(model, spec_for_kind(FormatKind.CONTENT_ONLY),
             msgspec.structs.replace(req, require_tools=False))


def test_a_later_system_message_is_rendered_where_it_stands(model) -> None:
    """flm-tiny's template keeps a system message past the first as a system turn."""
    text = model.render([{"role": "user", "content": "Hi"},
                         {"role": "system", "content": "Reply in French only."},
                         {"role": "user", "content": "Hi"}])
    assert "<|im_start|>system\nReply in French only.<|im_end|>\n<|im_start|>user" in text
