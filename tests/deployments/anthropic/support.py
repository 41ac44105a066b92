"""The official anthropic SDK in front of a test server without sockets: `sdk(answer)` over
a function answering its requests, `sdk_for(client)` over an app's TestClient (the SDK
speaks httpx2, the TestClient httpx: each request is handed across). A test that uses
them is skipped where the SDK is not installed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def sdk(answer: Callable[[Any], Any]) -> Any:
    """An anthropic client whose requests `answer(request) -> httpx2.Response` answers."""
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")
    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    return anthropic.Anthropic(base_url="http://testserver", api_key="k", max_retries=0,
                               http_client=http)


def response(status: int, **kw: Any) -> Any:
    """An httpx2.Response (the SDK's HTTP library)."""
    return pytest.importorskip("httpx2").Response(status, **kw)


def sdk_for(client: Any) -> Any:
    """An anthropic client of the app behind starlette's TestClient `client` (bodies
    whole)."""
    def answer(request: Any) -> Any:
        r = client.request(request.method, str(request.url), headers=dict(request.headers),
                           content=request.read())
        return response(r.status_code, headers=list(r.headers.multi_items()),
                        content=r.content)

    return sdk(answer)
