"""The 129 real model outputs of ../shared/formats/outputs.jsonl: parse, stream, prefix."""

from __future__ import annotations

import json
import random

import pytest
from msgspec.structs import replace

from chat import ChatStream, FormatKind, detect_format, format_prefill, parse, spec_for_kind
from tests.chat.support import fold, is_prefix_msg, stream_pieces, without_ids
from tests.shared import is_token_for, needs_shared, outputs, template

pytestmark = needs_shared

# Outputs whose final parse takes back a tool call the stream had already started: the
# text ends inside an unfinished call (it becomes content), or one call of a list does
# not convert (it is dropped). A stream cannot unsend, so here the folded stream keeps the
# started call; everything else still agrees.
TAKEN_BACK = {"hermes_json-011", "gemma4-026", "lfm2_pythonic-031"}


# The corpus labels Llama 3.x's and Mistral's templates content_only (the C++ original read
# no calls of theirs); we read their calls (llama3_json, mistral_json, mistral_args). Their
# outputs here are plain text, which every format gives back as content.
OUR_FORMAT = {"meta-llama-Llama-3.1-8B-Instruct": "llama3_json",
              "meta-llama-Llama-3.2-3B-Instruct": "llama3_json",
              "mistralai-Mistral-Nemo-Instruct-2407": "mistral_json"}


def _format(case: dict) -> FormatKind:
    return FormatKind(OUR_FORMAT.get(case.get("template") or "", case["format"]))


def _case_ids() -> list[str]:
    return [c["id"] for c in outputs()] or ["no-shared-data"]


def _setup(case: dict):
    name = case.get("template")
    spec = (
        detect_format(template(name), is_token_for(name))
        if name
        else spec_for_kind(case["format"])
    )
    tail = (case.get("context") or {}).get("generation_prompt_ends_with", "")
    prefill = format_prefill(spec, tail)
    return spec, prefill


def _case(case_id: str) -> dict:
    return next(c for c in outputs() if c["id"] == case_id)


def _norm(value: str | None) -> str:
    # The corpus keeps each source's whitespace at the ends of a field (see its README);
    # our parser trims segments, so the ends are compared without whitespace.
    return (value or "").strip()


def _check_expect(msg, expect: dict) -> None:
    assert _norm(msg.reasoning_content) == _norm(expect["reasoning_content"])
    assert _norm(msg.content) == _norm(expect["content"])
    want = expect["tool_calls"]
    assert [c.name for c in msg.tool_calls] == [c["name"] for c in want]
    for got, exp in zip(msg.tool_calls, want):
        if exp["arguments"] is None:  # a truncated call: the argument text so far
            assert got.arguments == exp["arguments_json_prefix"]
        else:
            assert json.loads(got.arguments) == exp["arguments"]


@pytest.mark.parametrize("case_id", _case_ids())
def test_parse_matches_expected(case_id: str) -> None:
    case = _case(case_id)
    spec, prefill = _setup(case)
    assert spec.kind is _format(case)
    msg = parse(spec, prefill + case["raw"], partial=bool(case.get("partial")),
                tools=case.get("tools"))
    _check_expect(msg, case["expect"])


@pytest.mark.parametrize("case_id", _case_ids())
def test_stream_in_random_pieces_agrees_with_parse(case_id: str) -> None:
    case = _case(case_id)
    spec, prefill = _setup(case)
    partial = bool(case.get("partial"))
    whole = parse(spec, prefill + case["raw"], partial=partial, tools=case.get("tools"))
    for seed in range(5):
        stream = ChatStream(spec, prefill=prefill, tools=case.get("tools"))
        deltas = stream_pieces(stream, case["raw"], random.Random(seed), final=not partial)
        assert without_ids(stream.message) == whole
        folded = without_ids(fold(deltas))
        if case_id in TAKEN_BACK:
            assert folded.content == whole.content
            assert folded.reasoning_content == whole.reasoning_content
        else:
            assert folded == whole
        if case.get("chunks"):  # the source's own streaming pieces
            stream = ChatStream(spec, prefill=prefill, tools=case.get("tools"))
            deltas = [d for piece in case["chunks"] for d in stream.update(piece)]
            deltas += stream.update("", final=not partial)
            if case_id not in TAKEN_BACK:
                assert without_ids(fold(deltas)) == whole


@pytest.mark.parametrize("case_id", _case_ids())
def test_prefix_property_at_every_cut(case_id: str) -> None:
    case = _case(case_id)
    spec, prefill = _setup(case)
    tools = case.get("tools")
    text = prefill + case["raw"]
    final = parse(spec, text, partial=bool(case.get("partial")), tools=tools)
    longest_partial = parse(spec, text, partial=True, tools=tools)
    for cut in range(len(prefill), len(text) + 1):
        part = parse(spec, text[:cut], partial=True, tools=tools)
        if case_id in TAKEN_BACK:  # only the text fields keep the property
            part, final = replace(part, tool_calls=[]), replace(final, tool_calls=[])
            longest_partial = replace(longest_partial, tool_calls=[])
        why = is_prefix_msg(part, longest_partial)
        assert why is None, f"cut {cut}: {why}"
        why = is_prefix_msg(part, final)
        assert why is None, f"cut {cut} vs final: {why}"
