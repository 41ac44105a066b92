"""The shapes a model asks of NPU kernels: what a kernel directory must have been built for.

`linear_shapes(config)`: every (n, k) of the linear layers the XRT engine offloads (attention
projections, LFM2's convolution projections, the MLP, the lm_head); `layer_dims`: the
dimensions of the layer ops for a Llama / Qwen3 model, or why the model cannot use them.
"""

from __future__ import annotations

from npu.config import ModelConfig
from npu.xrt.layer_pack import LayerDims

LAYER_ARCHS = ("llama", "qwen3")


def linear_shapes(c: ModelConfig) -> list[tuple[int, int]]:
    H, hd = c.hidden_size, c.head_dim
    out = set()
    for kind in c.layer_types:
        if kind == "conv":
            out |= {(3 * H, H), (H, H)}
        else:
            out |= {((c.num_heads + 2 * c.num_kv_heads) * hd, H), (H, c.num_heads * hd)}
    if not c.num_experts:
        out |= {(2 * c.intermediate_size, H), (H, c.intermediate_size)}
    out.add((c.vocab_size, H))
    return sorted(out)


def layer_support(c: ModelConfig) -> str | None:
    """None when the layer ops can run this model's layers, else why not."""
    if c.arch not in LAYER_ARCHS:
        return f"the layer ops run {' and '.join(LAYER_ARCHS)} layers, not {c.arch}"
    if c.attention_bias:
        return "the layer ops have no attention bias"
    if any(k != "full_attention" for k in c.layer_types):
        return "the layer ops run full attention only (no sliding window)"
    if c.activation != "silu":
        return f"the layer ops' MLP is SwiGLU, not {c.activation}"
    return None


def layer_dims(c: ModelConfig, ctx: int) -> LayerDims:
    return LayerDims(hidden=c.hidden_size, heads=c.num_heads, kv_heads=c.num_kv_heads,
                     head_dim=c.head_dim, ffn=c.intermediate_size, ctx=ctx,
                     qk_norm=c.qk_norm)
