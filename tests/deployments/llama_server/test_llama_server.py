"""llama-server's own completions and fill in the middle at the ingress, without Ray (the
real app in front of the fake worker of tests/deployments/test_ingress.py): /completion's
and /infill's bodies typed once as a completion (/infill's with its repository-level
layout), their answers and streams in llama-server's own shape (`response_fields` too);
OpenAI's `suffix` on /v1/completions and Ollama's on /api/generate as the gap alone;
/completion's prompt forms (mixed strings and ids, several prompts answered as an array);
bad input a 400 naming the field by the body's name, errors in llama-server's shape."""

from __future__ import annotations

import json

import pytest

from actors.errors import FIM_UNSUPPORTED
from actors.events import (
    Accepted,
    CompletionGenerate,
    Deltas,
    Failed,
    Finished,
    Infill,
    Prompt,
    Rejected,
    TokenLogprob,
    Usage,
)
from tests.deployments.test_hostile_bodies import HOSTILE
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client

PROMPT = "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>"


def _middle(text: str = "\n    return 1", *, reason: str = "stop",
            stop: str | None = None) -> FakeStream:
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=9),
                        Prompt(text=PROMPT)],
                       [Deltas(index=0, text=text[:5], tokens=1)],
                       [Deltas(index=0, text=text[5:], tokens=4)],
                       [Finished(index=0, finish_reason=reason, completion_tokens=4,
                                 stop=stop),
                        Usage(prompt_tokens=9, completion_tokens=4, cached_tokens=3)]])


BODY = {"input_prefix": "def f():", "input_suffix": "\n", "prompt": "  ",
        "input_extra": [{"filename": "a.py", "text": "A = 1"}, {"text": "B = 2"}],
        "n_predict": 16, "temperature": 0.1, "top_k": 40, "top_p": 0.99, "seed": -1,
        "repeat_penalty": 1.1, "stop": ["\n\n"], "cache_prompt": True, "id_slot": -1,
        "t_max_prompt_ms": 500, "n_indent": 4, "samplers": ["top_k", "top_p"]}


def test_llama_servers_body_is_one_completion_with_its_layout() -> None:
    worker = FakeWorker(_middle())
    client, _ = _client(worker)
    r = client.post("/infill", json=BODY)
    assert r.status_code == 200, r.text
    greq = worker.requests[0]
    assert isinstance(greq, CompletionGenerate) and greq.prompt == "def f():"
    assert greq.infill == Infill(suffix="\n", middle="  ", repository=True,
                                 extra=[("a.py", "A = 1"), ("tmp", "B = 2")])
    assert (greq.max_tokens, greq.temperature, greq.top_k, greq.top_p, greq.seed,
            greq.repetition_penalty, greq.repeat_last_n, greq.stop, greq.min_indent) == \
        (16, 0.1, 40, 0.99, None, 1.1, 64, ["\n\n"], 4)  # llama-server's window: 64
    body = r.json()
    assert body["content"] == "\n    return 1" and body["stop"] is True
    assert body["prompt"] == PROMPT and body["model"] == "m"
    assert (body["tokens_predicted"], body["tokens_evaluated"], body["tokens_cached"]) == \
        (4, 9, 13)
    assert (body["stop_type"], body["stopping_word"], body["has_new_line"]) == \
        ("eos", "", True)
    timings = body["timings"]
    assert (timings["cache_n"], timings["prompt_n"], timings["predicted_n"]) == (3, 6, 4)
    assert body["generation_settings"]["n_predict"] == 16


def test_no_limit_is_minus_one_or_none_and_a_stop_word_or_the_limit_says_so() -> None:
    worker = FakeWorker(_middle(stop="\n\n"), _middle(reason="length"))
    client, _ = _client(worker)
    r = client.post("/infill", json={**BODY, "n_predict": -1})
    assert (r.json()["stop_type"], r.json()["stopping_word"]) == ("word", "\n\n")
    r = client.post("/infill", json={"input_prefix": "a", "input_suffix": ""})
    assert r.json()["stop_type"] == "limit"
    assert [g.max_tokens for g in worker.requests] == [None, None]
    assert worker.requests[1].infill == Infill(suffix="", repository=True)


