"""LoadOptions: how a model is loaded and held, apart from where it is (`load_model`'s path
and device). Spelled once: a server's worker config extends it."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class LoadOptions(msgspec.Struct, kw_only=True):
    """Attributes:
        chat_template: a Jinja file used instead of the model's own chat template.
        quantize: "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "f16" or "bf16": a Hugging Face
            checkpoint's matrices are held in this block format (quantized at load; a GGUF
            file keeps its own formats).
        kv_cache_bytes: the KV cache's budget in bytes (default: eight full contexts, at
            most a quarter of the host's memory); past it, the least recently used cached
            prefixes are dropped, and a request that still does not fit waits.
        prefix_cache: keep finished requests' KV so a later prompt that starts alike (the
            next turn of a conversation, the same system prompt and tools) computes only its
            new tokens.
        kv_cache_type: the CPU engine's KV cache for a model in integer block formats (a
            GGUF file): "f16" (the default, as llama.cpp's), or "q8_0" (llama.cpp's
            `--cache-type-k q8_0 --cache-type-v q8_0`, Ollama's OLLAMA_KV_CACHE_TYPE=q8_0):
            8-bit codes with a scale per 32 values, about half the memory, and half the bytes
            a decode step reads at long contexts, for slightly different numbers.
        kernel_dir: NPU: the kernel directory (npu1/ and/or npu2/ with a version 2
            manifest.json each; see npu.xrt.manifest).
        npu_mode: NPU: "linear" (linear layers on the NPU), "block" (attention and MLP
            blocks), "layer" (whole decoder layers, KV cache on the device) or "auto" (the
            most fused the kernel directory has for the model).
        backend: the CPU engine's linear layers: "cpu" (the compiled kernels) or
            "reference" (numpy, float32: the oracle).
        rerank: serve a decoder as a reranker (Qwen3-Reranker, whose config.json says
            only Qwen3ForCausalLM; vLLM's hf_overrides say the same): a query-document
            pair is scored P(true) of the last token's logits of `rerank_tokens` in its
            prompt (npu.load.pooling). A GGUF file with pooling_type 4 or a cls.output
            head (llama.cpp's converted Qwen3-Reranker) is one without it.
        rerank_tokens: `rerank`'s answer tokens, false then true, as the vocabulary spells
            them (vLLM's classifier_from_token; quote them in YAML, where no and yes are
            booleans).
    """

    chat_template: str | None = None
    quantize: str | None = None
    kv_cache_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] | None = None
    prefix_cache: bool = True
    kv_cache_type: Literal["f16", "q8_0"] = "f16"
    kernel_dir: str | None = None
    npu_mode: Literal["auto", "linear", "block", "layer"] = "auto"
    backend: Literal["cpu", "reference"] = "cpu"
    rerank: bool = False
    rerank_tokens: tuple[str, str] = ("no", "yes")
