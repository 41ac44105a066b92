"""Soak: mixed streams with clients that go away, bad input at volume, and a worker lost
under load, on one node and across two; bounded in time, it stops by itself.

    .venv/bin/python bench/bench_soak.py [--quick] [--seconds S] [--clients N] [--nodes 1|2|both]

Each phase runs N clients (64; --quick: 8) for S seconds (120; --quick: 12) against flm-tiny
with two worker replicas, served as `make serve` serves (configs/serve.env: HAProxy
ingress). Each client loops over plain, tool_choice "required", json_schema and
reasoning-off streams, and a malformed request every fifth turn; a quarter of the streams
are dropped by their client after a random number of chunks.
- One node (Ray started here): halfway, one worker replica's process gets SIGKILL.
- Two nodes on this machine (`ray start --head` and `ray start --address=...`, each with
  {"NPU": 1}; `python -m deployments.launch` joining the cluster with configs/multi_npu.yaml's
  app on simulated NPUs): halfway, once each node's worker has served a request, the
  second node's raylet is stopped (SIGTERM); the load goes on for half a phase after that.
Checks, each printed with its figures (exit 1 if one fails): no 5xx and no hung request
(each ends within its deadline), no error event in a stream the loss did not cut; every
stream the loss cut ends with an error event and [DONE] within 5 s; one node: Serve
replaces the killed replica (time printed), no other replica restarts, the surviving
worker's RSS stays within 5% of its value after the warm-up; two nodes: one worker on each
node, both take traffic, the first node's worker serves on after the stop; and afterwards
every worker reports no active request and no KV sequence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEADLINE_S = 60.0  # a request that has not ended by then is hung
KILL_END_S = 5.0  # a stream cut by the kill ends this soon after it
RSS_TOLERANCE = 0.05
MSG = [{"role": "user", "content": "Tell me about the weather."}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"]}
KINDS = {
    "plain": {},
    "tools": {"tools": [TOOL], "tool_choice": "required"},
    "json_schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "w", "schema": SCHEMA}}},
    "reasoning_off": {"reasoning_effort": "none"},
}
BAD_BODIES = [
    b"{", b"[]", b'{"model": "flm-tiny"}',
    json.dumps({"model": "flm-tiny", "messages": "hi"}).encode(),
    json.dumps({"model": "flm-tiny", "messages": MSG, "tools": [{"type": "function",
               "function": {"name": "f", "description": []}}]}).encode(),
    json.dumps({"model": "flm-tiny", "messages": MSG, "temperature": "hot"}).encode(),
    json.dumps({"model": "flm-tiny", "messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}).encode(),
    json.dumps({"model": "no-such-model", "messages": MSG}).encode(),
]


class Tally:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.ttft: list[float] = []
        self.cut: list[float] = []  # streams ended by an error event: their end times

    def error(self, what: str) -> None:
        self.errors[what] += 1


async def one_stream(client: httpx.AsyncClient, kind: str, rng: random.Random,
                     tally: Tally) -> None:
    body = {"model": "flm-tiny", "messages": MSG, "stream": True, "seed": rng.randrange(1 << 30),
            "max_tokens": rng.randint(8, 64), **KINDS[kind]}
    drop_after = rng.randint(1, 12) if rng.random() < 0.25 else None
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(DEADLINE_S):
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    tally.error(f"{kind}: status {r.status_code}")
                    return
                chunks, errored, done = 0, False, False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        done = True
                        break
                    if chunks == 0:
                        tally.ttft.append(time.monotonic() - t0)
                    chunks += 1
                    if '"error"' in data and "error" in json.loads(data):
                        errored = True
                    if drop_after is not None and chunks >= drop_after:
                        tally.outcomes["dropped by the client"] += 1
                        return
                if errored:
                    tally.cut.append(time.monotonic())
                    tally.outcomes["ended by an error event"] += 1
                    if not done:
                        tally.error(f"{kind}: error event without [DONE]")
                elif done:
                    tally.outcomes["completed"] += 1
                else:
                    tally.error(f"{kind}: stream ended without [DONE]")
    except TimeoutError:
        tally.error(f"{kind}: hung (no end within {DEADLINE_S:.0f} s)")
    except httpx.HTTPError as exc:
        tally.error(f"{kind}: {type(exc).__name__}")


async def one_bad(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    body = rng.choice(BAD_BODIES)
    try:
        r = await client.post("/v1/chat/completions", content=body,
                              headers={"content-type": "application/json"},
                              timeout=DEADLINE_S)
    except httpx.HTTPError as exc:
        tally.error(f"bad input: {type(exc).__name__}")
        return
    if r.status_code >= 500 or "error" not in r.json():
        tally.error(f"bad input: status {r.status_code}")
    else:
        tally.outcomes[f"bad input answered {r.status_code}"] += 1


class Until:
    """When the clients stop starting requests (monotonic seconds); a phase may move it."""

    def __init__(self, at: float) -> None:
        self.at = at


async def client_loop(index: int, url: str, until: Until, tally: Tally) -> None:
    rng = random.Random(index)
    names = list(KINDS)
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        turn = 0
        while time.monotonic() < until.at:
            turn += 1
            if turn % 5 == 0:
                await one_bad(client, rng, tally)
            else:
                await one_stream(client, names[(index + turn) % len(names)], rng, tally)


def workers(handle, replicas: int, tries: int = 60) -> dict[str, dict]:
    """Each worker replica's info, by replica id (asked until all `replicas` answered)."""
    seen: dict[str, dict] = {}
    for _ in range(tries):
        info = handle.info.remote().result()
        seen[info["replica"]] = info
        if len(seen) >= replicas:
            break
    return seen