def test_n_predict_0_reads_the_files_into_the_cache_and_writes_nothing() -> None:
    """llama.vim's warm-up: its extra files sent ahead with `n_predict: 0`."""
    worker = FakeWorker(_middle(text="", reason="length"))
    client, _ = _client(worker)
    r = client.post("/infill", json={"input_prefix": "", "input_suffix": "",
                                     "input_extra": [{"filename": "a.py", "text": "A = 1"}],
                                     "n_predict": 0, "response_fields": [""]})
    assert r.status_code == 200 and r.json() == {}
    assert worker.requests[0].max_tokens == 0


def test_response_fields_pick_paths_as_llama_server_does() -> None:
    client, _ = _client(FakeWorker(_middle()))
    r = client.post("/infill", json={**BODY, "response_fields": [
        "content", "timings/prompt_n", "timings/nope", "truncated"]})
    assert r.json() == {"content": "\n    return 1", "timings/prompt_n": 6, "truncated": False}


def test_streamed_pieces_then_the_whole_object_without_done() -> None:
    client, _ = _client(FakeWorker(_middle()))
    r = client.post("/infill", json={**BODY, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert "[DONE]" not in lines
    events = [json.loads(ln) for ln in lines]
    pieces, last = events[:-1], events[-1]
    assert "".join(p["content"] for p in pieces) == "\n    return 1"
    assert all(p["stop"] is False for p in pieces)
    # each piece: the tokens written so far (the second piece held three tokens' text)
    assert [p["tokens_predicted"] for p in pieces] == [1, 4]
    assert last["stop"] is True and last["content"] == "" and last["tokens_predicted"] == 4


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": "x"}, "input_prefix"),
    ({"input_prefix": "x"}, "input_suffix"),
    ({"input_prefix": "x", "input_suffix": "", "input_extra": {"text": "a"}}, "input_extra"),
    ({"input_prefix": "x", "input_suffix": "", "input_extra": [{"filename": "a"}]},
     "input_extra[0].text"),
    ({"input_prefix": "x", "input_suffix": "", "prompt": 3}, "prompt"),
    ({"input_prefix": "x", "input_suffix": "", "n_predict": -3}, "n_predict"),
    ({"input_prefix": "x", "input_suffix": "", "n_indent": -1}, "n_indent"),
    ({"input_prefix": "x", "input_suffix": "", "max_tokens": -5}, "max_tokens"),
    ({"input_prefix": "x", "input_suffix": "", "repeat_penalty": 0}, "repeat_penalty"),
])
def test_bad_input_is_a_400_naming_the_bodys_field(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/infill", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and worker.requests == []


def test_a_model_without_fim_tokens_is_llama_servers_501_naming_input_suffix() -> None:
    """The worker's refusal (a 400 on OpenAI's and Ollama's routes) is llama-server's
    not_supported_error on /infill."""
    refused = FakeStream([[Rejected(status=400, param="suffix", code=FIM_UNSUPPORTED,
                                    message='"m" does not support insert')]])
    client, _ = _client(FakeWorker(refused))
    r = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 501
    assert r.json()["error"] == {"code": 501, "type": "not_supported_error",
                                 "param": "input_suffix",
                                 "message": '"m" does not support insert (\'input_suffix\')'}


def test_errors_are_in_llama_servers_shape() -> None:
    """`{"error": {"code": <status>, "message", "type"}}` (and `param`), the type named by
    the status as llama-server names it; a prompt over the context its own type."""
    over = FakeStream([[Rejected(status=400, param="prompt", code="context_length_exceeded",
                                 message="This model's maximum context length is 8 tokens; "
                                         "the prompt has 9.")]])
    client, _ = _client(FakeWorker(over))
    r = client.post("/completion", json={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": 400, "type": "exceed_context_size_error", "param": "prompt",
        "message": "This model's maximum context length is 8 tokens; the prompt has 9."}
    for path, body, status, kind in (
            ("/completion", {"prompt": 5}, 400, "invalid_request_error"),
            ("/completion", {"prompt": "x", "model": "nope"}, 404, "not_found_error"),
            ("/infill", {"input_prefix": "x"}, 400, "invalid_request_error")):
        r = client.post(path, json=body)
        err = r.json()["error"]
        assert (r.status_code, err["code"], err["type"]) == (status, status, kind)
    r = client.get("/props", params={"model": "nope"})
    assert r.json()["error"]["code"] == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.json()["error"]["code"] == "model_not_found"  # OpenAI's routes: OpenAI's shape


def test_a_failure_mid_stream_is_an_error_event_in_llama_servers_shape() -> None:
    broken = FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=3)],
                         [Deltas(index=0, text="Pa")],
                         [Failed(message="The model worker failed.")]])
    client, _ = _client(FakeWorker(broken))
    r = client.post("/completion", json={"prompt": "x", "stream": True})
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[0]["content"] == "Pa"
    assert events[-1] == {"error": {"code": 503, "message": "The model worker failed.",
                                    "type": "unavailable_error", "param": None}}


