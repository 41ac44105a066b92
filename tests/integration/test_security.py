"""The optional API key and CORS origins from the app config."""

from __future__ import annotations

import pytest

from tests.integration.conftest import SECRET

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
BODY = {"model": "flm-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_api_key_is_required(client) -> None:
    r = client.post("/secured/v1/chat/completions", json=BODY)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = client.post("/secured/v1/chat/completions", json=BODY,
                    headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = client.post("/secured/v1/chat/completions", json=BODY,
                    headers={"Authorization": f"Bearer {SECRET}"})
    assert r.status_code == 200
    assert client.get("/secured/v1/models").status_code == 401


def test_cors_origin_is_allowed(client) -> None:
    r = client.options("/secured/v1/chat/completions", headers={
        "Origin": "http://example.test", "Access-Control-Request-Method": "POST"})
    assert r.headers.get("access-control-allow-origin") == "http://example.test"
    r = client.options("/secured/v1/chat/completions", headers={
        "Origin": "http://elsewhere.test", "Access-Control-Request-Method": "POST"})
    assert r.headers.get("access-control-allow-origin") is None
