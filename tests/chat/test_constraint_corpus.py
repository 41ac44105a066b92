"""The real outputs of ../shared/formats/outputs.jsonl through the grammar of the request
they answer (tools from the case, tool_choice auto), on the Qwen vocabulary."""

from __future__ import annotations

import pytest

from chat import (
    GrammarEngine,
    constraint_request_from_openai,
    detect_format,
    format_prefill,
    spec_for_kind,
)
from tests.shared import is_token_for, needs_shared, outputs, template
from tests.chat.vocab import qwen_available, qwen_vocab

pytestmark = [needs_shared, pytest.mark.skipif(
    not qwen_available(), reason="the Qwen tokenizer files in ../shared/formats are absent")]

# Outputs the grammars reject on purpose: they are forms a parser recovers but a
# constrained model is never steered into (the grammar spells one canonical form).
NON_CANONICAL = {
    "hermes_json-014": "arguments given as a JSON string",
    "qwen_xml-012": "parameters out of the schema's declared order",
    "gemma4-010": "a number with an exponent (numbers are bounded to 16 plain digits)",
    "lfm2_pythonic-022": "a Python set literal",
    "lfm2_pythonic-023": "zero-padded integers",
    "lfm2_pythonic-024": "a raw newline inside a string",
    "lfm2_pythonic-025": "unescaped quotes of the same style inside a string",
    "lfm2_pythonic-028": "a space between the opener and the call list",
    "lfm2_pythonic-031": "a bytes literal",
    "harmony-008": "the recipient in the role part of the header",
    "harmony-009": "a call on the analysis channel",
    "harmony-010": "the recipient in the role part of the header",
    "harmony-012": "the recipient in the role part of the header",
}
# Under tool_choice "auto" these are free text, but "required" rejects them.
REQUIRED_REJECTS = {
    "qwen_xml-018": "a call without its <tool_call> wrapper",
    "qwen_xml-019": "a call inside a reasoning block that never closed",
}
# Outputs cut off before the turn ended: accepted as far as they go.
TRUNCATED = {"hermes_json-010", "harmony-011", "harmony-013"}


@pytest.fixture(scope="module")
def engine() -> GrammarEngine:
    vocab, stops = qwen_vocab()
    return GrammarEngine(vocab, stops)


def _unknown(calls: list[dict]) -> list[dict]:
    """The tools of a case that names none: each called one, its arguments any object (an
    omitted `parameters` would be a tool without any)."""
    return list({c["name"]: {"name": c["name"], "parameters": {"type": "object"}}
                 for c in calls}.values())


def _cases() -> list[str]:
    return [c["id"] for c in outputs() if not c.get("partial")] or ["no-shared-data"]


@pytest.mark.parametrize("case_id", _cases())
def test_real_output_against_its_request(engine, case_id: str) -> None:
    case = next(c for c in outputs() if c["id"] == case_id)
    name = case.get("template")
    spec = detect_format(template(name), is_token_for(name)) if name else \
        spec_for_kind(case["format"])
    tail = (case.get("context") or {}).get("generation_prompt_ends_with", "")
    calls = case["expect"]["tool_calls"]
    tools = case.get("tools") or _unknown(calls)
    body = {"tools": [{"type": "function", "function": t} for t in tools]} if tools else {}
    request = constraint_request_from_openai(body)
    ok, why = engine.accepts(spec, request, format_prefill(spec, tail), case["raw"])
    if case_id in NON_CANONICAL:
        assert not ok, NON_CANONICAL[case_id]
    elif case_id in TRUNCATED:
        assert not ok and "incomplete" in why
    else:
        assert ok, why


def _calls_only() -> list[str]:
    return [c["id"] for c in outputs()
            if c["id"].startswith(("hermes", "qwen_xml")) and not c.get("partial")
            and c["expect"]["tool_calls"] and not c["expect"]["content"]
            and c["id"] not in set(NON_CANONICAL) | TRUNCATED] or ["no-shared-data"]


@pytest.mark.parametrize("case_id", _calls_only())
def test_required_accepts_outputs_that_are_only_calls(engine, case_id: str) -> None:
    case = next(c for c in outputs() if c["id"] == case_id)
    expect = case["expect"]
    name = case["template"]
    spec = detect_format(template(name), is_token_for(name))
    tail = (case.get("context") or {}).get("generation_prompt_ends_with", "")
    tools = case.get("tools") or _unknown(expect["tool_calls"])
    body = {"tools": [{"type": "function", "function": t} for t in tools],
            "tool_choice": "required"}
    ok, why = engine.accepts(spec, constraint_request_from_openai(body),
                             format_prefill(spec, tail), case["raw"])
    assert ok is (case_id not in REQUIRED_REJECTS), why
