"""gpt-oss end to end without Ray: a small random gpt-oss model (experts, sinks, YaRN) with a
tokenizer that has the harmony markers and our own harmony template is detected as harmony,
and a constrained tool call from the Worker parses into a call that obeys its schema."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.events import Accepted, ChatGenerate, Deltas, Finished, Usage
from actors.worker import Worker
from chat import constraint_request_from_openai
from npu import load_model
from tests.gpt_oss_model import LIGHT, build_gpt_oss

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Worker:
    folder = tmp_path_factory.mktemp("gpt-oss") / "model"
    build_gpt_oss(folder, tmp_path_factory.mktemp("cache"))
    w = Worker(lambda: load_model(folder, name="tiny-gpt-oss"), max_batch=4)
    yield w
    w.close()


def _run(worker: Worker, body: dict, **kw) -> list:
    """A chat request as the ingress types it from OpenAI's options in `body`, with
    reasoning_effort "none" (thinking off, and the template told so)."""
    req = ChatGenerate(request_id="g", messages=[{"role": "user", "content": "Lights?"}],
                       constraint=constraint_request_from_openai(
                           {**body, "reasoning_effort": "none"}),
                       tools=body.get("tools"), thinking=False,
                       template_kwargs={"reasoning_effort": "none"}, **kw)

    async def run():
        return [ev async for batch in worker.generate(req) for ev in batch]

    return asyncio.run(run())


def test_detected_as_harmony(worker) -> None:
    assert worker.spec.kind.value == "harmony"


def test_required_tool_call_parses_and_obeys_its_schema(worker) -> None:
    for seed in range(3):
        events = _run(worker, body={"tools": [LIGHT], "tool_choice": "required"},
                      max_tokens=160, seed=seed)
        assert isinstance(events[0], Accepted) and isinstance(events[-1], Usage)
        finished = [e for e in events if isinstance(e, Finished)]
        assert finished and finished[0].finish_reason == "tool_calls", finished
        calls = finished[0].message.tool_calls
        assert [c.name for c in calls] == ["light"]
        assert isinstance(json.loads(calls[0].arguments)["on"], bool)
        assert any(isinstance(e, Deltas) for e in events)


def test_a_continued_answer_is_what_the_model_adds(worker) -> None:
    """harmony: the parser starts in the final channel the prompt left open, without the
    client's own text (the reply is what the model adds)."""
    from actors.session import build_session
    from chat import GrammarEngine

    model = worker.model
    req = ChatGenerate(request_id="c", messages=[{"role": "user", "content": "Lights?"},
                                                 {"role": "assistant", "content": '{"on":'}],
                       continue_final=True, thinking=False,
                       template_kwargs={"reasoning_effort": "none"})
    session = build_session(req, model, worker.spec,
                            lambda: GrammarEngine(model.token_table, list(model.eos_token_ids)))
    prompt = model.tokenizer.decode(session.prompt_ids, skip_special_tokens=False)
    assert prompt.endswith('<|channel|>final<|message|>{"on":')
    stream = session.choices[0].stream
    assert stream.message.content == ""  # not the client's text
    stream.update(" true}", final=True)
    assert stream.message.content == " true}" and not stream.message.reasoning_content