def _completion() -> FakeStream:
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=9)],
                       [Deltas(index=0, text="x")],
                       [Finished(index=0, finish_reason="stop", completion_tokens=1),
                        Usage(prompt_tokens=9, completion_tokens=1)]])


def test_openais_suffix_fills_the_gap_alone() -> None:
    worker = FakeWorker(_completion())
    client, _ = _client(worker)
    r = client.post("/v1/completions", json={"model": "m", "prompt": "def f():",
                                             "suffix": "\n", "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "x"
    greq = worker.requests[0]
    assert greq.prompt == "def f():" and greq.infill == Infill(suffix="\n")
    for body, param in (({"prompt": "a", "suffix": "b", "echo": True}, "echo"),
                        ({"prompt": [1, 2], "suffix": "b"}, "suffix")):
        r = client.post("/v1/completions", json={"model": "m", **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert len(worker.requests) == 1


def test_ollamas_suffix_fills_the_gap_alone_even_with_an_empty_prompt() -> None:
    worker = FakeWorker(_completion(), _completion())
    client, _ = _client(worker)
    r = client.post("/api/generate", json={"model": "m", "prompt": "def f():", "suffix": "\n",
                                           "system": "ignored", "stream": False})
    assert r.status_code == 200 and r.json()["response"] == "x"
    first = worker.requests[0]
    assert isinstance(first, CompletionGenerate) and first.infill == Infill(suffix="\n")
    assert first.prompt == "def f():" and first.max_tokens is None
    r = client.post("/api/generate", json={"model": "m", "prompt": "", "suffix": "\n",
                                           "stream": False})
    assert r.json()["done_reason"] == "stop" and worker.requests[1].infill is not None
    r = client.post("/api/generate", json={"model": "m", "prompt": "a", "suffix": "b",
                                           "think": True})
    assert r.status_code == 400 and "suffix" in r.json()["error"]
    worker.plays.append(_completion())  # thinking off: nothing to switch off, no template
    r = client.post("/api/generate", json={"model": "m", "prompt": "a", "suffix": "b",
                                           "think": False, "stream": False})
    assert r.status_code == 200 and worker.requests[2].infill == Infill(suffix="b")


# what SillyTavern's llama.cpp backend sends (its sampler fields, most not read here)
TAVERN = {"prompt": "The knight said:", "n_predict": 12, "stream": False, "temperature": 0.7,
          "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 1, "tfs_z": 1,
          "repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0,
          "frequency_penalty": 0, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1,
          "grammar": "", "n_probs": 10, "min_keep": 0, "ignore_eos": False, "seed": -1,
          "stop": ["\nUser:"], "cache_prompt": True, "dry_multiplier": 0,
          "samplers": ["top_k", "tfs_z", "typical_p", "top_p", "min_p", "temperature"]}


def test_completion_is_the_prompt_continued_in_llama_servers_shape() -> None:
    worker = FakeWorker(_middle(stop="\nUser:"), _middle())
    client, _ = _client(worker)
    r = client.post("/completion", json=TAVERN)
    assert r.status_code == 200, r.text
    greq = worker.requests[0]
    assert isinstance(greq, CompletionGenerate) and greq.infill is None
    assert (greq.prompt, greq.prompt_ids, greq.max_tokens, greq.seed, greq.stop) == \
        ("The knight said:", None, 12, None, ["\nUser:"])
    assert (greq.repetition_penalty, greq.repeat_last_n) == (1.1, 64)
    body = r.json()
    assert (body["content"], body["stop"], body["stop_type"], body["stopping_word"]) == \
        ("\n    return 1", True, "word", "\nUser:")
    # token ids, on llama-server's other path; no n_predict: no limit
    r = client.post("/completions", json={"prompt": [1, 2, 3]})
    assert r.status_code == 200 and worker.requests[1].prompt_ids == [1, 2, 3]
    assert worker.requests[1].max_tokens is None
    worker.plays.append(_middle())
    r = client.post("/completion", json={"prompt": "a", "repeat_last_n": -1})
    assert r.status_code == 200 and worker.requests[2].repeat_last_n == -1  # the whole context


def test_each_of_llama_servers_prompt_forms_is_one_prompt() -> None:
    """A string, token ids, strings and ids mixed (a list with a bare id is one prompt, as
    llama-server's tokenize_input_prompts reads it), `{"prompt_string": ...}`, a list of one
    prompt: one object, the worker's prompt typed by its form."""
    forms = ["a", [1, 2], [1, "a", 2], ["a", 1], {"prompt_string": [3, "b"]},
             {"prompt_string": "c", "multimodal_data": []}, ["d"], [[4, 5]]]
    worker = FakeWorker(*(_completion() for _ in forms))
    client, _ = _client(worker)
    for form in forms:
        r = client.post("/completion", json={"prompt": form})
        assert r.status_code == 200, r.text
        assert isinstance(r.json(), dict) and r.json()["content"] == "x"
    typed = [(g.prompt, g.prompt_ids, g.prompt_parts) for g in worker.requests]
    assert typed == [("a", None, None), ("", [1, 2], None), ("", None, [1, "a", 2]),
                     ("", None, ["a", 1]), ("", None, [3, "b"]), ("c", None, None),
                     ("d", None, None), ("", [4, 5], None)]


def _part(text: str, prompt_tokens: int) -> FakeStream:
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=prompt_tokens)],
                       [Deltas(index=0, text=text)],
                       [Finished(index=0, finish_reason="stop", completion_tokens=1),
                        Usage(prompt_tokens=prompt_tokens, completion_tokens=1)]])


