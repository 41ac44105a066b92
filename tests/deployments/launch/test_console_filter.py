"""What the console keeps of Ray's worker lines (deployments/launch/console_filter.py):
ours and every warning and error; not Ray's and Serve's INFO records, nor the warnings a
loopback run always gets. The lines below are copied from a `make serve` console."""

from __future__ import annotations

import threading

import pytest

from deployments.launch import console_filter as cf

QUIET = [
    "INFO 2026-12-05 08:16:21,061 controller 20789 -- Deploying new version of "
    "Deployment(name='Ingress', app='flm') (initial target replicas: 1).",
    "INFO 2026-12-05 08:16:25,120 flm_Ingress ab12cd -- GET /v1/models 200 11.2ms",
    "DEBUG 2026-12-05 08:16:25,120 proxy 127.0.0.1 -- Got updated endpoints: {}.",
    "2026-12-05 08:16:05,988\tINFO worker.py:2012 -- Started a local Ray instance.",
    "INFO:     Started server process [20801]",
    "[2026-12-05 08:16:06,001 I 20052 20052] core_worker.cc:512: Constructing CoreWorker",
    "WARNING 2026-12-05 08:16:21,061 controller 20789 -- HTTPOptions.host='127.0.0.1' "
    "won't accept connections from HAProxy on other nodes; cross-node routing will fail.",
]
KEPT = [
    "[flm] 2026/12/05 08:16:45 | 200 |   2.432 s | POST /v1/chat/completions | m",
    "loading SmolLM2-135M-Instruct: 25% (24 / 97 MB, 12 MB/s)",
    "WARNING 2026-12-05 08:16:21,061 controller 20789 -- Deployment 'worker' has 1 "
    "replicas that have taken more than 30s to initialize.",
    "ERROR 2026-12-05 08:16:21,061 flm_worker x1 -- Exception in replica constructor",
    "Traceback (most recent call last):",
    "stream broke: RuntimeError('boom')",
]


@pytest.mark.parametrize("line", QUIET)
def test_ray_info_lines_and_expected_warnings_stay_in_the_files(line: str) -> None:
    assert cf.is_quiet(line)


@pytest.mark.parametrize("line", KEPT)
def test_our_lines_warnings_and_errors_show(line: str) -> None:
    assert not cf.is_quiet(line)


def test_a_replica_batch_prints_its_kept_lines_without_ray_prefix() -> None:
    shown: list[tuple[dict, bool]] = []
    handle = cf.make_printer(lambda data, bare: shown.append((data, bare)))
    handle({"pid": 7, "actor_name": "ServeReplica:flm:Ingress", "lines": QUIET[:2] + KEPT[:1]})
    handle({"pid": 8, "actor_name": "ServeController", "lines": QUIET[:1]})  # nothing left
    handle({"pid": 8, "actor_name": "ServeController", "lines": KEPT[2:3]})
    assert [(d["lines"], bare) for d, bare in shown] == [(KEPT[:1], True), (KEPT[2:3], False)]


def test_once_stopping_only_a_replicas_lines_show() -> None:
    """Serve's shutdown race (Ray 2.60): the HAProxy manager's metrics loop logs a traceback
    when HAProxy is already killed; a stopping run keeps such lines in the files."""
    shown: list[tuple[dict, bool]] = []
    stopping = threading.Event()
    handle = cf.make_printer(lambda data, bare: shown.append((data, bare)), stopping)
    haproxy = {"pid": 9, "actor_name": "HAProxyManager", "lines": KEPT[3:5]}
    handle(haproxy)
    stopping.set()
    handle(haproxy)
    handle({"pid": 7, "actor_name": "ServeReplica:flm:Ingress", "lines": KEPT[5:6]})
    assert [(d["lines"], bare) for d, bare in shown] == [(KEPT[3:5], False), (KEPT[5:6], True)]


def test_verbose_comes_from_the_flag_or_flm_verbose() -> None:
    assert cf.verbose_from(["--verbose", "c.yaml"], {}) == (True, ["c.yaml"])
    assert cf.verbose_from(["c.yaml"], {"FLM_VERBOSE": "1"}) == (True, ["c.yaml"])
    assert cf.verbose_from(["c.yaml"], {"FLM_VERBOSE": "0"}) == (False, ["c.yaml"])
    assert cf.verbose_from([], {}) == (False, [])


def test_verbose_leaves_rays_printer_in_place() -> None:
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    before = list(dispatcher.handlers)
    cf.install(True)
    assert dispatcher.handlers == before
