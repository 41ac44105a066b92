"""Tensor roles per architecture: which Hugging Face tensor plays which part in a decoder
layer, in one table (as gguf-py's TensorNameMap keeps them), so the engine reads weights by
role. The GGUF loader maps a file's names to these Hugging Face names first."""

from __future__ import annotations

import msgspec


class Roles(msgspec.Struct, frozen=True, kw_only=True):
    """Tensor names (within `model.` / `model.layers.{i}.`) and the architecture's few
    numeric conventions.

    Attributes:
        final_norm: the norm before the head.
        norm_in: the norm before attention (or the convolution).
        norm_pre_ff: the norm before the MLP.
        norm_post_attn, norm_post_ff: Gemma's norms after attention and after the MLP.
        attn_out: the attention's output projection.
        q_norm, k_norm: per-head norms of queries and keys (where the config has them).
        mlp: the MLP's module; gate, up, down its projections.
        norm_offset: norms multiply by (1 + w) (Gemma), not w.
        scaled_embedding: embeddings are scaled by sqrt(hidden size) (Gemma).
    """

    final_norm: str = "model.norm.weight"
    norm_in: str = "input_layernorm"
    norm_pre_ff: str = "post_attention_layernorm"
    norm_post_attn: str | None = None
    norm_post_ff: str | None = None
    attn_out: str = "o_proj"
    q_norm: str = "q_norm"
    k_norm: str = "k_norm"
    mlp: str = "mlp"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    norm_offset: bool = False
    scaled_embedding: bool = False


LLAMA = Roles()  # llama, qwen2, qwen3, gpt_oss (its MLP is experts: see the engine)
ROLES: dict[str, Roles] = {
    "gemma3": Roles(norm_pre_ff="pre_feedforward_layernorm",
                    norm_post_attn="post_attention_layernorm",
                    norm_post_ff="post_feedforward_layernorm", norm_offset=True,
                    scaled_embedding=True),
    "lfm2": Roles(final_norm="model.embedding_norm.weight", norm_in="operator_norm",
                  norm_pre_ff="ffn_norm", attn_out="out_proj", q_norm="q_layernorm",
                  k_norm="k_layernorm", mlp="feed_forward", gate="w1", up="w3", down="w2"),
}


def roles_for(arch: str) -> Roles:
    """The roles of an architecture's tensors (Llama's names unless the table says)."""
    return ROLES.get(arch, LLAMA)