def test_several_prompts_are_answered_as_an_array_in_their_order() -> None:
    """A list without bare ids is several prompts (strings, id lists, mixed lists side by
    side): each its own worker request, answered together, each object with its `index`."""
    worker = FakeWorker(_part("A", 2), _part("B", 3), _part("C", 4))
    client, _ = _client(worker)
    r = client.post("/completion", json={"prompt": ["one", [7, 8], [9, "three"]],
                                         "n_predict": 4, "response_fields": [
                                             "index", "content", "tokens_evaluated"]})
    assert r.status_code == 200, r.text
    assert r.json() == [{"index": 0, "content": "A", "tokens_evaluated": 2},
                        {"index": 1, "content": "B", "tokens_evaluated": 3},
                        {"index": 2, "content": "C", "tokens_evaluated": 4}]
    parts = worker.requests
    assert [(g.prompt, g.prompt_ids, g.prompt_parts) for g in parts] == [
        ("one", None, None), ("", [7, 8], None), ("", None, [9, "three"])]
    assert all(g.max_tokens == 4 for g in parts)


def test_a_refused_prompt_of_several_is_named_by_its_index() -> None:
    refused = FakeStream([[Rejected(status=400, param="prompt",
                                    message="The prompt holds token id 99999, outside this "
                                            "model's vocabulary of 100.")]])
    worker = FakeWorker(_part("A", 2), refused)
    client, _ = _client(worker)
    r = client.post("/completion", json={"prompt": ["ok", [99999]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt[1]"


def test_completions_json_schema_is_the_constraint() -> None:
    worker = FakeWorker(_middle())
    client, _ = _client(worker)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = client.post("/completion", json={"prompt": "x", "json_schema": schema,
                                         "n_predict": 4})
    assert r.status_code == 200
    constraint = worker.requests[0].constraint
    assert constraint.response_format == "json_schema" and constraint.json_schema == schema


def test_completion_streams_pieces_then_the_whole_object() -> None:
    worker = FakeWorker(_middle())
    client, _ = _client(worker)
    r = client.post("/completion", json={"prompt": "x", "stream": True,
                                         "response_fields": ["content"]})
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert "[DONE]" not in lines
    events = [json.loads(ln) for ln in lines]
    assert "".join(e["content"] for e in events[:-1]) == "\n    return 1"
    assert all(e["stop"] is False for e in events[:-1])
    assert events[-1] == {"content": ""}  # the fields asked for, of the whole object
    assert not worker.requests[0].echo_prompt  # no `prompt` asked: none sent back


def test_llama_servers_ranges_and_shapes_are_taken_as_it_takes_them() -> None:
    """Sliders past OpenAI's ranges are clamped as llama-server clamps them, a `stop` string
    is one stop, `n_indent` goes to the worker, `response_fields: []` is every field."""
    worker = FakeWorker(_middle())
    client, _ = _client(worker)
    r = client.post("/completion", json={
        "prompt": "x", "temperature": -1, "top_p": 0, "min_p": 2, "top_k": 0,
        "presence_penalty": 3, "frequency_penalty": -4, "stop": "\n", "n_indent": 2,
        "t_max_predict_ms": 500, "response_fields": []})
    assert r.status_code == 200 and r.json()["content"] == "\n    return 1"
    greq = worker.requests[0]
    assert (greq.temperature, greq.top_p, greq.min_p, greq.top_k, greq.presence_penalty,
            greq.frequency_penalty, greq.stop, greq.min_indent, greq.time_limit_s) == \
        (0.0, 0.0, 1.0, 0, 3, -4, ["\n"], 2, 0.5)  # top_k 0: off, not the model's
    assert worker.requests[0].time_limit_s == 0.5
    assert all(g.time_limit_s is None for g in worker.requests[1:])  # BODY's: absent


def test_many_stops_are_taken_as_llama_server_takes_them() -> None:
    """A group chat's stops past OpenAI's 8 (empty ones dropped); past 64 a 400."""
    worker = FakeWorker(_middle())
    client, _ = _client(worker)
    stops = [f"\n{name}:" for name in "ABCDEFGHIJKL"] + [""]
    assert client.post("/completion", json={"prompt": "x", "stop": stops}).status_code == 200
    assert worker.requests[0].stop == stops[:-1]
    r = client.post("/completion", json={"prompt": "x", "stop": ["s"] * 65})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt[1]"),
    ({"prompt": ["a", [1, "b", 2.5]]}, "prompt[1]"),
    ({"prompt": [1, [2]]}, "prompt"),
    ({"prompt": [True]}, "prompt[0]"),
    ({"prompt": {"text": "x"}}, "prompt"),
    ({"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}},
     "prompt.multimodal_data"),
    ({"prompt": ["x"] * 65}, "prompt"),
    ({"prompt": ["a", "b"], "stream": True}, "stream"),
    ({"prompt": "x", "grammar": "root ::= \"a\""}, "grammar"),
    ({"prompt": "x", "json_schema": []}, "json_schema"),
    ({"prompt": "x", "n_predict": "5"}, "n_predict"),
    ({"prompt": "x", "top_k": "a"}, "top_k"),
])
def test_bad_completion_input_is_a_400_naming_the_field(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/completion", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and worker.requests == []



def test_props_gives_the_context_slots_and_template() -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.get("/props")
    assert r.status_code == 200
    body = r.json()
    assert body["default_generation_settings"]["n_ctx"] == 2048 and body["model_alias"] == "m"
    assert body["modalities"] == {"vision": False, "video": False, "audio": False}
    assert client.get("/props", params={"model": "nope"}).status_code == 404


def test_models_lists_what_v1_models_lists() -> None:
    client, _ = _client(FakeWorker())
    r = client.get("/models")
    assert r.status_code == 200 and r.json() == client.get("/v1/models").json()
    assert [m["id"] for m in r.json()["data"]] == ["m"]


def _with_probs() -> FakeStream:
    lp = TokenLogprob(token="Pa", logprob=-0.1, bytes=[80, 97], top=[("Pa", -0.1, [80, 97]),
                                                                     ("Lo", -2.5, [76, 111])],
                      id=7, top_ids=[7, 9])
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=3)],
                       [Deltas(index=0, text="Pa", logprobs=[lp])],
                       [Finished(index=0, finish_reason="length", completion_tokens=1),
                        Usage(prompt_tokens=3, completion_tokens=1)]])


