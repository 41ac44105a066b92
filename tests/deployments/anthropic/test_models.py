"""Anthropic's Models API without Ray, as the official SDK sees it: `models.list()` pages
(ModelInfo with `type`, `display_name`, an RFC 3339 `created_at`; `has_more`, `first_id`,
`last_id`; auto-paging by `after_id`), `models.retrieve()`, and an unknown model as
Anthropic's not_found_error. The handlers are mounted here as the listing's route mounts
them for a client that sends `anthropic-version`."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from fastapi import FastAPI, Request
from starlette.testclient import TestClient

from deployments.anthropic.models import get_model, list_models, models_page, wants_anthropic
from deployments.errors import ApiError
from deployments.ingress import Ingress, current
from deployments.server import make_app
from tests.deployments.anthropic.support import sdk_for
from tests.deployments.test_ingress import FakeWorker


def _app(ingress: Ingress) -> TestClient:
    """The two routes, answering Anthropic's shape to a client that sends its header."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models(request: Request):
        assert wants_anthropic(request)
        return await list_models(request, ingress)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        return await get_model(model_id, request, ingress)

    return TestClient(app)


def _ingress(*names: str, **settings: object) -> Ingress:
    return Ingress({n: FakeWorker() for n in names}, dict(settings))


def test_the_sdk_lists_and_retrieves_models() -> None:
    ac = sdk_for(_app(_ingress("m", "n", "o")))
    page = ac.models.list()
    assert [m.id for m in page.data] == ["m", "n", "o"]
    assert (page.has_more, page.first_id, page.last_id) == (False, "m", "o")
    info = page.data[0]
    assert (info.type, info.display_name, info.max_input_tokens) == ("model", "m", 2048)
    assert info.created_at == datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone.utc)
    assert page._request_id.startswith("req_")
    assert [m.id for m in ac.models.list(limit=1)] == ["m", "n", "o"]  # page by page
    assert ac.models.retrieve("n").id == "n"


def test_an_unknown_model_is_anthropics_not_found_error() -> None:
    anthropic = pytest.importorskip("anthropic")
    ac = sdk_for(_app(_ingress("m")))
    with pytest.raises(anthropic.NotFoundError) as err:
        ac.models.retrieve("nope")
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "not_found_error"
    assert err.value.body["request_id"] == err.value.request_id
    with pytest.raises(anthropic.BadRequestError) as err:
        ac.models.list(limit=0)
    assert err.value.body["error"]["message"].startswith("'limit' is '0'")


def test_the_api_key_is_asked_for() -> None:
    client = _app(_ingress("m", api_key="k"))
    r = client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = client.get("/v1/models", headers={"anthropic-version": "2023-06-01",
                                          "x-api-key": "k"})
    assert r.status_code == 200 and r.headers["request-id"].startswith("req_")


INFOS = {n: {"created": 0, "context_length": 8} for n in "abcde"}


@pytest.mark.parametrize("kw,ids,has_more", [
    ({}, "abcde", False),
    ({"limit": 2}, "ab", True),
    ({"limit": 2, "after_id": "b"}, "cd", True),
    ({"limit": 2, "after_id": "c"}, "de", False),
    ({"after_id": "e"}, "", False),
    ({"limit": 2, "before_id": "d"}, "bc", True),
    ({"limit": 2, "before_id": "c"}, "ab", False),
    ({"before_id": "a"}, "", False),
])
def test_pages_go_either_way(kw: dict, ids: str, has_more: bool) -> None:
    page = models_page(INFOS, **kw)
    assert [m["id"] for m in page["data"]] == list(ids)
    assert page["has_more"] is has_more
    assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
    if ids:
        assert page["data"][0]["created_at"] == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize("kw,param", [({"after_id": "z"}, "after_id"),
                                      ({"after_id": "a", "before_id": "b"}, "before_id")])
def test_bad_cursors_are_400s_naming_them(kw: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        models_page(INFOS, **kw)
    assert err.value.status == 400 and err.value.param == param


def test_the_app_answers_anthropics_shape_to_anthropics_clients() -> None:
    app = make_app()
    ingress = _ingress("m")
    app.dependency_overrides[current] = lambda: ingress
    client = TestClient(app)
    assert client.get("/v1/models").json()["object"] == "list"  # OpenAI's clients
    assert sdk_for(client).models.list().data[0].type == "model"
