"""The chat page's routes (deployments/page/routes.py) on the real app, without Ray: a
browser gets the page at `/`, an Ollama client still gets "Ollama is running", the page's
files come with their types and a policy that runs only them."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from deployments.server import make_app

BROWSER = {"accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@pytest.fixture(scope="module")
def http() -> TestClient:
    return TestClient(make_app())


def test_browser_gets_the_page_at_the_root(http) -> None:
    r = http.get("/", headers=BROWSER)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<base href="/">' in r.text and 'src="page/page.js"' in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    # its icon is inline (an image the policy allows): no /favicon.ico 404 on every load
    assert '<link rel="icon" href="data:,">' in r.text
    assert "img-src 'self' data:" in r.headers["content-security-policy"]


@pytest.mark.parametrize("headers", [{}, {"accept": "*/*"}, {"accept": "application/json"}])
def test_other_clients_get_ollamas_answer_at_the_root(http, headers) -> None:
    r = http.get("/", headers=headers)
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert http.head("/", headers=headers).status_code == 200


def test_page_under_a_route_prefix_sends_its_requests_there() -> None:
    r = TestClient(make_app(), root_path="/secured").get("/", headers=BROWSER)
    assert '<base href="/secured/">' in r.text


@pytest.mark.parametrize("name, media", [("page.js", "text/javascript"),
                                         ("page.css", "text/css")])
def test_page_files_come_with_their_types(http, name, media) -> None:
    r = http.get(f"/page/{name}")
    assert r.status_code == 200 and r.headers["content-type"].startswith(media)
    assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("name", ["index.html", "..%2Froutes.py", "nothing.js"])
def test_only_the_pages_files_are_served(http, name) -> None:
    r = http.get(f"/page/{name}")
    assert r.status_code == 404 and "Unknown path" in r.json()["error"]["message"]


def test_page_fetches_nothing_from_elsewhere(http) -> None:
    # offline: no URL with a scheme or a protocol-relative one in what the page loads
    for text in (http.get("/", headers=BROWSER).text, http.get("/page/page.js").text,
                 http.get("/page/page.css").text):
        assert not re.search(r"""(https?:)?//[\w.-]+\.\w""", text)


def test_page_never_parses_model_output_as_html(http) -> None:
    script = http.get("/page/page.js").text
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(",
                         script)