def test_n_probs_answers_llama_servers_completion_probabilities() -> None:
    worker = FakeWorker(_with_probs(), _with_probs())
    client, _ = _client(worker)
    r = client.post("/completion", json={"prompt": "x", "n_predict": 1, "n_probs": 2})
    greq = worker.requests[0]
    assert greq.logprobs and greq.top_logprobs == 2
    assert r.json()["completion_probabilities"] == [
        {"id": 7, "token": "Pa", "bytes": [80, 97], "logprob": -0.1, "top_logprobs": [
            {"id": 7, "token": "Pa", "bytes": [80, 97], "logprob": -0.1},
            {"id": 9, "token": "Lo", "bytes": [76, 111], "logprob": -2.5}]}]
    r = client.post("/completion", json={"prompt": "x", "n_predict": 1, "n_probs": 2,
                                         "stream": True})
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[0]["completion_probabilities"][0]["top_logprobs"][1]["token"] == "Lo"
    assert "completion_probabilities" not in events[-1]  # streamed with each piece
    bad = client.post("/completion", json={"prompt": "x", "n_probs": 101})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_probs"


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_bodies_are_4xx_in_openais_shape(kind: str) -> None:
    """tests/deployments/test_hostile_bodies.py's bodies on llama-server's routes (a model
    that is not served: a body that decodes is a 404, one that does not a 400)."""
    worker = FakeWorker()
    client, _ = _client(worker)
    for path in ("/completion", "/completions", "/infill"):
        r = client.post(path, content=HOSTILE[kind], headers={"content-type": "application/json"})
        assert r.status_code in (400, 404), (path, r.status_code, r.text[:300])
        assert r.json()["error"]["message"] and r.json()["error"]["type"]
    assert worker.requests == []


