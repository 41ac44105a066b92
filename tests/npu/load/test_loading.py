"""Model directories: config styles, weight formats, shards, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from npu import ModelError, config_from_json, load_model
from npu.load.safetensors import load_weights

BASE = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 4, "vocab_size": 32}


def test_both_rope_styles_read_the_same() -> None:
    old = config_from_json({**BASE, "rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}})
    new = config_from_json({**BASE, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
        "original_max_position_embeddings": 64}})
    assert old.rope == new.rope
    assert new.rope["default"].theta == 5e5 and new.rope["default"].kind == "llama3"


def test_unsupported_architecture_is_named() -> None:
    with pytest.raises(ModelError, match="MambaForCausalLM"):
        config_from_json({**BASE, "architectures": ["MambaForCausalLM"]})
    with pytest.raises(ModelError, match="longrope"):
        config_from_json({**BASE, "rope_parameters": {"rope_type": "longrope"}})
    with pytest.raises(ModelError, match="hidden_size"):
        config_from_json({k: v for k, v in BASE.items() if k != "hidden_size"})


def test_a_config_without_architectures_is_read_by_its_model_type() -> None:
    """As transformers reads it: `model_type` names the architecture when `architectures`
    is missing (the message said "'qwen3' is not supported (supported: ..., Qwen3...)")."""
    bare = {k: v for k, v in BASE.items() if k != "architectures"}
    assert config_from_json({**bare, "model_type": "qwen3"}) == config_from_json(BASE)
    with pytest.raises(ModelError, match="'mamba' is not supported"):
        config_from_json({**bare, "model_type": "mamba"})


def test_bf16_and_fp16_become_float32(tmp_path: Path) -> None:
    x = np.array([[1.5, -2.25], [3.0e4, 1e-3]], dtype=np.float32)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    import struct

    def write(path: Path, name: str, dtype: str, raw: bytes, shape) -> None:
        header = json.dumps({name: {"dtype": dtype, "shape": list(shape),
                                    "data_offsets": [0, len(raw)]}}).encode()
        path.write_bytes(struct.pack("<Q", len(header)) + header + raw)

    write(tmp_path / "a.safetensors", "w_bf16", "BF16", bf16.tobytes(), x.shape)
    save_file({"w_fp16": x.astype(np.float16)}, str(tmp_path / "b.safetensors"))
    w = load_weights(tmp_path)
    assert w["w_bf16"].dtype == np.float32 and np.allclose(w["w_bf16"], x, rtol=1e-2)
    assert w["w_fp16"].dtype == np.float32 and np.allclose(w["w_fp16"], x, rtol=1e-3)


def test_sharded_weights_follow_the_index(tmp_path: Path) -> None:
    save_file({"a": np.ones(3, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": np.zeros(2, np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert sorted(load_weights(tmp_path)) == ["a", "b"]
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match="missing"):
        load_weights(tmp_path)


@pytest.mark.parametrize("remove,message", [
    ("config.json", "config.json is missing"),
    ("tokenizer.json", "tokenizer.json is missing"),
    ("model.safetensors", "no \\*.safetensors"),
])
def test_missing_files_are_named(tmp_path: Path, tiny_dir: Path, remove: str,
                                 message: str) -> None:
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    (folder / remove).unlink()
    with pytest.raises(ModelError, match=message):
        load_model(folder)


def test_missing_tensor_is_named(tmp_path: Path, tiny_dir: Path) -> None:
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    w = load_weights(folder)
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match="model.layers.1.mlp.up_proj.weight"):
        load_model(folder)


def test_not_a_directory() -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_model("/nonexistent/model")


def test_gpt_oss_with_mxfp4_experts_is_refused_by_name() -> None:
    from npu import NumpyEngine

    raw = {**BASE, "architectures": ["GptOssForCausalLM"], "num_local_experts": 2,
           "num_experts_per_tok": 1, "attention_bias": True, "tie_word_embeddings": False}
    config = config_from_json(raw)
    H, hd, E = 8, 4, 2
    f = np.zeros
    w = {"model.embed_tokens.weight": f((32, H)), "lm_head.weight": f((32, H)),
         "model.norm.weight": f(H)}
    p = "model.layers.0."
    for n in ("input_layernorm", "post_attention_layernorm"):
        w[p + n + ".weight"] = f(H)
    for n, rows in (("q", 2 * hd), ("k", hd), ("v", hd)):
        w[p + f"self_attn.{n}_proj.weight"] = f((rows, H))
        w[p + f"self_attn.{n}_proj.bias"] = f(rows)
    w[p + "self_attn.o_proj.weight"], w[p + "self_attn.o_proj.bias"] = f((H, 2 * hd)), f(H)
    w[p + "self_attn.sinks"] = f(2)
    w[p + "mlp.router.weight"], w[p + "mlp.router.bias"] = f((E, H)), f(E)
    w[p + "mlp.experts.gate_up_proj_blocks"] = np.zeros((E, 32, 1, 16), np.uint8)
    with pytest.raises(ModelError, match="MXFP4"):
        NumpyEngine(config, w)


def test_named_templates_keep_the_default_and_tool_use(tmp_path: Path, tiny_dir: Path) -> None:
    """tokenizer_config.json's `chat_template` as a list of named templates (Hermes-3's):
    "default" is the model's template, "tool_use" the one a conversation with tools renders
    with (it was dropped: Hermes-3 could not be given tools)."""
    import shutil

    folder = tmp_path / "named"
    shutil.copytree(tiny_dir, folder)
    config_path = folder / "tokenizer_config.json"
    tok = json.loads(config_path.read_text())
    tok["chat_template"] = [{"name": "default", "template": "{{ messages[0].content }}"},
                            {"name": "tool_use", "template": "{{ tools | length }}"}]
    config_path.write_text(json.dumps(tok))
    model = load_model(folder)
    assert model.template.source == "{{ messages[0].content }}"
    assert model.tool_template.source == "{{ tools | length }}"
    tok["chat_template"] = "{{ messages[0].content }}"
    config_path.write_text(json.dumps(tok))
    assert load_model(folder).tool_template is None
