"""Two simulated NPUs serve two worker replicas, each on its own device index from Ray."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_two_simulated_npus_serve_two_replicas(client) -> None:
    from ray import serve

    handle = serve.get_deployment_handle("worker-flm-tiny", app_name="npu")
    indices = {handle.info.remote().result()["device_index"] for _ in range(40)}
    assert indices == {0, 1}
    for seed in range(4):
        r = client.post("/npu/v1/chat/completions", json={
            "model": "flm-tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "seed": seed})
        assert r.status_code == 200, r.text
