"""The tokenize routes' requests and replies without Ray: the real app in front of an
Ingress whose worker is the fake of tests/deployments/test_ingress.py. Each body's shape
(llama-server's `content`, vLLM's `prompt` or `messages`) becomes one typed Tokenize with
the API's defaults; each answer has that API's shape; bad input is a 400 (an unknown model
a 404) in llama-server's error shape (the status as a number in `code`, as vLLM's body has it
too) naming the field, before any worker is asked."""

from __future__ import annotations

import pytest

from actors.events import Accepted, Failed, Rejected
from actors.tokenize import Detokenize, Text, Tokenize, Tokens
from tests.deployments.test_hostile_bodies import HOSTILE
from tests.deployments.test_ingress import BackPressureError, FakeStream, FakeWorker, _client

IDS = [5, 6, 7]
# "Hi", then a token holding half of "é" (0xC3 0xA9) and one holding the other half
PIECES = [b"Hi", b"\xc3", b"\xa9"]


def _tokens(pieces: bool = False, spellings: bool = False) -> FakeStream:
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=3),
                        Tokens(ids=IDS, context_length=2048,
                               pieces=PIECES if pieces else None,
                               spellings=["Hi", "Ġ", "Ã"] if spellings else None)]])


def _text(text: str = "Hi there") -> FakeStream:
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=3),
                        Text(text=text)]])


def _error(r, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["code"] == status
    return err


def test_llama_servers_shape_with_its_defaults_and_its_pieces() -> None:
    worker = FakeWorker(_tokens(), _tokens(pieces=True))
    client, _ = _client(worker)
    r = client.post("/tokenize", json={"content": "Hi é"})
    assert r.status_code == 200 and r.json() == {"tokens": IDS}
    r = client.post("/tokenize", json={"content": "Hi é", "add_special": True,
                                       "with_pieces": True, "parse_special": True})
    # a piece is its text, or its bytes where they are not whole UTF-8 (as llama-server's)
    assert r.json() == {"tokens": [{"id": 5, "piece": "Hi"}, {"id": 6, "piece": [0xC3]},
                                   {"id": 7, "piece": [0xA9]}]}
    first, second = worker.requests
    assert isinstance(first, Tokenize) and first.text == "Hi é" and first.chat is None
    assert not first.add_special and not first.pieces
    assert second.add_special and second.pieces


def test_llama_servers_mixed_content_and_parse_special_reach_the_worker() -> None:
    """`content` as strings and ids in one list (llama-server's `tokenize_mixed`), and
    `parse_special: false` (special-token text read as text): typed, not refused."""
    worker = FakeWorker(_tokens(), _tokens())
    client, _ = _client(worker)
    r = client.post("/tokenize", json={"content": [7, "Hi", 8], "add_special": True})
    assert r.status_code == 200 and r.json() == {"tokens": IDS}
    r = client.post("/tokenize", json={"content": "<|im_end|>", "parse_special": False})
    assert r.status_code == 200
    mixed, plain = worker.requests
    assert mixed.parts == [7, "Hi", 8] and mixed.add_special and mixed.parse_special
    assert plain.parts is None and plain.text == "<|im_end|>" and not plain.parse_special


def test_apply_template_renders_the_chat_as_chat_completions_types_it() -> None:
    """llama-server's /apply-template: the conversation typed as for /tokenize's messages,
    answered as its rendered prompt; a last assistant message with text is continued (as
    llama-server prefills it), so no generation prompt follows it."""
    rendered = FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=0),
                            Text(text="<|im_start|>user\nHi<|im_end|>\n")]])
    worker = FakeWorker(rendered, _text("p"), _text("p"))
    client, _ = _client(worker)
    r = client.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}],
                                             "add_generation_prompt": False})
    assert r.status_code == 200 and r.json() == {"prompt": "<|im_start|>user\nHi<|im_end|>\n"}
    job = worker.requests[0]
    assert job.rendered and job.chat is not None and not job.add_generation_prompt
    assert not job.chat.continue_final
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure,"}]
    for extra in ({}, {"add_generation_prompt": True}):
        r = client.post("/apply-template", json={"messages": prefill, **extra})
        assert r.status_code == 200 and r.json() == {"prompt": "p"}
    assert all(j.chat.continue_final and j.rendered for j in worker.requests[1:])
    for body, param in (({}, "messages"), ({"messages": []}, "messages"),
                        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]")):
        _error(client.post("/apply-template", json=body), 400, param)
    assert len(worker.requests) == 3


def test_vllms_prompt_shape_with_its_defaults_and_token_strs() -> None:
    worker = FakeWorker(_tokens(), _tokens(spellings=True))
    client, _ = _client(worker)
    r = client.post("/tokenize", json={"model": "m", "prompt": "Hi é"})
    assert r.json() == {"count": 3, "max_model_len": 2048, "tokens": IDS, "token_strs": None}
    r = client.post("/v1/tokenize", json={"model": "m", "prompt": "Hi é",
                                          "add_special_tokens": False,
                                          "return_token_strs": True})
    assert r.json()["token_strs"] == ["Hi", "Ġ", "Ã"]  # the vocabulary's spellings
    first, second = worker.requests
    assert first.add_special and not first.spellings  # vLLM's default: specials added
    assert not second.add_special and second.spellings and not second.pieces


