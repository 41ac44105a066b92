"""The serving path's cost, measured side by side in one run (completions: every token is
visible text, so first-token timing is exact).

For flm-tiny, for a bigger random model (about 5+ ms a token; again with one BLAS
thread, leaving a core to Ray) and for the default model (SmolLM2-135M, Q4_1 GGUF): decode tokens/s of the worker called in-process vs the
same request streamed through HTTP (configs/serve.env's HAProxy ingress, the ingress
replica, the worker replica, SSE), and the time to first token the serving path adds.
Then aggregate tokens/s of 32 concurrent streams (continuous batching) vs the same 32
requests one at a time.

    python bench/bench_serve.py                  # full
    python bench/bench_serve.py --quick          # fewer tokens and streams
    python bench/bench_serve.py --python-proxy   # through Serve's Python proxy instead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from actors.blas import blas_threads_for, set_blas_threads  # noqa: E402
from actors.events import CompletionGenerate, Deltas  # noqa: E402
from actors.worker import Worker  # noqa: E402
from npu import load_model  # noqa: E402
from npu.engine.cores import default_threads  # noqa: E402
from npu.load.tiny import build_tiny, ensure_tiny  # noqa: E402

SETTLE_S = 0.5  # between measured runs (see the paired rounds in main)
MSG = [{"role": "user", "content": "Tell me a long story about the sea."}]
PROMPT = "The little robot watched the quiet harbour"
MEDIUM = {"hidden_size": 768, "intermediate_size": 2304, "num_hidden_layers": 12,
          "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64}


async def in_process(worker: Worker, tokens: int) -> tuple[float, float]:
    """(seconds to first delta, tokens/s after it) for one request on the worker."""
    req = CompletionGenerate(request_id="b", prompt=PROMPT, max_tokens=tokens,
                             seed=1, ignore_eos=True, temperature=1.0)
    t0 = time.perf_counter()
    first = None
    async for batch in worker.generate(req):
        if first is None and any(isinstance(ev, Deltas) and ev.text for ev in batch):
            first = time.perf_counter()
    end = time.perf_counter()
    return first - t0, (tokens - 1) / (end - first)


def _in_process_child(conn, folder: str, name: str, settings: dict,
                      blas_threads: int | None) -> None:
    """A clean process (no Ray, no HTTP client) that runs the worker in-process on
    command: receives a token count, answers (ttft, tokens/s); None ends it."""
    worker = Worker(lambda: load_model(folder, name=name), **settings)
    threads = blas_threads_for(worker.model.engine.weight_bytes, blas_threads)
    set_blas_threads(threads)
    worker.model.engine.set_threads(threads)  # as the deployment does
    while (tokens := conn.recv()) is not None:
        conn.send(asyncio.run(in_process(worker, tokens)))
    worker.close()


class InProcess:
    """The worker in its own clean process, with the served worker's settings."""

    def __init__(self, folder: Path, name: str, settings: dict,
                 blas_threads: int | None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_in_process_child, daemon=True,
                                args=(child, str(folder), name, settings, blas_threads))
        self.proc.start()

    def run(self, tokens: int) -> tuple[float, float]:
        self.conn.send(tokens)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(30)


async def sse_lines(port: int, path: str, body: dict) -> AsyncIterator[bytes]:
    """The lines of a streamed response, read from a plain socket (HTTP/1.1, chunked).

    A client library's own cost per response (httpx: about 2 ms here) is not the serving
    path's, so the timed requests use this minimal reader."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower(), head
        rest = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            *lines, rest = (rest + (await reader.readexactly(size + 2))[:-2]).split(b"\n")
            for line in lines:
                yield line
    finally:
        writer.close()


async def get_once(port: int, path: str) -> float:
    """Seconds for one GET, on a plain socket like `sse_lines`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    await reader.read()  # until the server closes
    elapsed = time.perf_counter() - t0
    writer.close()
    return elapsed


async def over_http(port: int, model: str, tokens: int) -> tuple[float, float]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "seed": 1,
            "ignore_eos": True, "temperature": 1.0, "stream": True}
    t0 = time.perf_counter()
    first = None
    async for line in sse_lines(port, "/v1/completions", body):
        if first is None and line.startswith(b"data: {") and b'"text":""' not in line:
            first = time.perf_counter()
    end = time.perf_counter()
    return first - t0, (tokens - 1) / (end - first)


async def concurrent(client: httpx.AsyncClient, n: int, tokens: int) -> float:
    body = {"model": "flm-tiny", "messages": MSG, "max_tokens": tokens, "seed": 1,
            "ignore_eos": True, "stream": True}

    async def one():
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for _ in r.aiter_lines():
                pass

    t0 = time.perf_counter()
    await asyncio.gather(*[one() for _ in range(n)])
    return n * tokens / (time.perf_counter() - t0)


