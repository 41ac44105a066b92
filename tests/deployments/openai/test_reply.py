"""OpenAI reply rendering (deployments.openai.reply): the usage object; a completion's
echo, streamed and whole."""

from __future__ import annotations

import json

import pytest

from actors.events import Deltas, Finished, Usage
from deployments.openai.reply import CompletionReply, usage_body


def test_usage_counts_speculative_drafts_only_when_there_were_some() -> None:
    plain = usage_body(Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4))
    assert plain == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                     "prompt_tokens_details": {"cached_tokens": 4}}
    spec = usage_body(Usage(prompt_tokens=10, completion_tokens=5, accepted_prediction_tokens=3,
                            rejected_prediction_tokens=2))
    assert spec["completion_tokens_details"] == {"accepted_prediction_tokens": 3,
                                                 "rejected_prediction_tokens": 2}
    assert spec["total_tokens"] == 15  # rejected drafts are not output


def _chunks(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().split("\n")
            if line.startswith("data: {")]


@pytest.mark.parametrize("texts", [["Once", " upon"], []])  # some text, or none at all
def test_echo_puts_the_prompt_before_each_choices_text(texts: list[str]) -> None:
    events = [Deltas(index=i, text=t) for t in texts for i in (0, 1)]
    events += [Finished(index=i, finish_reason="length", completion_tokens=len(texts))
               for i in (0, 1)]
    events += [Usage(prompt_tokens=3, completion_tokens=2 * len(texts))]
    streamed = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"}, echo="Tell: ")
    text = {0: "", 1: ""}
    for chunk in _chunks(streamed.render(events)):
        for c in chunk["choices"]:
            text[c["index"]] += c["text"]
    whole = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"}, echo="Tell: ")
    whole.fold(events)
    answer = json.loads(whole.answer().body)
    want = "Tell: " + "".join(texts)
    assert text == {0: want, 1: want}
    assert [c["text"] for c in answer["choices"]] == [want, want]
