"""flm-tiny: the embedded default model, generated deterministically on first use.

A small Qwen3-architecture model with random weights (fixed seed), a byte-level BPE
tokenizer trained with `tokenizers` on `data/tiny_corpus.txt`, and our own ChatML template
with `<think>` and `<tool_call>` tokens (a hermes_json model with reasoning). It exists so
that every part of the system runs for real with no download; its output is noise.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from npu.config import ModelConfig, config_from_json
from npu.paths import cache_dir

VERSION = "1"
SEED = 20261202
DATA = Path(__file__).resolve().parent / "data"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>"]
DIMS = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "max_position_embeddings": 4096}
VOCAB = 2048


def ensure_tiny(root: Path | None = None) -> Path:
    """The flm-tiny model directory, generated if it is not in the cache yet."""
    root = root or cache_dir()
    folder = root / f"flm-tiny-v{VERSION}"
    if (folder / "model.safetensors").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".flm-tiny-", dir=root))
    try:
        build_tiny(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process won the race
            if not (folder / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _train_tokenizer(added: tuple[str, ...] = ()):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIAL) - len(MARKERS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = (DATA / "tiny_corpus.txt").read_text(encoding="utf-8")
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in MARKERS + list(added)])
    return tok


def tiny_config(root: Path | None = None) -> ModelConfig:
    """flm-tiny's config (the model made first if needed): what a simulated NPU's kernel
    directory is built for (npu.xrt.sim_kernels.make_kernel_dir)."""
    return config_from_json(json.loads((ensure_tiny(root) / "config.json").read_text()))


def build_tiny(folder: Path, dims: dict | None = None, added: tuple[str, ...] = ()) -> None:
    """Write the model directory into `folder` (`dims` overrides the shapes, for benches;
    `added`: more tokens after flm-tiny's own, as a code model's FIM tokens, for tests)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(tuple(added))
    tok.save(str(folder / "tokenizer.json"))
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = (size + 63) // 64 * 64
    ids = {t: tok.token_to_id(t) for t in SPECIAL + MARKERS + list(added)}
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **DIMS, **(dims or {}),
        "vocab_size": vocab, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "hidden_act": "silu", "attention_bias": False, "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"], "dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "temperature": 0.7, "top_p": 0.9, "do_sample": True}, indent=2))
    template = (DATA / "flm_tiny_chat_template.jinja").read_text(encoding="utf-8")
    decoder = {str(ids[t]): {"content": t, "special": t in SPECIAL, "lstrip": False,
                             "rstrip": False, "normalized": False, "single_word": False}
               for t in SPECIAL + MARKERS + list(added)}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
        "model_max_length": DIMS["max_position_embeddings"], "added_tokens_decoder": decoder,
        "chat_template": template}, indent=2))
    save_file(_weights(config), str(folder / "model.safetensors"))


def _weights(config: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    H, inter = config["hidden_size"], config["intermediate_size"]
    nq, nkv, hd = (config["num_attention_heads"], config["num_key_value_heads"],
                   config["head_dim"])

    def mat(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": mat(config["vocab_size"], H, 0.5),
                                "model.norm.weight": np.ones(H, np.float32)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(nq * hd, H, H ** -0.5)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, H, H ** -0.5)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, H, H ** -0.5)
        w[p + "self_attn.o_proj.weight"] = mat(H, nq * hd, (nq * hd) ** -0.5)
        w[p + "self_attn.q_norm.weight"] = np.ones(hd, np.float32)
        w[p + "self_attn.k_norm.weight"] = np.ones(hd, np.float32)
        w[p + "mlp.gate_proj.weight"] = mat(inter, H, H ** -0.5)
        w[p + "mlp.up_proj.weight"] = mat(inter, H, H ** -0.5)
        w[p + "mlp.down_proj.weight"] = mat(H, inter, inter ** -0.5)
    return w