async def sequential(client: httpx.AsyncClient, n: int, tokens: int) -> float:
    body = {"model": "flm-tiny", "messages": MSG, "max_tokens": tokens, "seed": 1,
            "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    for _ in range(n):
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for _ in r.aiter_lines():
                pass
    return n * tokens / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tokens and streams (CI)")
    ap.add_argument("--blas-threads", type=int, default=0,
                    help="the workers' blas_threads setting (0: the app default)")
    ap.add_argument("--stream-interval-ms", type=float, default=None,
                    help="the workers' stream_interval_ms (default: the app's default)")
    ap.add_argument("--max-messages-per-s", type=float, default=None,
                    help="the workers' max_messages_per_s (default: the app's default)")
    ap.add_argument("--python-proxy", action="store_true",
                    help="HTTP through Serve's Python proxy actor instead of configs/serve.env's "
                         "HAProxy ingress (Ray's default)")
    args = ap.parse_args()
    tokens = 48 if args.quick else 256
    streams = 8 if args.quick else 32
    rounds = 1 if args.quick else 9
    cache = Path(tempfile.mkdtemp(prefix="flm-bench-"))
    from npu.engine.cpu_kernels import seed_cache

    seed_cache(cache)  # the workers load this process's kernel build, not their own
    os.environ["FLM_CACHE"] = str(cache)
    tiny = ensure_tiny(cache)
    medium = cache / "medium"
    build_tiny(medium, MEDIUM)

    import ray
    from ray import serve

    from deployments.app import ModelEntry, build_app
    from deployments.launch.serve_env import free_port, serve_environ

    if not args.python_proxy:  # serve as `make serve` does (configs/serve.env)
        os.environ.update(serve_environ(os.environ, private_ports=True))
    path = "Serve's Python proxy" if args.python_proxy else "HAProxy ingress"

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"FLM_CACHE": str(cache)}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    opts: dict = {"blas_threads": args.blas_threads or None}
    if args.stream_interval_ms is not None:
        opts["stream_interval_ms"] = args.stream_interval_ms
    if args.max_messages_per_s is not None:
        opts["max_messages_per_s"] = args.max_messages_per_s
    serve.run(build_app({"models": [
        {"name": "flm-tiny", "path": str(tiny), "max_batch": 32, "max_queued": 64, **opts},
        {"name": "medium", "path": str(medium), "max_batch": 4, **opts},
        # the same model leaving a core to Ray and Serve: their own CPU use apart, what
        # does the serving path cost?
        {"name": "medium-1t", "path": str(medium), "max_batch": 4, **opts,
         "blas_threads": 1},
        # the default model (SmolLM2-135M, Q4_1 GGUF) on the compiled kernels
        {"name": "smollm2", "path": "smollm2-135m", "max_batch": 4, **opts}]}), name="bench",
        route_prefix="/")
    # the in-process worker gets the served worker's settings and BLAS threads
    entry = ModelEntry(name="x", path="x", **opts)
    settings = {"stream_interval_s": entry.stream_interval_ms / 1000,
                "max_messages_per_s": entry.max_messages_per_s}
    threads = str(entry.blas_threads or default_threads())
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads  # read by the in-process child when it starts
    url = f"http://127.0.0.1:{port}"

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            floor = []
            for _ in range(20):
                floor.append(await get_once(port, "/health"))
            print(f"GET /health through Serve, {path} (the HTTP path's floor): "
                  f"{1000 * statistics.median(floor):.1f} ms median")
            for name, folder, blas in (("flm-tiny", tiny, entry.blas_threads),
                                       ("medium", medium, entry.blas_threads),
                                       ("medium-1t", medium, 1),
                                       ("smollm2", "smollm2-135m", entry.blas_threads)):
                worker = InProcess(folder, name, settings, blas)
                worker.run(8)  # warm up both paths
                await over_http(port, name, 8)
                inp, http = [], []
                for r in range(rounds):  # interleaved: the machine's drift hits both
                    # OpenBLAS's threads spin for about 0.1 s after their last product: on
                    # 2 cores the other side's spinning threads would halve the next
                    # run's first steps (session 2 measured that as 100 ms of "added"
                    # TTFT on the medium model), so each side starts on a quiet machine;
                    # the sides take turns going first
                    for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                        await asyncio.sleep(SETTLE_S)
                        if side == 0:
                            inp.append(worker.run(tokens))
                        else:
                            http.append(await over_http(port, name, tokens))
                worker.close()
                ttft_in, rate_in = (statistics.median(x) for x in zip(*inp))
                ttft_http, rate_http = (statistics.median(x) for x in zip(*http))
                # each round's pair measured back to back: the median of the paired ratios
                # (and differences) is steadier than a ratio of medians on a noisy machine
                ratios = sorted(h[1] / i[1] for i, h in zip(inp, http))
                added = statistics.median(h[0] - i[0] for i, h in zip(inp, http))
                print(f"{name:9s} in-process {rate_in:8.1f} tok/s ({1000 / rate_in:6.2f} ms/tok)"
                      f" | HTTP stream {rate_http:8.1f} tok/s | ratio "
                      f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"
                      f" | TTFT in-process {1000 * ttft_in:5.1f} ms, HTTP "
                      f"{1000 * ttft_http:5.1f} ms, added {1000 * added:5.1f} ms"
                      f" (medians of {rounds} paired rounds)")
            await concurrent(client, 4, 8)
            agg = await concurrent(client, streams, tokens)
            seq = await sequential(client, streams, tokens)
            print(f"{streams} streams: concurrent {agg:8.1f} tok/s vs one at a time "
                  f"{seq:8.1f} tok/s | ratio {agg / seq:.2f} (target >= 4)")

    asyncio.run(run())
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
