"""OpenAI reply rendering (deployments.openai.reply): the usage object; a completion's
echo, streamed and whole."""

from __future__ import annotations

import json

import pytest

from actors.events import Accepted, Deltas, Finished, Prompt, TokenLogprob, Usage
from deployments.openai.reply import ChatReply, CompletionBatchReply, CompletionReply, usage_body


def test_usage_counts_speculative_drafts_only_when_there_were_some() -> None:
    plain = usage_body(Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4))
    assert plain == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                     "prompt_tokens_details": {"cached_tokens": 4}}
    spec = usage_body(Usage(prompt_tokens=10, completion_tokens=5, accepted_prediction_tokens=3,
                            rejected_prediction_tokens=2))
    assert spec["completion_tokens_details"] == {"accepted_prediction_tokens": 3,
                                                 "rejected_prediction_tokens": 2}
    assert spec["total_tokens"] == 15  # rejected drafts are not output
    thought = usage_body(Usage(prompt_tokens=10, completion_tokens=5, reasoning_tokens=4))
    assert thought["completion_tokens_details"] == {"reasoning_tokens": 4}


def _chunks(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().split("\n")
            if line.startswith("data: {")]


@pytest.mark.parametrize("texts", [["Once", " upon"], []])  # some text, or none at all
def test_echo_puts_the_prompt_before_each_choices_text(texts: list[str]) -> None:
    events: list = [Prompt(text="Tell: ")]
    events += [Deltas(index=i, text=t) for t in texts for i in (0, 1)]
    events += [Finished(index=i, finish_reason="length", completion_tokens=len(texts))
               for i in (0, 1)]
    events += [Usage(prompt_tokens=3, completion_tokens=2 * len(texts))]
    streamed = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    text = {0: "", 1: ""}
    for chunk in _chunks(streamed.render(events)):
        for c in chunk["choices"]:
            text[c["index"]] += c["text"]
    whole = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    whole.fold(events)
    answer = json.loads(whole.answer().body)
    want = "Tell: " + "".join(texts)
    assert text == {0: want, 1: want}
    assert [c["text"] for c in answer["choices"]] == [want, want]


def _lp(token: str, value: float | None) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=value, bytes=list(token.encode()),
                        top=[] if value is None else [(token, value, list(token.encode()))])


@pytest.mark.parametrize("texts", [["!"], []])  # a token written, or the prompt only scored
def test_echoed_logprobs_start_with_the_prompts_the_first_one_null(texts: list[str]) -> None:
    """lm-evaluation-harness's loglikelihood reads `token_logprobs[ctxlen:-1]` of an echoed
    prompt: the prompt's tokens come first, the first with null logprobs, offsets counted
    from the prompt's start; streamed chunks fold to the same."""
    prompt = Prompt(text="Tell me", logprobs=[_lp("Tell", None), _lp(" me", -1.5)])
    events: list = [prompt]
    events += [Deltas(index=0, text=t, logprobs=[_lp(t, -0.25)]) for t in texts]
    events += [Finished(index=0, finish_reason="length", completion_tokens=len(texts)),
               Usage(prompt_tokens=2, completion_tokens=len(texts))]
    whole = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    whole.fold(events)
    choice = json.loads(whole.answer().body)["choices"][0]
    assert choice["text"] == "Tell me" + "".join(texts)
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Tell", " me", *texts]
    assert lp["token_logprobs"] == [None, -1.5] + [-0.25] * len(texts)
    assert lp["top_logprobs"] == [None, {" me": -1.5}] + [{t: -0.25} for t in texts]
    assert lp["text_offset"] == [0, 4] + [7] * len(texts)
    streamed = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    folded: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
    for chunk in _chunks(streamed.render(events)):
        for c in chunk["choices"]:
            for key in folded:
                folded[key] += (c["logprobs"] or {}).get(key, [])
    assert folded == lp


@pytest.mark.parametrize("top", [[], [("and", -0.5, [97, 110, 100])]])
def test_a_completions_top_logprobs_hold_the_sampled_token(top: list) -> None:
    """OpenAI's legacy `logprobs`: "the API will always return the logprob of the sampled
    token, so there may be up to logprobs+1 elements": a sampled token outside the top
    (temperature, `logprobs: 0`) is there beside them (lm-eval reads max() of each)."""
    rel = TokenLogprob(token="rel", logprob=-6.7, bytes=list(b"rel"), top=top)
    whole = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    whole.fold([Deltas(index=0, text="rel", logprobs=[rel]),
                Finished(index=0, finish_reason="length", completion_tokens=1),
                Usage(prompt_tokens=1, completion_tokens=1)])
    lp = json.loads(whole.answer().body)["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{**{t: v for t, v, _ in top}, "rel": -6.7}]


def test_a_batch_lists_each_prompts_choices_in_openais_order_and_sums_usage() -> None:
    """Prompt k's choice i is at index k * n + i; the usage adds up the prompts'."""
    parts = []
    for k, texts in enumerate([["a", "b"], ["c", "d"], ["e", "f"]]):
        part = CompletionReply({"id": f"cmpl-{k}", "created": 0, "model": "m"})
        part.fold([Prompt(text=f"p{k} ")] * (k == 1)
                  + [Deltas(index=i, text=t) for i, t in enumerate(texts)]
                  + [Finished(index=i, finish_reason="length", completion_tokens=1)
                     for i in (0, 1)]
                  + [Usage(prompt_tokens=3 + k, completion_tokens=2, cached_tokens=k)])
        parts.append(part)
    batch = CompletionBatchReply({"id": "cmpl-b", "created": 0, "model": "m"}, parts, n=2)
    body = json.loads(batch.answer().body)
    assert body["id"] == "cmpl-b" and body["object"] == "text_completion"
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "a"), (1, "b"), (2, "p1 c"), (3, "p1 d"), (4, "e"), (5, "f")]
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18,
                             "prompt_tokens_details": {"cached_tokens": 3}}


