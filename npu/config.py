"""ModelConfig: a Hugging Face config.json read into the fields the engines use.

Both RoPE styles are read: `rope_theta`/`rope_scaling` and transformers-5's
`rope_parameters` (flat, or one entry per layer type as Gemma 3 writes it).
"""

from __future__ import annotations

from typing import Any

import msgspec

from npu.errors import ModelError

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "Gemma3ForCausalLM": "gemma3",
    "Lfm2ForCausalLM": "lfm2",
    "GptOssForCausalLM": "gpt_oss",
}
# encoders: embedding models without a generation head (npu.engine.encoder)
ENCODER_ARCHITECTURES = {"BertModel": "bert", "NomicBertModel": "nomic_bert"}
ENCODERS = frozenset(ENCODER_ARCHITECTURES.values())


def architectures_of(raw: dict[str, Any]) -> list[str]:
    """A config.json's architectures; without any, the one its `model_type` names among
    those run here (as transformers' Auto classes read a config without them)."""
    archs = raw.get("architectures") or []
    if archs:
        return list(archs)
    kind = raw.get("model_type")
    return [a for a, t in {**ARCHITECTURES, **ENCODER_ARCHITECTURES}.items() if t == kind][:1]


class Rope(msgspec.Struct, frozen=True, kw_only=True):
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None  # None: from factor (0.1 ln(factor) + 1)
    # per-dimension divisors of the frequencies (a GGUF's rope_freqs tensor: llama.cpp's form
    # of Llama 3's scaling)
    freq_factors: tuple[float, ...] = ()


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    layer_types: tuple[str, ...]
    rope: dict[str, Rope]  # per layer type
    qk_norm: bool = False
    attention_bias: bool = False
    activation: str = "silu"
    query_scale: float = 0.0  # 0: head_dim ** -0.5
    sliding_window: int = 0
    conv_kernel: int = 0
    # mixture of experts (gpt-oss): experts, experts per token, the clamped SwiGLU
    num_experts: int = 0
    experts_per_token: int = 0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_sinks: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # encoders (BERT family): token-type embeddings, learned absolute positions (BERT) or
    # rotary ones (nomic-bert); `rms_eps` is then their LayerNorms' epsilon
    type_vocab_size: int = 0
    absolute_positions: bool = False

    def rope_for(self, layer: int) -> Rope:
        kind = self.layer_types[layer]
        return self.rope.get(kind) or self.rope["default"]


