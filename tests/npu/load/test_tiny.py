"""flm-tiny: generated deterministically, a hermes_json model with reasoning."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chat import FormatKind, detect_format
from npu import load_model
from npu.load.tiny import ensure_tiny


def test_generation_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    again = ensure_tiny(tmp_path)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes()


def test_tiny_is_a_hermes_model_with_reasoning_and_tools(tiny_dir: Path) -> None:
    model = load_model(tiny_dir)
    spec = detect_format(model.chat_template_source, model.tokenizer.is_token)
    assert spec.kind is FormatKind.HERMES_JSON and spec.reasoning and spec.thinking_switch
    assert model.tools_enabled()
    assert model.thinking_enabled() and not model.thinking_enabled(False)
    assert all(model.tokenizer.is_token(t) for t in ("<think>", "</tool_call>", "<|im_end|>"))
    prompt = model.render([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tiny_runs(tiny_dir: Path) -> None:
    model = load_model(tiny_dir)
    ids = model.prompt_ids(model.render([{"role": "user", "content": "Weather in Oslo?"}]))
    logits = model.engine.prefill("t", ids)
    assert logits.shape == (model.config.vocab_size,) and np.isfinite(logits).all()
    assert model.eos_token_ids == (model.tokenizer.id_of("<|im_end|>"),
                                   model.tokenizer.id_of("<|endoftext|>"))
