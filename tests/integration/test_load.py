"""Concurrency, disconnects and replicas: 32 streams at once, a client that goes away, two
replicas sharing traffic, one replica killed under load, and a burst over the queue."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.conftest import SECRET

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
MSG = [{"role": "user", "content": "Tell me a story."}]


async def _one_stream(client: httpx.AsyncClient, seed: int) -> list:
    async with client.stream("POST", "/v1/chat/completions", json={
            "model": "flm-tiny", "messages": MSG, "max_tokens": 24, "seed": seed,
            "stream": True}) as r:
        assert r.status_code == 200
        lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    return lines


def test_32_concurrent_streams_all_finish(serve_url) -> None:
    async def main():
        async with httpx.AsyncClient(base_url=serve_url, timeout=300) as client:
            return await asyncio.gather(*[_one_stream(client, i) for i in range(32)])

    results = asyncio.run(main())
    assert len(results) == 32
    assert all(lines[-1] == "data: [DONE]" for lines in results)


def _active(serve_url) -> int:
    """Sequences in the workers' loops (asked of both replicas, by asking a few times)."""
    from ray import serve

    handle = serve.get_deployment_handle("worker-flm-tiny", app_name="flm")
    return max(handle.info.remote().result()["active"] for _ in range(8))


def test_disconnect_frees_the_slot(serve_url) -> None:
    with httpx.Client(base_url=serve_url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json={
                "model": "flm-tiny", "messages": MSG, "max_tokens": 4000, "seed": 1,
                "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # read one chunk, then hang up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _active(serve_url):
        time.sleep(0.2)
    assert _active(serve_url) == 0


def test_two_replicas_both_receive_traffic(serve_url) -> None:
    from ray import serve

    handle = serve.get_deployment_handle("worker-flm-tiny", app_name="flm")
    seen = {handle.info.remote().result()["replica"] for _ in range(40)}
    assert len(seen) == 2


def test_killed_replica_leaves_the_others_answering(serve_url) -> None:
    import ray
    from ray import serve

    handle = serve.get_deployment_handle("worker-flm-tiny", app_name="flm")
    victim = handle.info.remote().result()["actor"]

    async def load(client, n):
        out = []
        for i in range(n):
            r = await client.post("/v1/chat/completions", json={
                "model": "flm-tiny", "messages": MSG, "max_tokens": 16, "seed": i})
            out.append(r.status_code)
        return out

    async def main():
        async with httpx.AsyncClient(base_url=serve_url, timeout=120) as client:
            task = asyncio.gather(*[load(client, 6) for _ in range(4)])
            await asyncio.sleep(0.5)
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=False)
            codes = [c for part in await task for c in part]
            after = await client.post("/v1/chat/completions", json={
                "model": "flm-tiny", "messages": MSG, "max_tokens": 4})
            return codes, after.status_code

    codes, after = asyncio.run(main())
    assert set(codes) <= {200, 503}  # in-flight requests on the victim may fail, cleanly
    assert codes.count(200) >= len(codes) // 2
    assert after == 200


def _secured_answers_again(serve_url: str, within_s: float) -> int:
    """The status of a small request to the secured app, asked until it is not a 503 (or the
    time is up)."""
    deadline = time.monotonic() + within_s
    with httpx.Client(base_url=serve_url, timeout=60,
                      headers={"Authorization": f"Bearer {SECRET}"}) as client:
        while True:
            status = client.post("/secured/v1/chat/completions", json={
                "model": "flm-tiny", "messages": MSG, "max_tokens": 2}).status_code
            if status != 503 or time.monotonic() > deadline:
                return status
            time.sleep(0.1)


def test_a_burst_over_the_queue_gets_json_503s_with_retry_after(serve_url) -> None:
    """The secured app's worker runs one sequence and queues one: the rest of a burst is
    told to come back later (Serve's back-pressure) in OpenAI's shape, and once the burst
    is gone the worker answers again."""
    headers = {"Authorization": f"Bearer {SECRET}"}
    body = {"model": "flm-tiny", "messages": MSG, "max_tokens": 4000, "seed": 1, "stream": True}
    n = 8

    async def main():
        answers: list = []
        burst_seen = asyncio.Event()  # every request but the queued one has its answer

        async def one(client):
            async with client.stream("POST", "/secured/v1/chat/completions", json=body,
                                     headers=headers) as r:
                if r.status_code == 200:
                    answers.append((200, None, None))
                else:
                    await r.aread()
                    answers.append((r.status_code, r.headers.get("retry-after"), r.json()))
                if len(answers) >= n - 1:
                    burst_seen.set()
                await asyncio.wait_for(burst_seen.wait(), 60)  # then hang up

        async with httpx.AsyncClient(base_url=serve_url, timeout=60) as client:
            await asyncio.gather(*[one(client) for _ in range(n)])
        return answers

    answers = asyncio.run(main())
    rejected = [a for a in answers if a[0] != 200]
    assert rejected and all(a[0] == 503 for a in rejected)
    assert all(a[1] == "1" and a[2]["error"]["code"] == "overloaded" for a in rejected)
    assert _secured_answers_again(serve_url, 30) == 200  # the hung-up streams free it


def test_a_worker_dying_mid_stream_ends_it_with_an_error_event(serve_url) -> None:
    import ray
    from ray import serve

    headers = {"Authorization": f"Bearer {SECRET}"}
    handle = serve.get_deployment_handle("worker-flm-tiny", app_name="secured")
    victim = handle.info.remote().result()["actor"]  # its only replica
    with httpx.Client(base_url=serve_url, timeout=60, headers=headers) as client:
        with client.stream("POST", "/secured/v1/chat/completions", json={
                "model": "flm-tiny", "messages": MSG, "max_tokens": 100000, "seed": 1,
                "stream": True}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=False)
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert '"error"' in rest[-2] and "server_error" in rest[-2]
    assert _secured_answers_again(serve_url, 60) == 200  # Serve replaces the replica
