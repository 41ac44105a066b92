"""Random walks under every mode and format: whatever a constrained model is made to emit,
the parser reads back as valid tool calls or a valid document."""

from __future__ import annotations

import json
import zlib

import jsonschema
import numpy as np
import pytest

from chat import (
    GrammarEngine,
    constraint_request_from_openai,
    make_constraint,
    parse,
    spec_for_kind,
)
from tests.chat.vocab import qwen_available, qwen_vocab, small_vocab

KINDS = ["hermes_json", "qwen_xml", "gemma4", "lfm2_pythonic", "harmony", "mistral_json",
         "mistral_args", "llama3_json", "content_only"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                       "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_flags", "parameters": {
        "type": "object",
        "properties": {"on": {"type": "boolean"}, "level": {"type": "number"},
                       "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["on", "tags"]}}},
]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "age"]}
MODES = {
    "auto": {"tools": TOOLS},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function",
                                              "function": {"name": "set_flags"}}},
    "single": {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": SCHEMA}}},
    "json_object": {"response_format": {"type": "json_object"}},
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _check(kind: str, mode: str, body: dict, text: str) -> None:
    spec = spec_for_kind(kind)
    request = constraint_request_from_openai(body)
    prefill = "assistant" if kind == "harmony" else ""
    msg = parse(spec, prefill + text, partial=False,
                parse_tool_calls=request.parse_tool_calls, tools=body.get("tools"))
    if mode in ("json_schema", "json_object"):
        doc = json.loads(msg.content)
        jsonschema.validate(doc, SCHEMA if mode == "json_schema" else {"type": "object"})
        assert msg.tool_calls == []
        return
    if spec.kind.value == "content_only":
        return
    for call in msg.tool_calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    if mode != "auto":
        assert msg.tool_calls, f"no call in {text!r}"
        assert msg.content == "", f"text beside the calls: {msg.content!r}"
    if mode == "named":
        assert {c.name for c in msg.tool_calls} == {"set_flags"}
    if mode == "single":
        assert len(msg.tool_calls) == 1


def _run(engine: GrammarEngine, vocab, stops, kind: str, mode: str, n: int, seed: int,
         closer_bias: float = 0.0) -> int:
    from tests.chat.walk import walk

    spec = spec_for_kind(kind)
    body = MODES[mode]
    request = constraint_request_from_openai(body)
    rng = np.random.default_rng(seed)
    ended = 0
    for _ in range(n):
        constraint = make_constraint(spec, request, engine)
        if constraint is None:
            assert kind in ("content_only", "llama3_json") and mode == "auto"
            return n
        constraint.start("assistant" if kind == "harmony" else "")
        text, done = walk(constraint, vocab, set(stops), rng, closer_bias=closer_bias)
        if done:
            ended += 1
            _check(kind, mode, body, text)
    return ended


@pytest.fixture(scope="module")
def small_engine():
    vocab, stops = small_vocab()
    return GrammarEngine(vocab, stops), vocab, stops


# content_only has no tool syntax: only its documents are constrained
CASES = [(k, m) for k in KINDS for m in MODES
         if k != "content_only" or m in ("json_schema", "json_object")]


@pytest.mark.parametrize("kind,mode", CASES)
def test_random_walks_parse_into_valid_calls_and_documents(small_engine, kind, mode) -> None:
    engine, vocab, stops = small_engine
    n = 200
    ended = _run(engine, vocab, stops, kind, mode, n, seed=zlib.crc32(f"{kind}/{mode}".encode()))
    # free-text regions (reasoning, string values) make some walks run past the budget
    assert ended >= n // 10, f"only {ended} of {n} walks reached a stop token"


@pytest.mark.skipif(not qwen_available(), reason="the Qwen tokenizer files in ../shared are absent")
@pytest.mark.parametrize("kind", KINDS)
def test_random_walks_on_the_qwen_vocabulary(kind) -> None:
    vocab, stops = qwen_vocab()
    engine = _qwen_engine()
    mode = "json_schema" if kind == "content_only" else "named"
    ended = _run(engine, vocab, stops, kind, mode, 5, seed=7, closer_bias=6.0)
    assert ended >= 1


_ENGINE: list[GrammarEngine] = []


def _qwen_engine() -> GrammarEngine:
    if not _ENGINE:
        vocab, stops = qwen_vocab()
        _ENGINE.append(GrammarEngine(vocab, stops))
    return _ENGINE[0]
