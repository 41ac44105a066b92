"""NumpyEngine speed on a Qwen3-0.6B-shaped model (random weights, the real shapes), beside
this machine's memory bandwidth measured in the same run.

Printed: decode tokens/s for one sequence and its ratio to the bandwidth bound (weight bytes
per token / bandwidth); aggregate tokens/s for 8 concurrent sequences and its ratio to one;
prefill tokens/s for a 512-token prompt; peak memory against the fp32 weights plus KV cache;
then the sampler's cost per decode step (`sample_rows` for a batch vs one row at a time) at
this vocabulary and at a small one.

    python bench/bench_engine.py            # Qwen3-0.6B shapes (about 3 GB of fp32 weights)
    python bench/bench_engine.py --quick    # a small model, to check the script works
    python bench/bench_engine.py --sampling-only   # the sampler alone, 49k / 152k / 262k
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu import NumpyEngine, config_from_json  # noqa: E402
from npu.sampler import Sampler, SamplingParams, sample_rows  # noqa: E402

SAMPLING = {"temperature 1": {"temperature": 1.0},  # the OpenAI API's default: no nucleus
            "plain": {"temperature": 0.7, "top_p": 0.9},
            "top-k + penalty": {"temperature": 0.8, "top_k": 40, "top_p": 0.9,
                                "repetition_penalty": 1.1}}

QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024,
             "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
             "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
             "tie_word_embeddings": True}
QUICK = {**QWEN3_06B, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 8192}


def random_weights(c: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]

    def mat(rows: int, cols: int) -> np.ndarray:
        m = rng.standard_normal((rows, cols), dtype=np.float32)
        m *= np.float32(cols ** -0.5)
        return m

    w = {"model.embed_tokens.weight": mat(c["vocab_size"], H),
         "model.norm.weight": np.ones(H, np.float32)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": np.ones(H, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(H, np.float32),
                  p + "self_attn.q_proj.weight": mat(nq * hd, H),
                  p + "self_attn.k_proj.weight": mat(nkv * hd, H),
                  p + "self_attn.v_proj.weight": mat(nkv * hd, H),
                  p + "self_attn.o_proj.weight": mat(H, nq * hd),
                  p + "self_attn.q_norm.weight": np.ones(hd, np.float32),
                  p + "self_attn.k_norm.weight": np.ones(hd, np.float32),
                  p + "mlp.gate_proj.weight": mat(inter, H),
                  p + "mlp.up_proj.weight": mat(inter, H),
                  p + "mlp.down_proj.weight": mat(H, inter)})
    return w


def bandwidth_gbs(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Memory read bandwidth as decode sees it: the best of `repeat` BLAS matrix-vector
    products over a float32 matrix much larger than the caches (all threads BLAS uses)."""
    a = np.ones((nbytes // 4 // 1024, 1024), dtype=np.float32)
    x = np.ones((1, 1024), dtype=np.float32)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        x @ a.T
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def decode_rate(engine: NumpyEngine, batch: int, steps: int, prompt: list[int]) -> float:
    ids = [("b", batch, i) for i in range(batch)]
    for sid in ids:
        engine.prefill(sid, prompt)
    tokens = [1] * batch
    engine.decode(ids, tokens)  # warm up
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = engine.decode(ids, tokens)
        tokens = [int(t) for t in np.argmax(logits, axis=-1)]
    dt = time.perf_counter() - t0
    for sid in ids:
        engine.release(sid)
    return batch * steps / dt


def sampling_ms(vocab: int, rows: int, options: dict, repeat: int) -> tuple[float, float]:
    """Milliseconds per decode step to sample `rows` rows: (sample_rows, one at a time)."""
    logits = np.random.default_rng(2).standard_normal((rows, vocab), dtype=np.float32) * 3
    prompt = list(range(200))
    both = []
    for batched in (True, False):
        samplers = [Sampler(SamplingParams(seed=i, **options), vocab, prompt)
                    for i in range(rows)]
        t0 = time.perf_counter()
        for r in range(repeat + 1):
            if r == 1:  # the first round warms up
                t0 = time.perf_counter()
            if batched:
                sample_rows(samplers, logits)
            else:
                [s.sample(logits[i]) for i, s in enumerate(samplers)]
        both.append((time.perf_counter() - t0) / repeat * 1000)
    return both[0], both[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small model (CI)")
    ap.add_argument("--sampling-only", action="store_true",
                    help="only the sampler's lines, over more vocabularies (SmolLM2's 49,152, "
                         "Qwen3's 151,936, Gemma 3's 262,144)")
    args = ap.parse_args()
    if args.sampling_only:
        sampling_lines((49152, 151936, 262144), 5 if args.quick else 20)
        return 0
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the interpreter
    raw = QUICK if args.quick else QWEN3_06B
    steps = 8 if args.quick else 24
    config = config_from_json(raw)
    bw = bandwidth_gbs(1 << 28 if args.quick else 1 << 30)  # before the model: not in its peak
    t0 = time.perf_counter()
    engine = NumpyEngine(config, random_weights(raw, np.random.default_rng(0)))
    weight_bytes = engine.weight_bytes
    print(f"model: {'quick' if args.quick else 'Qwen3-0.6B'} shapes, fp32 weights "
          f"{weight_bytes / 1e9:.2f} GB, built in {time.perf_counter() - t0:.1f} s")
    bound = bw * 1e9 / weight_bytes
    print(f"memory read bandwidth: {bw:.1f} GB/s -> decode bound {bound:.1f} tok/s")
    prompt = list(range(16))
    one = decode_rate(engine, 1, steps, prompt)
    print(f"decode, 1 sequence:   {one:7.2f} tok/s   ratio to bound {one / bound:.2f} "
          "(target >= 0.8)")
    eight = decode_rate(engine, 8, steps, prompt)
    print(f"decode, 8 sequences:  {eight:7.2f} tok/s   ratio to 1 sequence {eight / one:.2f} "
          "(target >= 2.5)")
    long_prompt = list(np.random.default_rng(1).integers(0, raw["vocab_size"], 512))
    engine.prefill("warm", long_prompt[:32])
    engine.release("warm")
    t0 = time.perf_counter()
    engine.prefill("p", long_prompt)
    rate = 512 / (time.perf_counter() - t0)
    kv_bytes = (2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
                * (512 + 9 * (16 + steps + 1)))
    engine.release("p")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    print(f"prefill, 512 tokens:  {rate:7.1f} tok/s")
    print(f"peak memory above the interpreter {peak / 1e9:.2f} GB = "
          f"{peak / (weight_bytes + kv_bytes):.2f}x (fp32 weights + KV cache) (target <= 1.3)")
    sampling_lines((raw["vocab_size"], 1920), 5 if args.quick else 20)
    return 0


def sampling_lines(vocabs: tuple[int, ...], repeat: int) -> None:
    for vocab in vocabs:
        for name, options in SAMPLING.items():
            for rows in (1, 8, 32):
                batched, single = sampling_ms(vocab, rows, options, repeat)
                print(f"sampling {rows:2d} rows, vocab {vocab:6d}, {name:15s}: batched "
                      f"{batched:6.2f} ms, one row at a time {single:6.2f} ms "
                      f"({single / batched:.2f}x)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
