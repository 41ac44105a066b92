"""A small random gpt-oss model directory (experts, sinks, YaRN) with the harmony markers in
its tokenizer and our own harmony template: for the Worker tests and the served app."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from npu.load.tiny import ensure_tiny

HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>",
           "<|constrain|>"]
TEMPLATE = """
{%- if tools -%}<|start|>developer<|message|># Tools
{{ tools | tojson }}<|end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}
"""
LIGHT = {"type": "function", "function": {"name": "light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}


def build_gpt_oss(folder: Path, cache: Path) -> None:
    """Write the model into `folder` (new); `cache` holds flm-tiny, whose tokenizer it extends."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(ensure_tiny(cache) / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY])
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in HARMONY}
    vocab = (tok.get_vocab_size(with_added_tokens=True) + 63) // 64 * 64
    H, inter, heads, kv, hd, experts = 64, 64, 4, 2, 16, 4
    config = {"architectures": ["GptOssForCausalLM"], "hidden_size": H,
              "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "num_local_experts": experts,
              "num_experts_per_tok": 2, "sliding_window": 8, "vocab_size": vocab,
              "layer_types": ["sliding_attention", "full_attention"],
              "max_position_embeddings": 4096, "attention_bias": True,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
              "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 32.0,
                                  "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "truncate": False},
              "eos_token_id": [ids["<|return|>"], ids["<|call|>"]]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|return|>", "chat_template": TEMPLATE}))
    rng = np.random.default_rng(3)

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(vocab, H), "lm_head.weight": mat(vocab, H),
         "model.norm.weight": np.ones(H, np.float32)}
    for i in range(2):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        for n, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
            w[p + f"self_attn.{n}_proj.weight"] = mat(rows, H)
            w[p + f"self_attn.{n}_proj.bias"] = mat(rows)
        w[p + "self_attn.o_proj.weight"] = mat(H, heads * hd)
        w[p + "self_attn.o_proj.bias"] = mat(H)
        w[p + "self_attn.sinks"] = mat(heads)
        w[p + "mlp.router.weight"], w[p + "mlp.router.bias"] = mat(experts, H), mat(experts)
        w[p + "mlp.experts.gate_up_proj"] = mat(experts, H, 2 * inter)
        w[p + "mlp.experts.gate_up_proj_bias"] = mat(experts, 2 * inter)
        w[p + "mlp.experts.down_proj"] = mat(experts, inter, H)
        w[p + "mlp.experts.down_proj_bias"] = mat(experts, H)
    save_file(w, str(folder / "model.safetensors"))