def serve_replicas() -> set[str]:
    import ray

    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::")}


class Cluster:
    """Two Ray nodes on this machine, as a user with two hosts starts them: `ray start
    --head` and `ray start --address=...`, each advertising {"NPU": 1}, with
    configs/serve.env's settings. Its processes are found again by the head's temp dir
    (every node's command line names it) and their descendants."""

    def __init__(self, env: dict[str, str], temp_prefix: str) -> None:
        from deployments.launch.serve_env import free_port

        self.env = env
        self.temp = tempfile.mkdtemp(prefix=temp_prefix)
        ray_cli = str(Path(sys.executable).with_name("ray"))
        common = ["--num-cpus=2", '--resources={"NPU": 1}', "--disable-usage-stats"]
        subprocess.run([ray_cli, "start", "--head", f"--port={free_port()}",
                        f"--temp-dir={self.temp}", "--include-dashboard=false",
                        f"--ray-client-server-port={free_port()}", *common],
                       env=env, check=True, capture_output=True)
        self.address = (Path(self.temp) / "ray_current_cluster").read_text().strip()
        before = set(self.raylets())
        subprocess.run([ray_cli, "start", f"--address={self.address}", *common], env=env,
                       check=True, capture_output=True)
        self.second_raylet = (set(self.raylets()) - before).pop()
        args = _cmdline(self.second_raylet).split(b"\0")
        self.second_node = next(a.split(b"=", 1)[1].decode() for a in args
                                if a.startswith(b"--node_id="))

    def raylets(self) -> list[int]:
        return [p for p in self.processes() if _comm(p) == "raylet"]

    def processes(self) -> list[int]:
        from deployments.launch.processes import ancestors, descendants, pids

        roots = [p for p in pids() if self.temp.encode() in _cmdline(p)]
        return sorted(set(descendants(roots)) - ancestors())

    def stop(self) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def report(title: str, clients: int, seconds: float, tally: Tally) -> None:
    requests = sum(tally.outcomes.values()) + sum(tally.errors.values())
    ttft = sorted(tally.ttft)
    print(f"{title}: {clients} clients for {seconds:.0f} s, {requests} requests, "
          f"{requests / seconds:.1f}/s")
    for what, n in sorted(tally.outcomes.items()):
        print(f"  {what}: {n}")
    for what, n in sorted(tally.errors.items()):
        print(f"  ERROR {what}: {n}")
    if ttft:
        print(f"  time to first token: p50 {1000 * statistics.median(ttft):.0f} ms, "
              f"p99 {1000 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))]:.0f} ms")


