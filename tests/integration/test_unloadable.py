"""A model that cannot load (the secured app's UNLOADABLE, an architecture the engine does
not run): it is listed as unavailable with the reason, every request for it gets that
reason in the API's error shape (not "retry shortly"), and its replica is not restarted
over and over; the app's other model serves on."""

from __future__ import annotations

import pytest

from tests.integration.conftest import SECRET, UNLOADABLE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AUTH = {"Authorization": f"Bearer {SECRET}"}
ASK = {"model": UNLOADABLE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _says_why(message: str) -> None:
    assert f"'{UNLOADABLE}'" in message and "unloadable" in message  # its name and path
    assert "FooForCausalLM" in message and "not supported" in message  # the reason
    assert "retry" not in message


def test_unloadable_model_is_listed_as_unavailable_with_the_reason(client) -> None:
    cards = {m["id"]: m for m in client.get("/secured/v1/models", headers=AUTH).json()["data"]}
    assert cards[UNLOADABLE]["status"] == "unavailable"
    _says_why(cards[UNLOADABLE]["error"])
    assert "status" not in cards["flm-tiny"]


@pytest.mark.parametrize("stream", [False, True])
def test_request_for_unloadable_model_gets_the_reason(client, stream) -> None:
    r = client.post("/secured/v1/chat/completions", json={**ASK, "stream": stream},
                    headers=AUTH)
    assert r.status_code == 500 and "retry-after" not in r.headers
    error = r.json()["error"]
    assert error["code"] == "model_unavailable" and error["param"] == "model"
    _says_why(error["message"])


def test_unloadable_model_in_ollamas_and_anthropics_shape(client) -> None:
    r = client.post("/secured/api/chat", json={**ASK, "stream": False}, headers=AUTH)
    assert r.status_code == 500
    _says_why(r.json()["error"])
    r = client.post("/secured/api/show", json={"model": UNLOADABLE}, headers=AUTH)
    assert r.status_code == 500
    _says_why(r.json()["error"])
    r = client.post("/secured/v1/messages", json=ASK, headers=AUTH)
    assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
    _says_why(r.json()["error"]["message"])


def test_unloadable_models_replica_stays_up_and_the_other_model_serves(client) -> None:
    from ray import serve

    app = serve.status().applications["secured"]
    assert app.status == "RUNNING"
    assert app.deployments[f"worker-{UNLOADABLE}"].status == "HEALTHY"
    first = client.get("/secured/v1/models", headers=AUTH).json()["data"]
    r = client.post("/secured/v1/chat/completions", json={**ASK, "model": "flm-tiny"},
                    headers=AUTH)
    assert r.status_code == 200
    again = client.get("/secured/v1/models", headers=AUTH).json()["data"]
    assert [m["created"] for m in again] == [m["created"] for m in first]  # not restarted
