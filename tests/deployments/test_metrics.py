"""Metrics without Ray: snapshots of several replicas added up into Prometheus text, and
what the ingress records about one request."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.events import Deltas, Finished, Usage
from actors.metrics import SPECS, Metrics
from deployments.metrics import RequestTrace, render


def _samples(text: bytes) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


def test_replicas_add_up() -> None:
    a, b = Metrics(), Metrics()
    a.inc("flm_requests_total", "/v1/chat/completions", "200")
    b.inc("flm_requests_total", "/v1/chat/completions", "200", value=2)
    a.set("flm_running_sequences", "m", "r1", value=3)
    b.set("flm_running_sequences", "m", "r2", value=1)
    for v in (0.004, 0.3, 100.0):
        a.observe("flm_request_duration_seconds", "/api/chat", value=v)
    b.observe("flm_request_duration_seconds", "/api/chat", value=0.3)
    s = _samples(render([a.snapshot(), b.snapshot()]))
    assert s[("flm_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))] == 3
    assert s[("flm_running_sequences", (("model", "m"), ("replica", "r1")))] == 3
    assert s[("flm_running_sequences", (("model", "m"), ("replica", "r2")))] == 1
    hist = {dict(ls).get("le"): v for (n, ls), v in s.items()
            if n == "flm_request_duration_seconds_bucket"}
    assert hist["0.005"] == 1 and hist["0.25"] == 1 and hist["0.5"] == 3  # cumulative
    assert hist["60.0"] == 3 and hist["+Inf"] == 4
    assert s[("flm_request_duration_seconds_count", (("route", "/api/chat"),))] == 4
    assert s[("flm_request_duration_seconds_sum", (("route", "/api/chat"),))] == \
        pytest.approx(100.604)


def test_every_metric_is_declared_even_without_series() -> None:
    text = render([]).decode()
    for name, spec in SPECS.items():
        assert f"# TYPE {name} {spec.kind}" in text


def test_an_unknown_metric_is_a_bug() -> None:
    with pytest.raises(KeyError):
        Metrics().inc("flm_nope_total")


def test_a_request_trace() -> None:
    m = Metrics()
    trace = RequestTrace(m, "/v1/completions")
    trace.model = "m"
    trace.saw([Deltas(index=0, text="a")])
    trace.saw([Deltas(index=0, text="b"), Finished(index=0, finish_reason="stop",
                                                   completion_tokens=4),
               Usage(prompt_tokens=7, completion_tokens=4)])
    trace.answered(200, streaming=True)
    trace.ended(disconnected=True)
    trace.ended()  # once only
    s = _samples(render([m.snapshot()]))
    assert s[("flm_requests_total", (("route", "/v1/completions"), ("status", "200")))] == 1
    assert s[("flm_client_disconnects_total", (("route", "/v1/completions"),))] == 1
    assert s[("flm_prompt_tokens_total", (("model", "m"),))] == 7
    assert s[("flm_generation_tokens_total", (("model", "m"),))] == 4
    assert s[("flm_time_per_output_token_seconds_count", (("model", "m"),))] == 1
    assert s[("flm_request_duration_seconds_count", (("route", "/v1/completions"),))] == 1


def test_the_hub_keeps_the_counters_of_a_replica_gone(monkeypatch) -> None:
    import asyncio

    from deployments import metrics as hub_module

    hub = hub_module.MetricsHub.func_or_class()
    a, b = Metrics(), Metrics()
    a.inc("flm_grammar_compiles_total", "m", "cold", value=5)
    a.set("flm_running_sequences", "m", "a", value=2)
    b.inc("flm_grammar_compiles_total", "m", "cold", value=1)
    asyncio.run(hub.push("a", a.snapshot()))
    clock = [1000.0]
    monkeypatch.setattr(hub_module.time, "monotonic", lambda: clock[0])
    asyncio.run(hub.push("a", a.snapshot()))
    clock[0] += hub_module.STALE_S + 1  # "a" missed three checks
    s = _samples(asyncio.run(hub.text("b", b.snapshot())))
    key = ("flm_grammar_compiles_total", (("cache", "cold"), ("model", "m")))
    assert s[key] == 6  # a's 5 stay in the sum
    assert ("flm_running_sequences", (("model", "m"), ("replica", "a"))) not in s
    a.inc("flm_grammar_compiles_total", "m", "cold")  # "a" was only slow: counted once
    s = _samples(asyncio.run(hub.text("a", a.snapshot())))
    assert s[key] == 7


def test_the_hub_holds_each_library_replicas_latest_models_until_it_goes_quiet(
        monkeypatch) -> None:
    import asyncio

    from deployments import metrics as hub_module

    hub = hub_module.MetricsHub.func_or_class()
    clock = [1000.0]
    monkeypatch.setattr(hub_module.time, "monotonic", lambda: clock[0])
    asyncio.run(hub.hold("r1", 2, [{"id": "a"}, {"id": "b"}]))
    asyncio.run(hub.hold("r1", 1, [{"id": "stale"}]))  # an older report, arriving late
    asyncio.run(hub.hold("r2", 1, [{"id": "a"}]))
    assert sorted(m["id"] for m in asyncio.run(hub.held())) == ["a", "a", "b"]
    clock[0] += hub_module.STALE_S / 2
    asyncio.run(hub.hold("r2", 2, []))  # r2 unloaded its model
    clock[0] += hub_module.STALE_S / 2 + 1  # r1 has not reported since: gone
    assert asyncio.run(hub.held()) == []
