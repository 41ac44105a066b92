"""The access log (deployments/access.py): one line per request, through the real app in
front of a fake worker (tests/deployments/test_ingress.py's), written to stderr."""

from __future__ import annotations

import asyncio

import pytest

from deployments.access import AccessLog, access_line
from tests.deployments.test_ingress import CHAT, FakeStream, FakeWorker, _client, _reply


def _lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[flm] ")]


def test_access_line_names_request_status_model_tokens_and_times() -> None:
    line = access_line(at=0.0, method="POST", path="/v1/chat/completions", status=200,
                       seconds=1.4021, model="m", prompt_tokens=36, output_tokens=21,
                       first_token_s=0.12)
    fields = line.split(" | ")
    assert fields[0].startswith("[flm] ") and fields[1:] == [
        "200", "  1.402 s", "POST /v1/chat/completions", "m", "36 in, 21 out",
        "first token 0.120 s"]
    assert access_line(at=0.0, method="GET", path="/v1/models", status=200,
                       seconds=0.003).split(" | ")[1:] == ["200", "  0.003 s", "GET /v1/models"]


def test_each_request_gets_one_line_streamed_or_not(capsys) -> None:
    client, _ = _client(FakeWorker(FakeStream(_reply()), FakeStream(_reply())))
    capsys.readouterr()
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert client.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/nothing").status_code == 404
    lines = _lines(capsys)
    assert len(lines) == 4, lines
    for line in lines[:2]:
        assert " | 200 | " in line and " | POST /v1/chat/completions | m | 3 in, 1 out | " in line
        assert "first token " in line and "went away" not in line
    assert lines[2].endswith(" | GET /v1/models")
    assert " | 404 | " in lines[3] and lines[3].endswith(" | GET /v1/nothing")


def test_a_rejected_request_is_logged_with_its_status(capsys) -> None:
    client, _ = _client(FakeWorker())
    capsys.readouterr()
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": "no"})
    assert r.status_code == 400
    (line,) = _lines(capsys)
    assert " | 400 | " in line and "POST /v1/chat/completions" in line


@pytest.mark.timeout(10)
def test_a_request_whose_client_goes_away_still_gets_its_line() -> None:
    written: list[str] = []

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        raise asyncio.CancelledError  # the client went away mid-stream

    async def send(message) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/api/chat"}
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(AccessLog(app, write=written.append)(scope, None, send))
    (line,) = written
    assert " | 200 | " in line and line.endswith(" | POST /api/chat | client went away")


@pytest.mark.timeout(10)
def test_a_client_gone_before_any_answer_is_logged_499_not_500() -> None:
    """A non-streamed request whose client left while it was generating: nothing was sent."""
    written: list[str] = []

    async def app(scope, receive, send) -> None:
        raise asyncio.CancelledError  # Serve cancels the handler: the client went away

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(AccessLog(app, write=written.append)(scope, None, None))
    (line,) = written
    assert " | 499 | " in line and line.endswith(" | client went away")
