"""A models_dir model's time to first token, cold (its load included) and warm, against the
same file served pinned (loaded at start) in the same run, and its load alone in-process
and in llama.cpp (llama-cpp-python, when `make bench-peer` has installed it).

    python bench/bench_library.py            # SmolLM2-135M (Q4_1), 20 warm requests each
    python bench/bench_library.py --quick    # 6 warm requests each
    python bench/bench_library.py --model llama-8b:Q4_K_M --cold-only
        # an 8B-shaped Q4_K_M file (bench/gguf_shapes.py, random weights): its loads and
        # cold time to first token, then 2 warm library requests (no pinned copy: one
        # 4.5 GB model in the app at a time)

The warm ratio (library / pinned median time to first token) must stay near 1: a library
model, once loaded, takes the same path as a pinned one, plus Serve's multiplexed routing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

PROMPT = [{"role": "user", "content": "Write one sentence about cats."}]


async def ttft(client: httpx.AsyncClient, model: str, chat: bool = True) -> float:
    """Seconds from sending a streamed chat request (a completion of the same text, for a
    file with no chat template) to its first content chunk."""
    body = {"model": model, "max_tokens": 4, "stream": True, "temperature": 0,
            **({"messages": PROMPT} if chat else {"prompt": PROMPT[0]["content"]})}
    start = time.perf_counter()
    first = None
    path, key = ("/v1/chat/completions", '"content"') if chat else ("/v1/completions", '"text"')
    async with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():  # read to the end: the next request starts idle
            if first is None and line.startswith("data: {") and key in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError(f"{model}: no content")
    return first


def peer_load(path: Path, chat: bool) -> float | None:
    """llama.cpp's load of the same file and its first token (None: not installed)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    start = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, verbose=False)
    if chat:
        llm.create_chat_completion(messages=PROMPT, max_tokens=1)
    else:
        llm.create_completion(PROMPT[0]["content"], max_tokens=1)
    return time.perf_counter() - start


def model_file(name: str) -> Path:
    """The GGUF file `--model` names: the default model, a file, or a shape:format written by
    bench/gguf_shapes.py (once, into the cache)."""
    if name == "smollm2-135m":
        from npu.load.loader import default_model_path

        return Path(default_model_path())
    if Path(name).expanduser().is_file():
        return Path(name).expanduser()
    from bench.gguf_shapes import shaped_gguf

    shape, _, fmt = name.partition(":")
    return shaped_gguf(shape, fmt or "Q4_0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer warm requests (CI)")
    ap.add_argument("--model", default="smollm2-135m",
                    help="smollm2-135m, a GGUF file, or a bench/gguf_shapes.py shape:format "
                         "such as llama-8b:Q4_K_M")
    ap.add_argument("--cold-only", action="store_true",
                    help="no pinned copy: the loads, the cold request and 2 warm ones")
    args = ap.parse_args()
    warm_n = 2 if args.cold_only else 6 if args.quick else 20

    from npu import load_model

    source = model_file(args.model)
    folder = Path(tempfile.mkdtemp(prefix="flm-bench-library-"))
    (folder / "bench-lib.gguf").symlink_to(source)
    with open(source, "rb") as f:  # every load below reads the file from the page cache
        while f.read(1 << 24):
            pass
    start = time.perf_counter()
    model = load_model(source)
    in_process = time.perf_counter() - start
    chat = model.template is not None  # (a gguf_shapes file has none: completions)
    del model  # (an 8B model: one copy in memory at a time)
    peer = peer_load(source, chat)
    print(f"{source.name}: load in-process {in_process:.2f} s; "
          + (f"llama.cpp load + first token {peer:.2f} s" if peer is not None
             else "llama.cpp: not installed (make bench-peer)"), flush=True)

    import logging

    import ray
    from ray import serve

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from deployments.app import build_app
    from deployments.launch.serve_env import free_port, serve_environ

    os.environ.update(serve_environ(os.environ, private_ports=True))  # as `make serve`
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    try:
        pinned_models = [] if args.cold_only else [
            {"name": "pinned", "path": str(source), "max_batch": 4}]
        serve.run(build_app({"models": pinned_models, "models_dir": str(folder),
                             "library": {"max_batch": 4}}),
                  name="bench", route_prefix="/")

        async def run() -> tuple[float, list[float], list[float]]:
            async with httpx.AsyncClient(base_url=url, timeout=1800) as client:
                if not args.cold_only:
                    await ttft(client, "pinned", chat)  # its first-request costs
                cold = await ttft(client, "bench-lib", chat)
                lib, pinned = [], []
                for _ in range(warm_n):  # interleaved: both see the same machine
                    lib.append(await ttft(client, "bench-lib", chat))
                    if not args.cold_only:
                        pinned.append(await ttft(client, "pinned", chat))
                return cold, lib, pinned

        cold, lib, pinned = asyncio.run(run())
    finally:
        serve.shutdown()
        ray.shutdown()

    lib_ms = statistics.median(lib) * 1e3
    print(f"cold time to first token through Serve (load included): {cold:.2f} s, "
          f"ratio to the in-process load {cold / in_process:.2f}"
          + (f", to llama.cpp's load + first token {cold / peer:.2f}" if peer else ""))
    if args.cold_only:
        print(f"warm time to first token, median of {warm_n}: library {lib_ms:.1f} ms; "
              f"cold - warm (the load through Serve): {cold - lib_ms / 1e3:.2f} s, ratio to "
              f"the in-process load {(cold - lib_ms / 1e3) / in_process:.2f}")
        return 0
    pinned_ms = statistics.median(pinned) * 1e3
    ratio = lib_ms / pinned_ms
    print(f"warm time to first token, median of {warm_n}: library {lib_ms:.1f} ms, "
          f"pinned {pinned_ms:.1f} ms, ratio {ratio:.2f}")
    print(f"target {'met' if ratio <= 1.15 else 'MISSED'}: warm library / pinned <= 1.15")
    return 0


if __name__ == "__main__":
    sys.exit(main())
