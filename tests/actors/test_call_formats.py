"""Tool calls end to end on Llama 3.x's and Mistral's call syntaxes (no Ray): a worker over
the tiny model served with a template of each kind detects the format, renders the tools,
forces a required call in that syntax and gives it back as a call, streamed and whole."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from actors.events import ChatGenerate, Deltas, Finished
from actors.worker import Worker
from chat import FormatKind, constraint_request_from_openai
from npu import load_model
from npu.load.tiny import ensure_tiny
from tests.shared import needs_shared, template

pytestmark = pytest.mark.timeout(120)

TOOL = {"type": "function", "function": {"name": "say", "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "maxLength": 8}},
    "required": ["text"]}}}
_TURNS = ("{% for m in messages %}{{ m.role }}: {{ m.content }}"
          "{% for c in m.tool_calls or [] %}{CALL}{% endfor %}\n{% endfor %}")
# the smallest templates that write calls as Llama 3.1-3.3's and Mistral's do
TEMPLATES = {
    FormatKind.LLAMA3_JSON: "<|start_header_id|>{% if tools %}Respond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}. "
    "{{ tools | tojson }}{% endif %}" + _TURNS.replace(
        "{CALL}", "{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}"),
    FormatKind.MISTRAL_JSON: "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}" + _TURNS.replace(
        "{CALL}", "[TOOL_CALLS][{{ c.function | tojson }}]"),
    FormatKind.MISTRAL_ARGS: "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}" + _TURNS.replace(
        "{CALL}", "{{ '[TOOL_CALLS]' + c.function.name + '[ARGS]' }}"
                  "{{ c.function.arguments | tojson }}"),
}


@pytest.fixture(scope="module", params=list(TEMPLATES), ids=lambda k: k.value)
def worker(request, tmp_path_factory):
    folder: Path = ensure_tiny(tmp_path_factory.mktemp("cache"))
    jinja = tmp_path_factory.mktemp("template") / "chat_template.jinja"
    jinja.write_text(TEMPLATES[request.param])
    w = Worker(lambda: load_model(folder, chat_template=str(jinja)), max_batch=2)
    yield request.param, w
    w.close()


def _events(worker: Worker, body: dict, **kw) -> list:
    req = ChatGenerate(request_id="t", messages=[{"role": "user", "content": "Say hi"}],
                       constraint=constraint_request_from_openai(body),
                       tools=body.get("tools"), **kw)

    async def run() -> list:
        return [ev async for batch in worker.generate(req) for ev in batch]

    return asyncio.run(run())


@pytest.mark.parametrize("seed", [1, 2])
def test_a_required_call_comes_back_as_a_call(worker, seed: int) -> None:
    kind, w = worker
    assert w.spec.kind is kind
    # (the tiny model's vocabulary has <think>: a random model would think all along, or
    # call again and again)
    events = _events(w, {"tools": [TOOL], "tool_choice": "required",
                         "parallel_tool_calls": False, "reasoning_effort": "none"},
                     seed=seed, max_tokens=120)
    fin = [e for e in events if isinstance(e, Finished)][0]
    assert fin.finish_reason == "tool_calls", fin
    assert fin.message.content == ""
    [call] = fin.message.tool_calls
    assert call.name == "say" and isinstance(json.loads(call.arguments)["text"], str)
    deltas = [d for e in events if isinstance(e, Deltas) for d in e.deltas]
    streamed = [d for d in deltas if d.field == "tool_call"]
    assert [d.name for d in streamed if d.name] == ["say"]
    assert "".join(d.text for d in streamed) == call.arguments


def test_a_call_sent_back_renders_in_the_model_syntax(worker) -> None:
    kind, w = worker
    call = {"id": "call_" + "x" * 24, "type": "function",
            "function": {"name": "say", "arguments": '{"text": "hi"}'}}
    text = w.model.render([{"role": "user", "content": "Say hi"},
                           {"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "content": "done"}],
                          [TOOL])
    spelled = {FormatKind.LLAMA3_JSON: '{"name": "say", "parameters": {"text": "hi"}}',
               FormatKind.MISTRAL_JSON: '[TOOL_CALLS][{"name": "say", "arguments": '
                                        '{"text": "hi"}}]',
               FormatKind.MISTRAL_ARGS: '[TOOL_CALLS]say[ARGS]{"text": "hi"}'}[kind]
    assert spelled in text


REAL = {"meta-llama-Llama-3.1-8B-Instruct": FormatKind.LLAMA3_JSON,
        "meta-llama-Llama-3.2-3B-Instruct": FormatKind.LLAMA3_JSON,
        "mistralai-Mistral-Nemo-Instruct-2407": FormatKind.MISTRAL_JSON,
        "mistralai-Mistral-Small-3.2-24B-Instruct-2506": FormatKind.MISTRAL_ARGS,
        "mistralai-Ministral-3-14B-Reasoning-2512": FormatKind.MISTRAL_ARGS}


@needs_shared
@pytest.mark.parametrize("name", sorted(REAL))
def test_the_real_templates_force_a_call_and_take_it_back(name: str, tmp_path_factory) -> None:
    """The vendors' own templates: the format is detected, a required call comes back as a
    call, and that call sent back with its result (OpenAI's ids) renders natively."""
    folder: Path = ensure_tiny(tmp_path_factory.mktemp("cache"))
    jinja = tmp_path_factory.mktemp("template") / "chat_template.jinja"
    jinja.write_text(template(name))
    w = Worker(lambda: load_model(folder, chat_template=str(jinja)), max_batch=1)
    try:
        assert w.spec.kind is REAL[name]
        events = _events(w, {"tools": [TOOL], "tool_choice": "required",
                             "parallel_tool_calls": False, "reasoning_effort": "none"},
                         seed=3, max_tokens=120)
        fin = [e for e in events if isinstance(e, Finished)][0]
        assert fin.finish_reason == "tool_calls", fin
        [call] = fin.message.tool_calls
        sent = {"id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
        text = w.model.render([{"role": "user", "content": "Say hi"},
                               {"role": "assistant", "content": None, "tool_calls": [sent]},
                               {"role": "tool", "tool_call_id": call.id, "content": "done"}],
                              [TOOL])
        assert "Tool result" not in text and '{"tool_calls"' not in text
        assert json.dumps(json.loads(call.arguments), ensure_ascii=False) in text
    finally:
        w.close()
