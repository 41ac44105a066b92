"""Random-weight GGUF files of real models' shapes, for the benchmarks: written once into
the cache directory (bench-gguf/) and reused.

Shapes: "qwen3-0.6b" (Qwen3-0.6B: 28 layers, hidden 1024, FFN 3072, 16 / 8 heads of 128) and
"llama-8b" (Llama-3.1-8B: 32 layers, hidden 4096, FFN 14336, 32 / 8 heads of 128), both with
SmolLM2's tokenizer (49,152 tokens: the vocabulary is the only part not to scale). Blocks are
random bytes with small finite scales, so writing 4 GB takes seconds, not a quantizer's
minutes; the numbers are meaningless, the bytes moved per token are real. Formats (FORMATS):
one type for every matrix (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K), or "Q4_K_M" / "Q5_K_M",
llama.cpp's mixes of those names: Q4_K / Q5_K, with Q6_K for the output head and for attn_v
and ffn_down in the layers llama.cpp gives more bits (the first and last eighth, and every
third between).

    .venv/bin/python bench/gguf_shapes.py llama-8b Q4_0     (prints the file's path)
    .venv/bin/python bench/gguf_shapes.py --tokenizer-only OUT.gguf

The tokenizer comes from the default model's file, or from the GGUF file named by
$FLM_SHAPES_TOKENIZER: `--tokenizer-only` writes one (SmolLM2's tokenizer alone, 1.5 MB)
for a machine without the default model (bench/many_cores.sh carries it to the device).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu.paths import cache_dir  # noqa: E402

# arch, layers, hidden, ffn, heads, kv heads, head dim, context (Qwen3-0.6B's own: its
# 8,192-token prompts measured; the 8B's kept short)
SHAPES = {"qwen3-0.6b": ("qwen3", 28, 1024, 3072, 16, 8, 128, 40960),
          "llama-8b": ("llama", 32, 4096, 14336, 32, 8, 128, 4096)}
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")


# where a block's f16 scales sit, and their value (|weights| below about 0.1-0.3)
SCALES = {"Q4_0": ((0,), 0.002), "Q8_0": ((0,), 0.002), "Q4_K": ((0, 2), 1e-4),
          "Q5_K": ((0, 2), 5e-5), "Q6_K": ((208,), 1e-5)}
# llama.cpp's mixes: their main type (Q6_K where they give more bits)
MIXES = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}
FORMATS = (*SCALES, *MIXES)


def _random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype) -> np.ndarray:
    """Random blocks of `qtype` (one of SCALES) with small finite scales."""
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    out = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, value = SCALES[qtype.name]
    for i in at:
        out[:, :, i : i + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return out.reshape(rows, -1)


def _more_bits(layer: int, layers: int) -> bool:
    """The layers whose attn_v and ffn_down llama.cpp's Q4_K_M and Q5_K_M store in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _tokenizer_meta() -> dict:
    """The tokenizer's keys: from $FLM_SHAPES_TOKENIZER's file, else the default model's."""
    from npu.load.gguf_header import read_header
    from npu.load.loader import default_model_path

    source = read_header(os.environ.get("FLM_SHAPES_TOKENIZER") or default_model_path()).meta
    return {k: source[k] for k in TOKENIZER_KEYS}


def _add_tokenizer(w, meta: dict) -> None:
    w.add_string("tokenizer.ggml.model", meta["tokenizer.ggml.model"])
    w.add_string("tokenizer.ggml.pre", meta["tokenizer.ggml.pre"])
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        w.add_array(key, meta[key])
    w.add_array("tokenizer.ggml.token_type", [int(t) for t in meta["tokenizer.ggml.token_type"]])
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        w.add_uint32(key, int(meta[key]))


def tokenizer_only(out: Path) -> Path:
    """A GGUF file holding the shapes' tokenizer and nothing else ($FLM_SHAPES_TOKENIZER's
    file for a machine without the default model)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(out), "llama")
    _add_tokenizer(w, _tokenizer_meta())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def shaped_gguf(shape: str, qtype_name: str) -> Path:
    """The file for `shape` with its matrices in `qtype_name` (one of FORMATS), written if
    missing."""
    from gguf import GGMLQuantizationType, GGUFWriter

    qtype = GGMLQuantizationType[MIXES.get(qtype_name, qtype_name)]
    more = GGMLQuantizationType.Q6_K if qtype_name in MIXES else qtype
    arch, layers, H, F, nq, nkv, hd, context = SHAPES[shape]
    path = cache_dir() / "bench-gguf" / f"{shape}-{qtype_name}-{context // 1024}k.gguf"
    if path.exists():
        return path
    meta = _tokenizer_meta()
    V = len(meta["tokenizer.ggml.tokens"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(str(tmp), arch)
    w.add_name(f"random {shape}")
    for key, value in (("block_count", layers), ("context_length", context),
                       ("embedding_length", H), ("feed_forward_length", F),
                       ("attention.head_count", nq), ("attention.head_count_kv", nkv),
                       ("attention.key_length", hd), ("attention.value_length", hd)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 500000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    _add_tokenizer(w, meta)
    rng = np.random.default_rng(0)

    def mat(name: str, rows: int, cols: int, kind=qtype) -> None:
        w.add_tensor(name, _random_blocks(rng, rows, cols, kind), raw_dtype=kind)

    def vec(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    mat("token_embd.weight", V, H)
    mat("output.weight", V, H, more)
    vec("output_norm.weight", H)
    for i in range(layers):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", H)
        vec(p + "ffn_norm.weight", H)
        if arch == "qwen3":
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        mat(p + "attn_q.weight", nq * hd, H)
        mat(p + "attn_k.weight", nkv * hd, H)
        mat(p + "attn_v.weight", nkv * hd, H, more if _more_bits(i, layers) else qtype)
        mat(p + "attn_output.weight", H, nq * hd)
        mat(p + "ffn_gate.weight", F, H)
        mat(p + "ffn_up.weight", F, H)
        mat(p + "ffn_down.weight", H, F, more if _more_bits(i, layers) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)
    return path


if __name__ == "__main__":
    if sys.argv[1] == "--tokenizer-only":
        print(tokenizer_only(Path(sys.argv[2])))
    else:
        print(shaped_gguf(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "Q4_0"))