def _split(token_bytes: bytes, value: float) -> TokenLogprob:
    """A token whose bytes are part of a character: its piece is U+FFFD."""
    return TokenLogprob(token="\ufffd", logprob=value, bytes=list(token_bytes),
                        top=[("\ufffd", value, list(token_bytes))])


def _offsets_streamed_and_whole(events: list) -> tuple[list[int], list[int]]:
    whole = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    whole.fold(events)
    offsets = json.loads(whole.answer().body)["choices"][0]["logprobs"]["text_offset"]
    streamed = CompletionReply({"id": "cmpl-x", "created": 0, "model": "m"})
    got = [o for chunk in _chunks(streamed.render(events)) for c in chunk["choices"]
           for o in (c["logprobs"] or {}).get("text_offset", [])]
    return offsets, got


def test_written_tokens_offsets_start_after_the_echoed_text_streamed_or_not() -> None:
    """A prompt whose token pieces are not its text (a character split across tokens shows
    as U+FFFD in each): the character starts at the token that completes it, and the
    written tokens' offsets start at the prompt text's end, the same streamed or not."""
    prompt = Prompt(text="a媽", logprobs=[_lp("a", None), _split(b"\xe5\xaa", -1.0),
                                          _split(b"\xbd", -2.0)])
    events = [prompt, Deltas(index=0, text="b", logprobs=[_lp("b", -0.5)]),
              Deltas(index=0, text="c", logprobs=[_lp("c", -0.5)]),
              Finished(index=0, finish_reason="length", completion_tokens=2),
              Usage(prompt_tokens=3, completion_tokens=2)]
    assert _offsets_streamed_and_whole(events) == ([0, 1, 1, 2, 3], [0, 1, 1, 2, 3])


def test_written_characters_split_across_tokens_take_one_offset_streamed_or_not() -> None:
    """Found live: "🎉🎉\\n" written as three tokens for each emoji had offsets 0..6 whole
    (a U+FFFD piece counted as a character each, past the text's end) and 0, 0, 0, 1, 1,
    2, 2 streamed: offsets are the characters the tokens' bytes make, so each token's text
    is `text[offset[i]:offset[i + 1]]`, in chunks or not."""
    party = [_split(b"\xf0\x9f", -0.1), _split(b"\x8e", -0.2), _split(b"\x89", -0.3)]
    events = [Deltas(index=0, text="", logprobs=party[:2]),
              Deltas(index=0, text="🎉", logprobs=party[2:]),
              Deltas(index=0, text="🎉\n", logprobs=[*party, _lp("\n", -1.0)]),
              Finished(index=0, finish_reason="length", completion_tokens=7),
              Usage(prompt_tokens=3, completion_tokens=7)]
    assert _offsets_streamed_and_whole(events) == ([0, 0, 0, 1, 1, 1, 2],
                                                   [0, 0, 0, 1, 1, 1, 2])


def test_continuous_usage_puts_the_counts_so_far_on_every_chunk() -> None:
    """vLLM's `stream_options.continuous_usage_stats` (benchmarks count the tokens of a
    chunk that holds several from it): each choice's chunk carries the prompt's counts and
    its choice's tokens so far, and the last chunk the totals; it was ignored, every
    chunk's `usage` null (found probing live)."""
    events = [Accepted(request_id="r", model="m", prompt_tokens=5, cached_tokens=2),
              Deltas(index=0, text="Hi", tokens=1), Deltas(index=1, text="Yo", tokens=1),
              Deltas(index=0, text=" there", tokens=3),
              Finished(index=0, finish_reason="length", completion_tokens=3),
              Finished(index=1, finish_reason="stop", completion_tokens=2),
              Usage(prompt_tokens=5, completion_tokens=5, cached_tokens=2)]
    reply = ChatReply({"id": "chatcmpl-x", "created": 0, "model": "m"}, False, True)
    got = [(c["choices"][0]["index"] if c["choices"] else None,
            c["usage"] and (c["usage"]["prompt_tokens"], c["usage"]["completion_tokens"],
                            c["usage"]["total_tokens"],
                            c["usage"]["prompt_tokens_details"]["cached_tokens"]))
           for c in _chunks(reply.render(events))]
    assert got == [(0, (5, 1, 6, 2)), (1, (5, 1, 6, 2)), (0, (5, 3, 8, 2)), (0, (5, 3, 8, 2)),
                   (1, (5, 2, 7, 2)), (None, (5, 5, 10, 2))]
    plain = ChatReply({"id": "chatcmpl-x", "created": 0, "model": "m"}, True)
    assert [c["usage"] for c in _chunks(plain.render(events))][:-1] == [None] * 5