def test_vllms_messages_are_typed_as_chat_completions_types_them() -> None:
    worker = FakeWorker(_tokens(), _tokens())
    client, _ = _client(worker)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "developer", "content": "Be brief."},
                                       {"role": "user", "content": "Hi"}],
            "tools": [tool], "chat_template_kwargs": {"enable_thinking": False}}
    r = client.post("/tokenize", json=body)
    assert r.status_code == 200 and r.json()["count"] == 3
    job = worker.requests[0]
    assert job.add_generation_prompt and job.chat is not None and not job.add_special
    assert job.chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert job.chat.tools == [tool] and [t.name for t in job.chat.constraint.all_tools] == ["f"]
    assert job.chat.thinking is False
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure"}]
    client.post("/tokenize", json={"messages": prefill, "continue_final_message": True})
    job = worker.requests[1]
    assert job.chat.continue_final


def test_model_is_optional_only_where_the_server_has_one() -> None:
    worker = FakeWorker(_tokens())
    client, ingress = _client(worker)
    assert client.post("/tokenize", json={"content": "x"}).status_code == 200
    ingress.streams["other"] = worker  # two served models: the request must name one
    _error(client.post("/tokenize", json={"content": "x"}), 400, "model")
    _error(client.post("/detokenize", json={"tokens": [1]}), 400, "model")
    err = _error(client.post("/tokenize", json={"model": "nope", "content": "x"}), 404, "model")
    assert err["type"] == "not_found_error"
    assert len(worker.requests) == 1


@pytest.mark.parametrize("body,param", [
    ({"content": "x", "messages": [{"role": "user", "content": "x"}]}, "messages"),
    ({"content": "x", "prompt": "y"}, "prompt"),
    ({"add_special": True}, "content"),
    ({"content": None}, "content"),
    ({"content": 5}, "content"),
    ({"content": "x", "add_special": "yes"}, "add_special"),
    ({"content": "x", "parse_special": "no"}, "parse_special"),
    ({"content": [1, "a", 2.5]}, "content[2]"),
    ({"content": [1, -2]}, "content"),
    ({"content": "x", "model": 3}, "model"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True,
      "continue_final_message": True}, "add_generation_prompt"),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
     "continue_final_message"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ x }}"},
     "chat_template"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "f"}, "tools"),
])
def test_bad_tokenize_bodies_are_400s_naming_the_field(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    _error(client.post("/tokenize", json=body), 400, param)
    assert worker.requests == []


@pytest.mark.parametrize("content, named", [(b"[1, 2]", "got `array`"), (b"not json", ""),
                                            (b'"text"', "got `str`"), (b"null", "got `null`")])
def test_a_body_that_is_not_an_object_is_a_400(content: bytes, named: str) -> None:
    """In JSON's words, as the other routes say it (not Python's `list` or `NoneType`)."""
    client, _ = _client(FakeWorker())
    for path in ("/tokenize", "/detokenize"):
        r = client.post(path, content=content)
        assert r.status_code == 400 and named in r.json()["error"]["message"]


def test_detokenize_answers_both_apis_names_for_the_text() -> None:
    worker = FakeWorker(_text(), _text("é"))
    client, _ = _client(worker)
    r = client.post("/detokenize", json={"tokens": [1, 2, 3]})
    assert r.status_code == 200 and r.json() == {"content": "Hi there", "prompt": "Hi there"}
    r = client.post("/v1/detokenize", json={"model": "m", "tokens": [4]})
    assert r.json()["prompt"] == "é"
    assert [type(j) for j in worker.requests] == [Detokenize, Detokenize]
    assert worker.requests[0].tokens == [1, 2, 3]


@pytest.mark.parametrize("tokens,param", [
    ([1, "2"], "tokens[1]"), ([1, 2.5], "tokens[1]"), ([True], "tokens[0]"), ("12", "tokens"),
    (None, "tokens"),
])
def test_bad_detokenize_bodies_are_400s_naming_the_field(tokens, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    _error(client.post("/detokenize", json={"tokens": tokens}), 400, param)
    _error(client.post("/detokenize", json={}), 400, "tokens")
    assert worker.requests == []


def test_the_workers_refusal_and_failure_keep_their_shape() -> None:
    refused = FakeStream([[Rejected(status=400, param="tokens[1]",
                                    message="Token id 99999 is outside this model's "
                                            "vocabulary: ids run from 0 to 1919.")]])
    failed = FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=0),
                          Failed(message="The model worker failed.")]])
    empty = FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=0)]])
    worker = FakeWorker(refused, failed, empty)
    client, _ = _client(worker)
    err = _error(client.post("/detokenize", json={"tokens": [1, 99999]}), 400, "tokens[1]")
    assert "99999" in err["message"] and err["type"] == "invalid_request_error"
    assert _error(client.post("/tokenize", json={"content": "x"}), 503, None)["type"] == \
        "unavailable_error"
    _error(client.post("/tokenize", json={"content": "x"}), 503, None)


def test_a_busy_server_is_a_503_with_retry_after() -> None:
    client, _ = _client(FakeWorker(FakeStream([], fail={0: BackPressureError()})))
    r = client.post("/tokenize", json={"content": "x"})
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["error"] == {"code": 503, "message": "The server is busy; retry shortly.",
                                 "type": "unavailable_error", "param": None}


def test_other_methods_are_405s_in_openais_shape() -> None:
    client, _ = _client(FakeWorker())
    r = client.get("/tokenize")
    assert r.status_code == 405 and r.json()["error"]["message"]


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_bodies_are_4xx_in_openais_shape(kind: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    for path in ("/tokenize", "/detokenize", "/apply-template"):
        r = client.post(path, content=HOSTILE[kind], headers={"content-type": "application/json"})
        assert r.status_code in (400, 404), (path, r.status_code, r.text[:300])
        assert r.json()["error"]["message"] and r.json()["error"]["type"]
    assert worker.requests == []