def _rope(params: dict[str, Any]) -> Rope:
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", "linear", "llama3", "yarn"):
        raise ModelError(f"config.json: rope_type {kind!r} is not supported "
                         "(supported: default, linear, llama3, yarn)")
    if kind == "yarn" and params.get("mscale") and params.get("mscale_all_dim"):
        raise ModelError("config.json: yarn's mscale/mscale_all_dim are not supported")
    attention_factor = params.get("attention_factor")
    return Rope(
        theta=float(params.get("rope_theta", 10000.0)),
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        attention_factor=None if attention_factor is None else float(attention_factor),
        freq_factors=tuple(float(f) for f in params.get("freq_factors") or ()),
    )


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def config_from_json(raw: dict[str, Any]) -> ModelConfig:
    """Read a config.json dict.

    Raises:
        ModelError: the architecture is not supported, or a required key is missing.
    """
    archs = architectures_of(raw)
    encoder = next((ENCODER_ARCHITECTURES[a] for a in archs if a in ENCODER_ARCHITECTURES),
                   None)
    if encoder is not None:
        return _encoder_config(raw, encoder)
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        known = ", ".join(sorted({**ARCHITECTURES, **ENCODER_ARCHITECTURES}))
        raise ModelError(f"config.json: architecture {archs or raw.get('model_type')!r} is not "
                         f"supported (supported: {known})")
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        layers = int(raw["num_hidden_layers"])
        vocab = int(raw["vocab_size"])
        inter = int(raw["intermediate_size"])
    except KeyError as exc:
        raise ModelError(f"config.json: missing key {exc.args[0]!r}") from None
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    head_dim = int(raw.get("head_dim") or hidden // heads)
    layer_types = raw.get("layer_types")
    if arch == "gemma3" and not layer_types:
        pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                       for i in range(layers)]
    if arch == "lfm2" and not layer_types:
        full = set(raw.get("full_attn_idxs") or [])
        layer_types = ["full_attention" if i in full else "conv" for i in range(layers)]
    layer_types = tuple(layer_types or ["full_attention"] * layers)
    rope: dict[str, Rope] = {}
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        for kind, sub in params.items():
            rope[kind] = _rope(sub)
        rope["default"] = rope.get("full_attention") or next(iter(rope.values()))
    elif isinstance(params, dict) and params:
        rope["default"] = _rope(params)
    else:
        base = {"rope_theta": raw.get("rope_theta", 10000.0)}
        scaling = raw.get("rope_scaling") or {}
        rope["default"] = _rope({**scaling, **base})
        if arch == "gemma3":
            rope["sliding_attention"] = Rope(theta=float(raw.get("rope_local_base_freq", 10000.0)))
    if arch == "lfm2" and raw.get("block_auto_adjust_ff_dim"):
        inter = int(2 * inter / 3)
        mult = raw.get("block_ffn_dim_multiplier")
        if mult is not None:
            inter = int(float(mult) * inter)
        multiple = int(raw.get("block_multiple_of", 256))
        inter = multiple * ((inter + multiple - 1) // multiple)
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    if activation not in ("silu", "gelu_pytorch_tanh", "gelu"):
        raise ModelError(f"config.json: activation {activation!r} is not supported")
    query_scale = 0.0
    if arch == "gemma3":
        query_scale = float(raw.get("query_pre_attn_scalar") or head_dim) ** -0.5
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_eps=float(raw.get("rms_norm_eps") or raw.get("norm_eps") or 1e-6),
        max_position=int(raw.get("max_position_embeddings") or 4096),
        tie_embeddings=bool(raw.get("tie_word_embeddings", arch != "llama")),
        layer_types=layer_types,
        rope=rope,
        qk_norm=arch in ("qwen3", "gemma3", "lfm2"),
        attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
        activation=activation,
        query_scale=query_scale,
        sliding_window=(int(raw.get("sliding_window") or 0)
                        if arch in ("gemma3", "gpt_oss") else 0),
        conv_kernel=int(raw.get("conv_L_cache") or 3) if arch == "lfm2" else 0,
        num_experts=int(raw.get("num_local_experts") or 0) if arch == "gpt_oss" else 0,
        experts_per_token=int(raw.get("num_experts_per_tok") or 0) if arch == "gpt_oss" else 0,
        swiglu_alpha=float(raw.get("swiglu_alpha") or 1.702),
        swiglu_limit=float(raw.get("swiglu_limit") or 7.0),
        attention_sinks=arch == "gpt_oss",
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_ids(raw.get("eos_token_id")),
    )


def _encoder_config(raw: dict[str, Any], arch: str) -> ModelConfig:
    """A BERT-family config.json: BertModel's keys, or NomicBertModel's (GPT-2 style names:
    n_embd, n_head, n_layer, n_inner, n_positions, rotary_emb_base)."""

    def key(*names: str, default: Any = ...) -> Any:
        for n in names:
            if raw.get(n) is not None:
                return raw[n]
        if default is ...:
            raise ModelError(f"config.json: missing key {names[0]!r}")
        return default

    hidden = int(key("hidden_size", "n_embd"))
    heads = int(key("num_attention_heads", "n_head"))
    layers = int(key("num_hidden_layers", "n_layer"))
    nomic = arch == "nomic_bert"
    activation = str(key("hidden_act", "activation_function", default="gelu"))
    if activation not in (("swiglu",) if nomic else ("gelu",)):
        raise ModelError(f"config.json: activation {activation!r} is not supported for {arch} "
                         f"({'swiglu' if nomic else 'gelu'})")
    if not nomic and key("position_embedding_type", default="absolute") != "absolute":
        raise ModelError("config.json: BERT position_embedding_type "
                         f"{raw['position_embedding_type']!r} is not supported (absolute)")
    if nomic and (float(key("rotary_emb_fraction", default=1.0)) != 1.0
                  or key("rotary_emb_interleaved", default=False)
                  or key("prenorm", default=False) or key("moe_every_n_layers", default=0)):
        raise ModelError("config.json: nomic-bert with a partial or interleaved rotary "
                         "embedding, pre-norm layers or experts is not supported")
    theta = float(key("rotary_emb_base", default=10000.0))
    return ModelConfig(
        arch=arch,
        vocab_size=int(key("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(key("intermediate_size", "n_inner", default=4 * hidden)),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        rms_eps=float(key("layer_norm_eps", "layer_norm_epsilon", default=1e-12)),
        max_position=int(key("max_position_embeddings", "n_positions", default=512)),
        tie_embeddings=False,
        layer_types=("full_attention",) * layers,
        rope={"default": Rope(theta=theta)},
        attention_bias=True,
        activation="silu" if nomic else "gelu",
        type_vocab_size=int(key("type_vocab_size", default=0)),
        absolute_positions=not nomic,
    )
