"""Metrics: one process's counters, gauges and histograms as plain numbers.

Every ingress and worker replica keeps one `Metrics`; a snapshot (plain dicts) goes to the
metrics hub, which adds the snapshots of all replicas up and writes Prometheus text
(deployments.metrics). The names, kinds, help texts and buckets are fixed here, in `SPECS`.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

import msgspec

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class MetricSpec(msgspec.Struct, frozen=True):
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


SPECS: dict[str, MetricSpec] = {
    # the ingress, per route (and model where one is known)
    "flm_requests_total": MetricSpec(
        "counter", "HTTP requests answered, by route and status code.", ("route", "status")),
    "flm_request_duration_seconds": MetricSpec(
        "histogram", "Time from a request's arrival to its last byte.", ("route",), _LATENCY),
    "flm_time_to_first_token_seconds": MetricSpec(
        "histogram", "Time from a request's arrival to its first output.", ("model",),
        _LATENCY),
    "flm_time_per_output_token_seconds": MetricSpec(
        "histogram", "Time per output token after the first, per request.", ("model",),
        _PER_TOKEN),
    "flm_prompt_tokens_total": MetricSpec(
        "counter", "Prompt tokens of finished requests (cached ones included).", ("model",)),
    "flm_cached_prompt_tokens_total": MetricSpec(
        "counter", "Prompt tokens served from the KV cache.", ("model",)),
    "flm_generation_tokens_total": MetricSpec(
        "counter", "Tokens generated for finished requests.", ("model",)),
    "flm_client_disconnects_total": MetricSpec(
        "counter", "Streams whose client went away before the end.", ("route",)),
    # the workers, per replica
    "flm_running_sequences": MetricSpec(
        "gauge", "Sequences a worker is decoding.", ("model", "replica")),
    "flm_waiting_requests": MetricSpec(
        "gauge", "Requests a worker has admitted that wait: their prompt not prefilled yet, "
        "or paused for KV cache room.",
        ("model", "replica")),
    "flm_preemptions_total": MetricSpec(
        "counter", "Requests paused because the KV cache could not hold every running "
        "sequence's next token (they go on when there is room).", ("model",)),
    "flm_spec_draft_tokens_total": MetricSpec(
        "counter", "Tokens drafted from the prompt and output (speculative decoding) and "
        "verified.", ("model",)),
    "flm_spec_accepted_tokens_total": MetricSpec(
        "counter", "Drafted tokens kept: the model produced them (speculative decoding).",
        ("model",)),
    "flm_kv_cache_bytes": MetricSpec(
        "gauge", "Bytes a worker's KV cache holds.", ("model", "replica")),
    "flm_kv_cache_blocks": MetricSpec(
        "gauge", "KV cache blocks (16 tokens each) held by running sequences.",
        ("model", "replica")),
    "flm_kv_cache_cached_blocks": MetricSpec(
        "gauge", "KV cache blocks no sequence holds, kept for prompts that start alike.",
        ("model", "replica")),
    "flm_grammar_compiles_total": MetricSpec(
        "counter", "Grammars a request needed, compiled anew (cold) or from the cache.",
        ("model", "cache")),
    "flm_grammar_compile_seconds": MetricSpec(
        "histogram", "Time to compile a grammar (cold compiles).", ("model",), _LATENCY),
    # the library worker (models loaded on first use), per replica
    "flm_models_loaded": MetricSpec(
        "gauge", "Library models a worker replica holds now.", ("replica",)),
    "flm_model_loads_total": MetricSpec(
        "counter", "Library model loads, by outcome (loaded, failed).", ("model", "outcome")),
    "flm_model_load_seconds": MetricSpec(
        "histogram", "Time to load a library model.", ("model",), _LATENCY),
    "flm_model_unloads_total": MetricSpec(
        "counter", "Library models unloaded, by reason (keep_alive, evicted: past "
                   "max_loaded_models or the memory budget).", ("model", "reason")),
    "flm_constraint_giveups_total": MetricSpec(
        "counter", "Constrained outputs whose grammar gave up (the output went on "
                   "unconstrained).", ("model",)),
}


class Metrics:
    """Thread-safe counters, gauges and histograms keyed by metric name and label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, ...], Any]] = {}

    def _series(self, name: str) -> dict[tuple[str, ...], Any]:
        if name not in SPECS:
            raise KeyError(f"unknown metric {name!r}")
        return self._values.setdefault(name, {})

    def inc(self, name: str, *labels: str, value: float = 1.0) -> None:
        with self._lock:
            series = self._series(name)
            series[labels] = series.get(labels, 0.0) + value

    def set(self, name: str, *labels: str, value: float) -> None:
        with self._lock:
            self._series(name)[labels] = float(value)

    def observe(self, name: str, *labels: str, value: float) -> None:
        """One observation of a histogram: its bucket counts (non-cumulative), sum, count."""
        buckets = SPECS[name].buckets
        with self._lock:
            series = self._series(name)
            h = series.get(labels)
            if h is None:
                h = series[labels] = [[0] * (len(buckets) + 1), 0.0, 0]
            h[0][bisect.bisect_left(buckets, value)] += 1
            h[1] += value
            h[2] += 1

    def snapshot(self) -> dict[str, list]:
        """{name: [[labels, value], ...]} (plain lists: it crosses processes)."""
        with self._lock:
            return {name: [[list(k), v if not isinstance(v, list) else
                            [list(v[0]), v[1], v[2]]] for k, v in series.items()]
                    for name, series in self._values.items()}


def merge(snapshots: list[dict[str, list]]) -> dict[str, dict[tuple[str, ...], Any]]:
    """Several processes' snapshots added up: counters and histograms summed per label set,
    gauges summed too (each replica's gauges carry its own `replica` label)."""
    out: dict[str, dict[tuple[str, ...], Any]] = {}
    for snap in snapshots:
        for name, series in snap.items():
            if name not in SPECS:
                continue
            target = out.setdefault(name, {})
            for labels, value in series:
                key = tuple(labels)
                if SPECS[name].kind == "histogram":
                    h = target.setdefault(key, [[0] * len(value[0]), 0.0, 0])
                    h[0] = [a + b for a, b in zip(h[0], value[0])]
                    h[1] += value[1]
                    h[2] += value[2]
                else:
                    target[key] = target.get(key, 0.0) + value
    return out
