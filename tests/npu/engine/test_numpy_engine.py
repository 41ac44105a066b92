"""NumpyEngine against transformers: the shared tiny checkpoints, our own tiny configs built
with transformers here, and the real stories260K model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import ContextLengthError, NumpyEngine, config_from_json, load_model
from npu.engine import numpy_engine
from npu.load.safetensors import load_weights
from tests.shared import SHARED

TINY = SHARED / "models" / "tiny-random"
STORIES = SHARED / "models" / "stories260K"
TOL = 1e-4  # max |ours - theirs| relative to the largest |logit|
needs_models = pytest.mark.skipif(not TINY.exists(), reason=f"{TINY} is absent")


def _engine(folder: Path) -> NumpyEngine:
    config = config_from_json(json.loads((folder / "config.json").read_text()))
    return NumpyEngine(config, load_weights(folder))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@needs_models
@pytest.mark.parametrize("arch", ["qwen3", "llama3", "gemma3", "lfm2", "gpt_oss"])
def test_shared_tiny_checkpoints_match_transformers(arch: str) -> None:
    folder = TINY / arch
    engine = _engine(folder)
    ids = np.load(folder / "input_ids.npy").tolist()
    ref = np.load(folder / "logits.npy")
    for t in range(1, len(ids) + 1):  # prefill of every prefix
        engine.release("p")
        assert _rel(engine.prefill("p", ids[:t]), ref[t - 1]) < TOL
    engine.prefill("d", ids[:4])  # then the cached decode path
    for t in range(4, len(ids)):
        assert _rel(engine.decode(["d"], [ids[t]])[0], ref[t]) < TOL
    greedy = json.loads((folder / "greedy.json").read_text())
    logits = engine.prefill("g", greedy["prompt_ids_for_generate"])
    out = []
    for _ in range(len(greedy["greedy_12"])):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(["g"], [out[-1]])[0]
    assert out == greedy["greedy_12"]


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} is absent")
@pytest.mark.parametrize("variant", ["hf-f32", "hf-bf16"])
def test_stories260k_greedy_reproduces_its_reference(variant: str) -> None:
    model = load_model(STORIES / variant)
    source = (STORIES / "SOURCE.txt").read_text()
    want = json.loads(source.split("the 33 token ids\n")[1].split("\n")[0])
    logits = model.engine.prefill("s", model.prompt_ids(""))
    out = []
    for _ in range(33):
        out.append(int(np.argmax(logits)))
        logits = model.engine.decode(["s"], [out[-1]])[0]
    assert out == want
    det = model.tokenizer.detokenizer()
    text = "".join(det.push(t) for t in out) + det.flush()
    assert text == ("Once upon a time, there was a little girl named Lily. She loved to play "
                    "outside in the park. One day")


# -- our own configs, checked against transformers in this run ------------------------------
ORACLE_CONFIGS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, rope_theta=1e6, tie_word_embeddings=False)),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=1e4, tie_word_embeddings=True)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, rope_theta=5e5, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=24, sliding_window=5, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        hidden_size=48, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, conv_L_cache=3, layer_types=["conv", "full_attention", "conv"])),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=5, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 8.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False})),
}


@pytest.fixture(scope="module")
def oracle_models(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = {}
    for name, (cfg_cls, model_cls, kwargs) in ORACLE_CONFIGS.items():
        torch.manual_seed(7)
        cfg = getattr(transformers, cfg_cls)(vocab_size=128, max_position_embeddings=128,
                                             initializer_range=0.2, **kwargs)
        cfg._attn_implementation = "eager"
        model = getattr(transformers, model_cls)(cfg).eval()
        if name == "qwen2-bias":
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                 layer.self_attn.v_proj):
                        proj.bias.normal_(0, 0.5)
        if name == "gpt_oss":  # large expert activations, so the SwiGLU clamps at +-7 bind
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.mlp.experts.gate_up_proj.mul_(40.0)
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        ids = torch.tensor([[3, 17, 99, 5, 64, 8, 8, 120, 33, 2, 77, 41, 19, 6, 100, 55,
                             12, 90, 1, 70, 25, 44, 9, 11, 60, 31, 81, 7, 118, 50]])
        with torch.no_grad():
            logits = model(ids).logits[0].numpy()
        out[name] = (folder, ids[0].tolist(), logits)
    return out


@pytest.mark.parametrize("name", list(ORACLE_CONFIGS))
def test_engine_matches_transformers_on_our_configs(oracle_models, name: str) -> None:
    folder, ids, ref = oracle_models[name]
    engine = _engine(folder)
    assert _rel(engine.prefill("a", ids[:10]), ref[9]) < TOL
    for t in range(10, 30):  # 20 decode steps
        assert _rel(engine.decode(["a"], [ids[t]])[0], ref[t]) < TOL


@pytest.mark.parametrize("name", ["gemma3", "lfm2", "gpt_oss"])
def test_batched_decode_equals_one_at_a_time(oracle_models, name: str) -> None:
    folder, ids, _ = oracle_models[name]
    engine = _engine(folder)
    lengths = [3, 9, 14]
    single = []
    for i, n in enumerate(lengths):
        engine.prefill(("one", i), ids[:n])
        single.append(engine.decode([("one", i)], [ids[n]])[0])
    for i, n in enumerate(lengths):
        engine.prefill(("batch", i), ids[:n])
    batch = engine.decode([("batch", i) for i in range(3)], [ids[n] for n in lengths])
    for i in range(3):
        assert _rel(batch[i], single[i]) < 1e-5


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "lfm2", "gpt_oss"])
def test_batches_with_gaps_and_reused_slots_match_the_oracle(oracle_models, name: str) -> None:
    """Sequences come and go: a batch whose cache slots have gaps (a released sequence, one
    still waiting for its prompt) and a new sequence in a reused slot all decode exactly as
    transformers does; the whole cache is returned when the last one goes."""
    folder, ids, ref = oracle_models[name]
    engine = _engine(folder)
    engine.prefill("a", ids[:4])
    engine.prefill("gone", ids[:6])
    engine.prefill("b", ids[:8])
    engine.prefill("waiting", ids[:2])  # in the slot range, not in the batches below
    engine.release("gone")
    engine.prefill("new", ids[:10])  # takes the freed slot
    at = {"a": 4, "b": 8, "new": 10}
    for _ in range(6):
        names = sorted(at, reverse=True)  # not in slot order
        out = engine.decode(names, [ids[at[n]] for n in names])
        for row, n in enumerate(names):
            assert _rel(out[row], ref[at[n]]) < TOL
            at[n] += 1
    engine.fork("b", "b2")
    assert _rel(engine.decode(["b2"], [ids[at["b"]]])[0], ref[at["b"]]) < TOL
    for n in ("a", "b", "new", "waiting", "b2"):
        engine.release(n)
    usage = engine.kv_usage()
    assert usage["sequences"] == usage["kv_blocks"] == 0


@pytest.mark.parametrize("name", ["lfm2", "gemma3", "gpt_oss"])
def test_prompts_prefilled_together_match_the_oracle(oracle_models, name: str) -> None:
    folder, ids, ref = oracle_models[name]
    engine = _engine(folder)
    engine.prefill("started", ids[:3])
    out = engine.prefill_many([("started", ids[3:9]), ("one", ids[:1]), ("new", ids[:12])])
    for row, end in enumerate((9, 1, 12)):
        assert _rel(out[row], ref[end - 1]) < TOL
    out = engine.decode(["new", "started"], [ids[12], ids[9]])
    assert _rel(out[0], ref[12]) < TOL and _rel(out[1], ref[9]) < TOL
    with pytest.raises(ValueError):
        engine.prefill_many([("x", ids[:2]), ("x", ids[2:4])])
    # every row (a prompt's own logprobs): the logits after each token, pieces in order
    rows = engine.prefill_many([("all", ids[:7]), ("all1", ids[:1])], every_row=True)
    assert rows.shape[0] == 8
    assert max(_rel(rows[i], ref[i]) for i in range(7)) < TOL and _rel(rows[7], ref[0]) < TOL


def test_chunked_prefill_equals_one_chunk(oracle_models, monkeypatch) -> None:
    folder, ids, ref = oracle_models["lfm2"]
    engine = _engine(folder)
    monkeypatch.setattr(numpy_engine, "PREFILL_CHUNK", 4)
    assert _rel(engine.prefill("c", ids[:23]), ref[22]) < TOL


def test_context_length_is_enforced(oracle_models) -> None:
    folder, ids, _ = oracle_models["qwen3"]
    engine = _engine(folder)
    with pytest.raises(ContextLengthError) as err:
        engine.prefill("x", list(range(10)) * 13)
    assert err.value.limit == 128 and err.value.requested == 130
    engine.prefill("y", ids[:27] * 4 + ids[:20])  # 128 tokens: exactly full
    with pytest.raises(ContextLengthError):
        engine.decode(["y"], [1])


def test_release_frees_and_unknown_sequence_is_an_error(oracle_models) -> None:
    folder, ids, _ = oracle_models["llama3"]
    engine = _engine(folder)
    engine.prefill("z", ids[:5])
    assert engine.length("z") == 5
    used = engine.kv_usage()
    assert used["sequences"] == used["kv_blocks"] == 1 and used["kv_bytes"] > 0
    engine.release("z")
    assert engine.length("z") == 0  # 5 tokens fill no block: nothing is kept
    assert engine.kv_usage() == {"sequences": 0, "kv_blocks": 0, "cached_blocks": 0,
                                 "kv_bytes": 0}
    with pytest.raises(KeyError):
        engine.decode(["z"], [1])
    engine.release("never-seen")


def test_the_cpu_engine_is_an_engine(tmp_path) -> None:
    """What the worker uses of an engine (npu.engine.protocol.Engine), the CPU engine has."""
    from npu import load_model
    from npu.engine.protocol import Engine
    from npu.load.tiny import ensure_tiny

    engine = load_model(ensure_tiny(tmp_path / "cache")).engine
    assert isinstance(engine, Engine)
    assert engine.kv_max_blocks > 0
    engine.check_device()
