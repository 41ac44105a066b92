"""The server's own metrics: `MetricsHub` (a one-replica deployment that holds every
replica's latest snapshot and writes them, added up, as Prometheus text) and
`RequestTrace` (what the ingress records about one request).

Workers and ingress replicas send their snapshot with each health check (every 5 s), an
ingress replica also when it answers `/metrics`. A replica not heard from for `STALE_S`
(three checks) is taken as gone: its gauges leave the sums, its counters stay in them (a
counter never goes down when a replica is replaced).
"""

from __future__ import annotations

import time
from typing import Any

from ray import serve

from actors.events import Deltas, Finished, Usage
from actors.metrics import SPECS, Metrics, merge

STALE_S = 15.0


def render(snapshots: list[dict]) -> bytes:
    """Prometheus text of snapshots added up (every metric listed, even with no series)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    merged = merge(snapshots)

    class _Collector:
        def collect(self):
            for name, spec in SPECS.items():
                series = merged.get(name, {})
                labels = list(spec.labels)
                if spec.kind == "counter":
                    fam: Any = CounterMetricFamily(name.removesuffix("_total"), spec.help,
                                                   labels=labels)
                    for key, value in series.items():
                        fam.add_metric(list(key), value)
                elif spec.kind == "gauge":
                    fam = GaugeMetricFamily(name, spec.help, labels=labels)
                    for key, value in series.items():
                        fam.add_metric(list(key), value)
                else:
                    fam = HistogramMetricFamily(name, spec.help, labels=labels)
                    for key, (counts, total, n) in series.items():
                        running, buckets = 0, []
                        for bound, c in zip(spec.buckets, counts):
                            running += c
                            buckets.append((repr(float(bound)), running))
                        buckets.append(("+Inf", n))
                        fam.add_metric(list(key), buckets, sum_value=total)
                yield fam

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry)


# no access log: every replica's push, every 5 s, would be a log line on the console
@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0},
                  logging_config={"enable_access_log": False})
class MetricsHub:
    """The latest snapshot of every live replica, and the counters of the replicas gone
    (so a sum never goes down when a replica is replaced; their gauges are dropped)."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[float, dict]] = {}
        self.retired: dict[str, dict] = {}  # replica -> its last counters and histograms
        self.holding: dict[str, tuple[float, int, list[dict]]] = {}  # library replicas

    async def hold(self, replica: str, seq: int, models: list[dict]) -> None:
        """A library replica's loaded models now (`seq`: its count of these reports; an
        older report arriving late is ignored)."""
        held = self.holding.get(replica)
        if held is None or held[1] <= seq:
            self.holding[replica] = (time.monotonic(), seq, models)

    async def held(self) -> list[dict]:
        """Every live library replica's loaded models (what /api/ps shows, once merged);
        a replica not heard from for STALE_S holds nothing."""
        now = time.monotonic()
        for key in [k for k, (at, _, _) in self.holding.items() if now - at > STALE_S]:
            del self.holding[key]
        return [m for _, _, models in self.holding.values() for m in models]

    async def push(self, source: str, snapshot: dict) -> None:
        self.retired.pop(source, None)  # only slow, not gone
        self.sources[source] = (time.monotonic(), snapshot)

    async def text(self, source: str | None = None, snapshot: dict | None = None) -> bytes:
        """Every replica's metrics (with `snapshot`, the caller's, as of now)."""
        if source is not None and snapshot is not None:
            await self.push(source, snapshot)
        now = time.monotonic()
        for key in [k for k, (at, _) in self.sources.items() if now - at > STALE_S]:
            _, snap = self.sources.pop(key)
            self.retired[key] = {n: v for n, v in snap.items()
                                 if n in SPECS and SPECS[n].kind != "gauge"}
        return render([snap for _, snap in self.sources.values()]
                      + list(self.retired.values()))


class RequestTrace:
    """One request as the ingress sees it: its status and duration by route, and, from the
    worker's events, time to first token, time per output token and token counts."""

    def __init__(self, metrics: Metrics, route: str) -> None:
        self.metrics, self.route = metrics, route
        self.model = ""
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.usage: Usage | None = None
        self.done = False

    def saw(self, batch: list) -> None:
        """Note a batch of the request's events (a batch of prompts has a Usage each: they
        add up)."""
        for ev in batch:
            if self.first_at is None and isinstance(ev, (Deltas, Finished)):
                self.first_at = time.perf_counter()
            elif isinstance(ev, Usage):
                self.usage = ev if self.usage is None else self.usage.plus(ev)

    def answered(self, status: int, streaming: bool) -> None:
        """The response's status is decided; a streamed one ends later (`ended`)."""
        self.metrics.inc("flm_requests_total", self.route, str(status))
        if not streaming:
            self.ended()

    def ended(self, disconnected: bool = False) -> None:
        if self.done:
            return
        self.done = True
        now = time.perf_counter()
        m = self.metrics
        m.observe("flm_request_duration_seconds", self.route, value=now - self.started)
        if disconnected:
            m.inc("flm_client_disconnects_total", self.route)
        if self.first_at is not None and self.model:
            m.observe("flm_time_to_first_token_seconds", self.model,
                      value=self.first_at - self.started)
        u = self.usage
        if u is not None and self.model:
            m.inc("flm_prompt_tokens_total", self.model, value=u.prompt_tokens)
            m.inc("flm_cached_prompt_tokens_total", self.model, value=u.cached_tokens)
            m.inc("flm_generation_tokens_total", self.model, value=u.completion_tokens)
            if u.completion_tokens > 1 and self.first_at is not None:
                m.observe("flm_time_per_output_token_seconds", self.model,
                          value=(now - self.first_at) / (u.completion_tokens - 1))
