"""Bodies no client should send, on every route that reads one (the real app in front of the
fake worker of test_ingress.py, no Ray): each is a 4xx in its API's own error shape, never a
500, and never reaches the worker. Found by fuzzing a served model: JSON nested thousands deep
(the decoder's recursion limit), and numbers past float's or int's range in fields no schema
names (OpenAI's routes decoded the body again for the raw request, unchecked); a keep_alive
past float's range."""

from __future__ import annotations

import pytest

from tests.deployments.test_ingress import FakeStream, FakeWorker, _client, _reply

OPENAI = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
OLLAMA = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show",
          "/api/pull", "/api/copy", "/api/create")
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")

# a body every route would take, but for the field under test and a model that is not
# served: a body that decodes is a 404 (the model), one that does not a 400
FIELDS = {"model": "nope", "messages": [{"role": "user", "content": "Hi"}], "prompt": "Hi",
          "input": "Hi", "max_tokens": 4}
DEEP = 3000


def _body(extra: str) -> bytes:
    head = ", ".join(f'"{k}": {v!r}' if isinstance(v, int) else
                     f'"{k}": "{v}"' if isinstance(v, str) else
                     f'"{k}": [{{"role": "user", "content": "Hi"}}]' for k, v in FIELDS.items())
    return f"{{{head}, {extra}}}".encode()


HOSTILE = {
    "nested object": b'{"a": ' * DEEP + b"1" + b"}" * DEEP,
    # deep enough that Ray could not pickle it to a worker (a JSON schema 300 properties
    # deep), not so deep that the decoder refuses it
    "nested schema": _body('"response_format": {"type": "json_schema", "json_schema": '
                           '{"name": "x", "schema": ' + '{"type": "object", "properties": '
                           '{"a": ' * 300 + "{}" + "}}" * 300 + "}}"),
    "nested array in a field": _body('"x": ' + "[" * DEEP + "]" * DEEP),
    "float past its range": _body('"logit_bias": 1e309'),
    "negative float past its range": _body('"metadata": {"k": -1e309}'),
    "integer of 5,001 digits": _body('"foo": 1' + "0" * 5000),
}


def _shape(path: str, body: dict) -> str:
    if path in ANTHROPIC:
        assert body["type"] == "error" and body["error"]["message"]
    elif path in OLLAMA:
        assert isinstance(body["error"], str) and body["error"]
    else:
        assert body["error"]["message"] and body["error"]["type"]
    return path


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_bodies_are_4xx_in_each_apis_shape(kind: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    nested = kind.startswith("nested")
    for path in (*OPENAI, *OLLAMA, *ANTHROPIC):
        r = client.post(path, content=HOSTILE[kind], headers={"content-type": "application/json"})
        assert r.status_code in ((400,) if nested else (400, 404)), (path, r.status_code, r.text)
        _shape(path, r.json())
    r = client.request("DELETE", "/api/delete", content=HOSTILE[kind])
    assert 400 <= r.status_code < 500, r.text[:300]
    assert worker.requests == []


def test_a_number_past_its_range_is_named_where_a_route_reads_every_field() -> None:
    client, _ = _client(FakeWorker())
    r = client.post("/v1/chat/completions", content=_body('"metadata": {"k": 1e309}'))
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "metadata"
    big = "1" + "0" * 5000
    body = _body('"x": 1').replace(b'"content": "Hi"}', b'"content": "Hi", "y": %s}'
                                   % big.encode())
    r = client.post("/v1/chat/completions", content=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0]"


def test_a_keep_alive_past_floats_range_keeps_the_model_loaded() -> None:
    worker = FakeWorker(FakeStream(_reply()))
    client, _ = _client(worker)
    body = _body('"stream": false, "keep_alive": 1' + "0" * 400).replace(b'"nope"', b'"m"')
    r = client.post("/api/generate", content=body)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["response"] == "Hello"


def test_a_bug_behind_a_route_that_does_not_generate_is_an_error_body_of_its_api(
        monkeypatch) -> None:
    client, ingress = _client(FakeWorker())

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ingress, "info", broken)
    r = client.post("/api/show", json={"model": "m"})
    assert r.status_code == 500 and r.json() == {"error": "Internal error."}
    r = client.get("/v1/models/m")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_nesting_up_to_the_limit_is_taken_and_brackets_in_strings_do_not_count() -> None:
    from deployments.body import MAX_NESTING, nesting

    client, _ = _client(FakeWorker())
    deep = '"tools": ' + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)
    r = client.post("/v1/chat/completions", content=_body(deep))
    assert r.status_code == 404  # decoded: the model is what is wrong
    r = client.post("/v1/chat/completions", content=_body(deep.replace("[", "[[", 1)
                                                          .replace("]", "]]", 1)))
    assert r.status_code == 400 and f"more than {MAX_NESTING} levels" in r.json()["error"][
        "message"]
    text = '"x": "' + "[{" * 500 + '\\"' + "{" * 500 + '"'
    assert nesting(_body(text)) == 3  # the body, its messages, a message


def test_the_nesting_scan_is_linear_in_an_unclosed_string() -> None:
    """A string left open, made of escaped quotes, made the scan start again at each quote:
    a 150 KB body held the event loop (every route) for 70 s. Now it is one pass: this
    400 KB body is scanned in milliseconds (the bound is a thousand times that)."""
    import time

    from deployments.body import nesting

    body = b"[" * 200 + b'"' + b'\\"' * 200_000
    start = time.perf_counter()
    assert nesting(body) == 200 and nesting(body + b"\\") == 200
    assert time.perf_counter() - start < 2.0
