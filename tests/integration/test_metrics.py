"""GET /metrics: Prometheus text, parsed with prometheus_client, whose series move with the
requests the server answers (ingress figures at once, worker figures within a health
check period)."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import SECRET

parser = pytest.importorskip("prometheus_client.parser")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHAT = {"model": "flm-tiny", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5, "seed": 1, "ignore_eos": True}


def _scrape(client, prefix: str = "") -> dict[tuple, float]:
    r = client.get(prefix + "/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in parser.text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def _until(client, check, timeout: float = 30.0) -> dict:
    """Scrape until `check(samples)` holds (worker figures arrive with health checks)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = _scrape(client)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def test_request_counters_and_histograms_move(client) -> None:
    before = _scrape(client)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        r.read()
    assert client.post("/v1/chat/completions", json={**CHAT, "temperature": 9}) \
        .status_code == 400
    assert client.post("/api/generate", json={"model": "flm-tiny", "prompt": "hi",
                                              "stream": False,
                                              "options": {"num_predict": 3}}).status_code == 200
    after = _scrape(client)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    route = {"route": "/v1/chat/completions"}
    assert moved("flm_requests_total", status="200", **route) == 2
    assert moved("flm_requests_total", status="400", **route) == 1
    assert moved("flm_requests_total", route="/api/generate", status="200") == 1
    assert moved("flm_request_duration_seconds_count", **route) == 3
    assert moved("flm_time_to_first_token_seconds_count", model="flm-tiny") == 3
    assert moved("flm_time_per_output_token_seconds_count", model="flm-tiny") == 3
    assert moved("flm_generation_tokens_total", model="flm-tiny") == 13
    assert moved("flm_prompt_tokens_total", model="flm-tiny") > 0
    # every metric is listed, with its kind, even before it has a series
    text = client.get("/metrics").text
    for name, kind in (("flm_cached_prompt_tokens_total", "counter"),
                       ("flm_constraint_giveups_total", "counter"),
                       ("flm_running_sequences", "gauge"),
                       ("flm_grammar_compile_seconds", "histogram")):
        assert f"# TYPE {name} {kind}" in text


def test_worker_figures_arrive_with_health_checks(client) -> None:
    def compiles(samples: dict) -> float:
        return _value(samples, "flm_grammar_compiles_total", model="flm-tiny")

    before = compiles(_scrape(client))
    body = {**CHAT, "response_format": {"type": "json_object"}}
    for _ in range(2):  # a cold compile, then the cache (on one replica or both)
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    after = _until(client, lambda s: compiles(s) >= before + 2)
    assert compiles(after) >= before + 2
    # each flm-tiny worker replica reports its own gauges (a replica another test replaced
    # stays listed until it has missed three health checks)
    replicas = {dict(ls)["replica"] for (n, ls) in after
                if n == "flm_kv_cache_blocks" and dict(ls).get("model") == "flm-tiny"}
    assert len(replicas) >= 2


def test_a_client_that_leaves_is_counted(client) -> None:
    def gone(samples: dict) -> float:
        return _value(samples, "flm_client_disconnects_total", route="/v1/chat/completions")

    before = gone(_scrape(client))
    with client.stream("POST", "/v1/chat/completions",
                       json={**CHAT, "max_tokens": 2000, "stream": True}) as r:
        next(r.iter_lines())
    after = _until(client, lambda s: gone(s) >= before + 1)
    assert gone(after) == before + 1


def test_metrics_are_behind_the_api_key(client) -> None:
    assert client.get("/secured/metrics").status_code == 401
    r = client.get("/secured/metrics", headers={"Authorization": f"Bearer {SECRET}"})
    assert r.status_code == 200 and "flm_requests_total" in r.text