def test_logit_bias_in_llama_servers_forms_reaches_the_worker() -> None:
    """Found probing live: /completion ignored `logit_bias` in every form (SillyTavern's
    banned tokens among them)."""
    from deployments.llama_server.request import BANNED

    worker = FakeWorker(_middle(), _middle())
    client, _ = _client(worker)
    r = client.post("/completion", json={"prompt": "a", "logit_bias": [[28, 2.5], [7, False]]})
    assert r.status_code == 200 and worker.requests[0].logit_bias == {28: 2.5, 7: BANNED}
    r = client.post("/completion", json={"prompt": "a", "logit_bias": {"28": -1}})
    assert r.status_code == 200 and worker.requests[1].logit_bias == {28: -1.0}
    for bias, param in (([["Hello", 1]], "logit_bias[0]"), ([[1, "x"]], "logit_bias[0]"),
                        ([3], "logit_bias[0]"), ({"x": 1}, "logit_bias")):
        r = client.post("/completion", json={"prompt": "a", "logit_bias": bias})
        assert r.status_code == 400 and param in r.text, r.text
    assert len(worker.requests) == 2


def test_return_tokens_answers_the_ids_written_in_tokens() -> None:
    """`tokens` was always empty: return_tokens was not read. Now the worker is asked for
    the ids: the whole object lists them all, a stream each piece's (its last object none,
    as llama-server's)."""
    def ids_play() -> FakeStream:
        return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=3)],
                           [Deltas(index=0, text="Pa", tokens=1, ids=[7])],
                           [Deltas(index=0, text="", tokens=2, ids=[8]),
                            Deltas(index=0, text="ris", tokens=3, ids=[9])],
                           [Finished(index=0, finish_reason="length", completion_tokens=3),
                            Usage(prompt_tokens=3, completion_tokens=3)]])

    worker = FakeWorker(ids_play(), ids_play(), _middle())
    client, _ = _client(worker)
    body = {"prompt": "x", "n_predict": 3, "return_tokens": True}
    r = client.post("/completion", json=body)
    assert worker.requests[0].return_ids
    assert (r.json()["content"], r.json()["tokens"]) == ("Paris", [7, 8, 9])
    r = client.post("/completion", json={**body, "stream": True})
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert [e["tokens"] for e in events] == [[7], [8], [9], []]  # a held-back text too
    assert "".join(e["content"] for e in events) == "Paris"
    client.post("/infill", json={**BODY, "return_tokens": False})
    assert not worker.requests[2].return_ids


def test_slots_is_llama_servers_501_with_the_endpoint_off() -> None:
    """GET /slots was OpenAI's unknown-path 404: a client reading the context there (and
    falling back on llama-server's 501 not_supported_error) got neither."""
    client, _ = _client(FakeWorker())
    r = client.get("/slots")
    assert r.status_code == 501
    assert r.json()["error"]["code"] == 501
    assert r.json()["error"]["type"] == "not_supported_error"
    assert client.get("/props").json()["endpoint_slots"] is False