def cut_check(tally: Tally, at: float, what: str) -> tuple[str, bool]:
    late = [t - at for t in tally.cut if t - at > KILL_END_S]
    ok = all(t >= at for t in tally.cut) and not late
    return (f"{len(tally.cut)} stream(s) cut by {what}, each ended with an error event and "
            f"[DONE] within {KILL_END_S:.0f} s of it", ok)


def idle_workers(handle, replicas: int, within_s: float = 60.0) -> tuple[dict, bool]:
    """Every worker's info once all `replicas` answer with nothing active or held (or the
    last answers at the deadline), and whether they were idle."""
    end = time.monotonic() + within_s
    seen: dict[str, dict] = {}
    while True:
        seen.update(workers(handle, replicas))
        idle = len(seen) >= replicas and all(
            w["active"] == 0 and w.get("sequences", 0) == 0 for w in seen.values())
        if idle or time.monotonic() > end:
            return seen, idle
        time.sleep(0.2)


def one_node(seconds: float, clients: int, cache: Path) -> list[tuple[str, bool]]:
    """Serve in this process (Ray started here, as `make serve` does); SIGKILL a worker."""
    import ray
    from ray import serve

    from deployments.app import build_app
    from deployments.launch.serve_env import free_port

    port = free_port()
    ray.init(include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"FLM_CACHE": str(cache)}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # room for every client in the queues: a 503 would be a 5xx
    serve.run(build_app({"models": [{"name": "flm-tiny", "path": "flm-tiny", "replicas": 2,
                                     "max_batch": 8, "max_queued": clients}]}),
              name="flm", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    handle = serve.get_deployment_handle("worker-flm-tiny", app_name="flm")
    _all_workers(handle, 2)
    warm_up = min(10.0, max(5.0, seconds / 4))
    asyncio.run(_run(url, clients, Until(time.monotonic() + warm_up), Tally()))
    before = workers(handle, 2)  # after the warm-up: the RSS baseline
    replicas_before = serve_replicas()
    victim: dict = {}
    tally, kill = Tally(), {}

    async def killer() -> None:
        await asyncio.sleep(seconds / 2)
        busy = await asyncio.to_thread(workers, handle, 2, 20)
        # the busier worker, so that the kill cuts streams
        victim.update(max(busy.values(), key=lambda w: w["active"]))
        kill["victim_active"] = victim["active"]
        kill["at"] = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        # the replacement: a worker replica Serve started after the kill answers
        while time.monotonic() < kill["at"] + 120:
            now = await asyncio.to_thread(workers, handle, 2, 20)
            if any(r not in before for r in now):
                kill["replaced"] = time.monotonic()
                return
            await asyncio.sleep(0.2)

    async def load() -> None:
        until = Until(time.monotonic() + seconds)
        await asyncio.gather(killer(), *[client_loop(i, url, until, tally)
                                         for i in range(clients)])

    asyncio.run(load())
    replaced_s = kill["replaced"] - kill["at"] if "replaced" in kill else None
    after, idle = idle_workers(handle, 2)
    replicas_after = serve_replicas()
    report("one node, a worker replica SIGKILLed halfway", clients, seconds, tally)
    checks = [("no 5xx, no hung request, no failed stream", not tally.errors)]
    what, ok = cut_check(tally, kill["at"], "the kill")
    checks.append((f"{what} (the victim had {kill['victim_active']} request(s) just before)",
                   ok))
    shown = "-" if replaced_s is None else f"{replaced_s:.1f}"
    checks.append((f"killed replica replaced in {shown} s", replaced_s is not None))
    gone, new = replicas_before - replicas_after, replicas_after - replicas_before
    checks.append((f"no other replica restarted ({len(gone)} gone, {len(new)} new)",
                   gone == {victim["actor"]} and len(new) == 1))
    checks.append(("every worker idle afterwards: " + _usage(after), idle))
    survivor = next((r for r in before if r != victim["replica"]), None)
    if survivor in after:
        b, a = before[survivor]["rss_bytes"], after[survivor]["rss_bytes"]
        checks.append((f"surviving worker RSS {b / 2**20:.0f} -> {a / 2**20:.0f} MiB "
                       f"({100 * (a / b - 1):+.1f}%, target within "
                       f"{100 * RSS_TOLERANCE:.0f}%)", a <= b * (1 + RSS_TOLERANCE)))
    else:
        checks.append(("surviving worker found afterwards", False))
    serve.shutdown()
    ray.shutdown()
    return checks


def two_nodes(seconds: float, clients: int, cache: Path) -> list[tuple[str, bool]]:
    """A two-node cluster (`ray start` twice), the app served by `make serve`'s launcher
    joining it with configs/multi_npu.yaml's shape on simulated NPUs; the second node's
    raylet stopped halfway."""
    import ray
    import yaml
    from ray import serve

    from deployments.launch.serve_env import free_port, serve_environ
    from npu.load.tiny import tiny_config
    from npu.xrt.sim_kernels import make_kernel_dir

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(serve_environ(env, private_ports=True), FLM_CACHE=str(cache),
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.environ["RAY_AUTH_TOKEN"])
    cluster = Cluster(env, f"{cache}-ray-")
    launcher = None
    try:
        port = free_port()
        config = yaml.safe_load((ROOT / "configs" / "multi_npu.yaml").read_text())
        config["http_options"] = {"host": "127.0.0.1", "port": port}
        model = config["applications"][0]["args"]["models"][0]
        model.update(name="flm-tiny", path="flm-tiny", replicas=2, max_batch=8,
                     max_queued=clients, kernel_dir=str(make_kernel_dir(cache / "kernels", [tiny_config()])),
                     simulator_devices=["RyzenAI-npu4"])
        path = cache / "two_nodes.yaml"
        path.write_text(yaml.safe_dump(config))
        launcher = subprocess.Popen([sys.executable, "-m", "deployments.launch", str(path)],
                                    cwd=ROOT, env={**env, "RAY_ADDRESS": cluster.address},
                                    start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, launcher)
        ray.init(address=cluster.address, namespace="serve", log_to_driver=False)
        handle = serve.get_deployment_handle("worker-flm-tiny", app_name="flm")
        before = _all_workers(handle, 2)
        nodes = {w["node"] for w in before.values()}
        tally, stop = Tally(), {}
        second = None

        async def stopper(until: Until) -> None:
            await asyncio.sleep(seconds / 2)
            # the stop waits until each worker has served (bounded): how many requests a
            # slow machine makes in half a phase, and which replica the prefix router sends
            # a conversation to, are not what this phase checks; the load then goes on for
            # the phase's second half after the stop
            wait_end = time.monotonic() + DEADLINE_S
            while True:
                busy = await asyncio.to_thread(workers, handle, 2, 20)
                served = [w["requests"] for w in busy.values()]
                if (len(served) == 2 and min(served) > 0) or time.monotonic() > wait_end:
                    break
                until.at = max(until.at, time.monotonic() + 1.0)  # the load goes on meanwhile
                await asyncio.sleep(0.2)
            stop["requests"] = {r: w["requests"] for r, w in busy.items()}
            stop["active"] = sum(w["active"] for w in busy.values()
                                 if w["node"] == cluster.second_node)
            stop["at"] = time.monotonic()
            until.at = max(until.at, stop["at"] + seconds / 2)
            os.kill(cluster.second_raylet, signal.SIGTERM)

        async def load() -> None:
            until = Until(time.monotonic() + seconds)
            await asyncio.gather(stopper(until), *[client_loop(i, url, until, tally)
                                                   for i in range(clients)])

        began = time.monotonic()
        asyncio.run(load())
        took = time.monotonic() - began
        after, idle = idle_workers(handle, 1)
        second = [r for r in before if r not in after]
        survivor = next((w for r, w in after.items() if r in before), None)
        served_after = survivor["requests"] - stop["requests"].get(survivor["replica"], 0) \
            if survivor else 0
        report("two nodes, the second node's raylet stopped halfway", clients, took, tally)
        checks = [(f"one worker replica on each node ({len(nodes)} nodes)", len(nodes) == 2),
                  ("both took traffic before the stop: " + ", ".join(
                      str(n) for n in stop["requests"].values()),
                   len(stop["requests"]) == 2 and min(stop["requests"].values()) > 0),
                  ("no 5xx, no hung request, no failed stream", not tally.errors),
                  _with_note(cut_check(tally, stop["at"], "the node's stop"),
                             f"(its worker had {stop['active']} request(s) just before)"),
                  (f"the first node's worker served {served_after} request(s) after it",
                   served_after > 0 and len(second) == 1),
                  ("the remaining worker idle afterwards: " + _usage(after), idle)]
        ray.shutdown()
        return checks
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            try:
                launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                launcher.kill()
        cluster.stop()


def _wait_healthy(url: str, proc: subprocess.Popen, within_s: float = 180) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the launcher exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy in {within_s:.0f} s")


def _all_workers(handle, replicas: int, within_s: float = 180) -> dict[str, dict]:
    """The workers' info once all `replicas` answer (the ingress answers /health as soon
    as the first is up)."""
    end = time.monotonic() + within_s
    while True:
        seen = workers(handle, replicas)
        if len(seen) >= replicas or time.monotonic() > end:
            return seen
        time.sleep(0.5)


def _with_note(check: tuple[str, bool], note: str) -> tuple[str, bool]:
    return f"{check[0]} {note}", check[1]


def _usage(ws: dict) -> str:
    return ", ".join(f"active {w['active']} sequences {w.get('sequences')} KV blocks "
                     f"{w.get('kv_blocks')}" for w in ws.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--nodes", choices=["1", "2", "both"], default="both")
    args = parser.parse_args()
    seconds = args.seconds or (12.0 if args.quick else 120.0)
    clients = args.clients or (8 if args.quick else 64)
    cache = Path(tempfile.mkdtemp(prefix="flm-soak-"))
    from npu.engine.cpu_kernels import seed_cache

    seed_cache(cache)  # the workers load this process's kernel build, not their own
    os.environ["FLM_CACHE"] = str(cache)
    from deployments.launch.serve_env import serve_environ

    os.environ.update(serve_environ(os.environ, private_ports=True))
    # before Ray is imported, which reads it then: the two-node phase joins a cluster, and
    # a process joining one sends Ray's token only in this mode
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    # this run's own token (every node and client of it reads the variable): nothing
    # written to ~/.ray, and `ray start` finds one on a machine that never made one
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    checks: list[tuple[str, bool]] = []
    if args.nodes in ("1", "both"):
        checks += one_node(seconds, clients, cache)
    if args.nodes in ("2", "both"):
        checks += two_nodes(seconds, clients, cache)
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    temp = [cache, *cache.parent.glob(f"{cache.name}-ray-*")]
    if all(ok for _, ok in checks):
        for folder in temp:
            shutil.rmtree(folder, ignore_errors=True)
        return 0
    print("kept for inspection (the model cache, Ray's logs): " + " ".join(map(str, temp)))
    return 1


async def _run(url: str, clients: int, until: Until, tally: Tally) -> None:
    await asyncio.gather(*[client_loop(i, url, until, tally) for i in range(clients)])


if __name__ == "__main__":
    sys.exit(main())
