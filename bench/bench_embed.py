"""Embeddings: throughput, and what they cost a stream decoding beside them, side by side.

1. Throughput through the worker (actors.worker.Worker, no Ray: what a replica runs):
   inputs of 128 tokens in requests of 1, 32 and 256 inputs, on the default model's GGUF
   (SmolLM2-135M, Q4_1: a decoder, mean pooling) and on a random BERT-base-shaped encoder
   (12 layers, 768 wide, Q8_0 and F32). Beside each, in the same run where installed:
   llama.cpp's embedding on the same GGUF (llama-cpp-python `Llama(embedding=True).embed`)
   and sentence-transformers' forward (transformers' BertModel in torch, mean pooling) on
   the same BERT shape (the peers are for bench/ only).
2. A stream beside embeddings: one stream's tokens per second (request to last token)
   alone, then sent while a request of 256 inputs is being embedded, in turns: the ratio
   (target >= 0.7: the worker gives embedding steps a bounded share of the decode loop,
   actors.embedding).
3. A stream beside one long input: the input's embedding time alone, then a stream sent
   while that input's forward runs: its first token's wait, the longest wait between its
   tokens and its time to its end against the same stream's alone (the worker runs a
   forward a few steps at a time: `Engine.embed_steps`). `--long N` sets the input's tokens (default
   4,096; 1,000 with --quick).

    .venv/bin/python bench/bench_embed.py            # full (a few minutes)
    .venv/bin/python bench/bench_embed.py --quick    # flm-tiny and a tiny encoder (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.events import (  # noqa: E402
    CompletionGenerate,
    Deltas,
    Embeddings,
    EmbedGenerate,
    Finished,
)
from actors.worker import Worker  # noqa: E402
from npu import LoadOptions, load_model  # noqa: E402


def inputs(n: int, tokens: int, vocab: int, seed: int) -> list[list[int]]:
    """`n` token-id inputs of `tokens` tokens each (ids from the middle of the vocabulary:
    no special tokens)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(vocab // 4, vocab // 2, size=tokens).tolist() for _ in range(n)]


def texts(worker: Worker, n: int, tokens: int, seed: int) -> list[str]:
    """`n` texts of about `tokens` tokens each (random ids decoded: the same file's
    tokenizer on both sides reads them back to about as many)."""
    tok = worker.model.tokenizer
    return [tok.decode(ids) for ids in inputs(n, tokens, worker.model.config.vocab_size, seed)]


async def embed(worker: Worker, items: list) -> tuple[np.ndarray, int]:
    """The vectors of `items` and the tokens they took."""
    req = EmbedGenerate(request_id="b", inputs=items)
    events = [e async for batch in worker.generate(req) for e in batch]
    emb = next(e for e in events if isinstance(e, Embeddings))
    vectors = np.frombuffer(emb.vectors, dtype="<f4").reshape(len(items), emb.dims)
    return vectors, sum(emb.tokens)


def throughput(worker: Worker, batches: list[list]) -> float:
    """Input tokens per second, one request per batch, one after another."""
    async def run() -> float:
        await embed(worker, batches[0][:1])  # warm
        t0, tokens = time.perf_counter(), 0
        for items in batches:
            tokens += (await embed(worker, items))[1]
        return tokens / (time.perf_counter() - t0)

    return asyncio.run(run())


def llama_cpp_rate(path: Path, batches: list[list[str]], ctx: int) -> float | None:
    """llama.cpp's embedding of the same texts, mean-pooled as ours, on every core."""
    try:
        from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama
    except ImportError:
        return None
    llm = Llama(str(path), embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN, n_ctx=ctx,
                n_batch=ctx, n_ubatch=ctx, n_threads=os.cpu_count(),
                n_threads_batch=os.cpu_count(), verbose=False)
    llm.embed(batches[0][:1])
    t0, tokens = time.perf_counter(), 0
    for items in batches:
        tokens += llm.embed(items, return_count=True)[1]
    return tokens / (time.perf_counter() - t0)


def sentence_transformers_rate(folder: Path, batch: int, tokens: int,
                               rounds: int) -> float | None:
    """What sentence-transformers runs for a BERT model with mean pooling: transformers'
    BertModel forward in torch, then the mean (its own package is not needed for that)."""
    try:
        import torch
        from transformers import AutoModel
    except ImportError:
        return None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModel.from_pretrained(folder).eval()
    vocab = model.config.vocab_size

    def run(r: int, n: int = batch) -> None:
        ids = torch.tensor(inputs(n, tokens, vocab, r))
        with torch.no_grad():
            model(input_ids=ids).last_hidden_state.mean(dim=1)

    run(0, 1)
    t0 = time.perf_counter()
    for r in range(rounds):
        run(r)
    return rounds * batch * tokens / (time.perf_counter() - t0)


def stream_rate(worker: Worker, tokens: int, embed_batch: int, embed_tokens: int,
                beside: bool) -> float:
    """Tokens per second of one stream, from its request to its last token, alone or sent
    once a request of `embed_batch` inputs is under way (cancelled at the stream's end)."""
    story = CompletionGenerate(request_id="s", prompt="Once upon a time", max_tokens=tokens,
                               ignore_eos=True, temperature=0)
    vocab = worker.model.config.vocab_size

    async def run() -> float:
        side = None
        if beside:
            side = asyncio.ensure_future(embed(worker, inputs(embed_batch, embed_tokens,
                                                              vocab, 1)))
            while worker.embedder.forward is None and not side.done():
                await asyncio.sleep(0.001)  # until its forward is under way
        sent = last = time.perf_counter()
        async for batch in worker.generate(story):
            if any(isinstance(ev, (Deltas, Finished)) for ev in batch):
                last = time.perf_counter()
        if side is not None:
            side.cancel()
            await asyncio.gather(side, return_exceptions=True)
        return tokens / (last - sent)

    return asyncio.run(run())


def stream_times(worker: Worker, tokens: int, beside: list | None,
                 alone_s: float) -> tuple[float, float, float]:
    """A stream of `tokens` tokens: seconds to its first token, the longest wait between its
    tokens (as delivered) and seconds to its end; with `beside`, sent a quarter of
    `alone_s` (at most 0.5 s) after an embedding request of those inputs was."""
    story = CompletionGenerate(request_id="s", prompt="Once upon a time", max_tokens=tokens,
                               ignore_eos=True, temperature=0)

    async def run() -> tuple[float, float, float]:
        embedding = None
        if beside is not None:
            embedding = asyncio.ensure_future(embed(worker, beside))
            await asyncio.sleep(min(0.5, alone_s / 4))  # the input's forward is under way
        sent = time.perf_counter()
        times = []
        async for batch in worker.generate(story):
            if any(isinstance(ev, (Deltas, Finished)) for ev in batch):
                times.append(time.perf_counter())
        if embedding is not None:
            await embedding
        gaps = np.diff(times) if len(times) > 1 else np.zeros(1)
        return times[0] - sent, float(gaps.max()), times[-1] - sent

    return asyncio.run(run())


def beside_long_input(worker: Worker, long_tokens: int, stream_tokens: int) -> None:
    """Prints what one input of `long_tokens` tokens takes alone, and a stream alone and
    sent while that input's forward runs."""
    item = inputs(1, long_tokens, worker.model.config.vocab_size, 7)
    t0 = time.perf_counter()
    asyncio.run(embed(worker, item))
    took = time.perf_counter() - t0
    first0, gap0, end0 = stream_times(worker, stream_tokens, None, took)
    first, gap, end = stream_times(worker, stream_tokens, item, took)
    print(f"one {long_tokens}-token input alone {took:.2f} s; a {stream_tokens}-token stream "
          f"alone: first token {first0:.2f} s, longest wait {gap0:.2f} s, end {end0:.2f} s; "
          f"sent during the input: first token {first:.2f} s, longest wait {gap:.2f} s, end "
          f"{end:.2f} s: ratio {end0 / end:.2f} (alone / beside, time to its end)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny models, few rounds (CI)")
    ap.add_argument("--stream-only", action="store_true",
                    help="only parts 2 and 3: a stream beside embeddings")
    ap.add_argument("--long", type=int, default=None,
                    help="part 3's input, in tokens (default 4096; 1000 with --quick)")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="flm-bench-embed-"))
    from tests.bert_model import build_bert

    if args.quick:
        decoder, tokens, batches, stream_tokens = "flm-tiny", 32, (1, 8), 48
        min_inputs = 8  # inputs a figure is measured over (batches of 1: that many requests)
        bert = build_bert(cache / "bert")
    else:
        decoder, tokens, batches, stream_tokens = "smollm2-135m", 128, (1, 32, 256), 256
        min_inputs = 32
        bert = build_bert(cache / "bert", dims={  # BERT-base's shape
            "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "max_position_embeddings": 512})
    shape = "tiny" if args.quick else "BERT-base-shaped"
    print(f"inputs of about {tokens} tokens; {os.cpu_count()} cores; tokens/s of inputs; "
          f"bert: a random {shape} encoder")
    print(f"{'model':28s} {'batch':>5s} {'flm tok/s':>10s} {'peer tok/s':>10s} {'ratio':>6s}")
    dec = Worker(lambda: load_model(decoder, name=decoder), max_batch=4)
    gguf = dec.model.path
    for b in batches if not args.stream_only else ():
        rounds = max(1, min_inputs // b)
        work = [texts(dec, b, tokens, r) for r in range(rounds)]
        ours = throughput(dec, work)
        peer = llama_cpp_rate(gguf, work, 4096) if gguf.suffix == ".gguf" else None
        ratio = f"{ours / peer:6.2f}" if peer else "   n/a"
        print(f"{decoder + ' (llama.cpp)':28s} {b:5d} {ours:10.0f} "
              f"{peer or float('nan'):10.0f} {ratio}  ratio (ours / peer)")
    for quant in ("Q8_0", "F32") if not args.stream_only else ():  # each block format
        options = LoadOptions(quantize=None if quant == "F32" else quant.lower())
        enc = Worker(lambda o=options: load_model(bert, "cpu", o, name="bert"), max_batch=4)
        vocab = enc.model.config.vocab_size
        for b in batches:
            rounds = max(1, min_inputs // b)
            ours = throughput(enc, [inputs(b, tokens, vocab, r) for r in range(rounds)])
            peer = sentence_transformers_rate(bert, b, tokens, rounds)
            ratio = f"{ours / peer:6.2f}" if peer else "   n/a"
            print(f"{'bert ' + quant + ' (torch)':28s} {b:5d} {ours:10.0f} "
                  f"{peer or float('nan'):10.0f} {ratio}  ratio (ours / peer)")
        enc.close()
    # the worker paces embedding steps by their measured cost: measure it first
    asyncio.run(embed(dec, inputs(4, tokens, dec.model.config.vocab_size, 0)))
    stream_rate(dec, stream_tokens, batches[-1], tokens, beside=False)  # warm
    ratios = []
    for _ in range(3):  # in turns: the machine's pace drifts
        alone = stream_rate(dec, stream_tokens, batches[-1], tokens, beside=False)
        beside = stream_rate(dec, stream_tokens, batches[-1], tokens, beside=True)
        ratios.append(beside / alone)
        print(f"stream alone {alone:.1f} tok/s, beside embeddings {beside:.1f} tok/s: ratio "
              f"{beside / alone:.2f}")
    print(f"stream beside embeddings: median ratio {sorted(ratios)[1]:.2f} (target >= 0.7)")
    long_tokens = args.long or (1000 if args.quick else 4096)
    beside_long_input(dec, long_tokens, stream_tokens)
    dec.close()


if __name__ == "__main__":
    main()
