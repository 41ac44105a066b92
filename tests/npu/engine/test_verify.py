"""Speculative decoding's engine side (NumpyEngine.verify and rewind): drafted tokens
verified in one forward give the logits decoding them one by one gives, and taking rejected
ones back leaves the sequence and the prefix cache as if they had never been written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npu import ModelError, load_model
from npu.engine.kv_cache import BLOCK
from npu.engine.quant import QT
from tests.npu.gguf_files import tiny_tokenizer_meta, write_random_gguf


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_dir) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("verify-models")
    meta = tiny_tokenizer_meta(tiny_dir)
    return {f"{arch}-{q.name}": write_random_gguf(folder / f"{arch}-{q.name}.gguf", arch, q,
                                                   seed=5, tokenizer_meta=meta)
            for arch, q in (("llama", QT.Q8_0), ("gemma3", QT.Q4_1), ("lfm2", QT.Q8_0))}


def _decoded(engine, sid, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The logits after each of `tokens`, decoded one at a time after `prompt`."""
    engine.prefill(sid, prompt)
    rows = [engine.decode([sid], [t])[0] for t in tokens]
    engine.release(sid)
    return np.array(rows)


@pytest.mark.parametrize("name", ["llama-Q8_0", "gemma3-Q4_1"])
def test_verified_rows_are_the_decoded_ones_bit_for_bit(models, name) -> None:
    engine = load_model(models[name], prefix_cache=False).engine
    prompt, other = list(range(3, 13)), [7, 8, 9]
    tokens = [40, 41, 40, 41, 42, 43, 44, 45]
    expected = _decoded(engine, "ref", prompt, tokens)
    expected_other = _decoded(engine, "ref", other, [5])
    engine.prefill("a", prompt)
    engine.prefill("b", other)
    rows = engine.verify([("b", [5]), ("a", tokens)])  # a one-token piece beside drafts
    assert np.array_equal(rows[0], expected_other[0])
    assert np.array_equal(rows[1:], expected)
    # rejected drafts taken back: the next tokens decode as if they had never been fed
    engine.rewind("a", len(prompt) + 3)
    assert engine.length("a") == len(prompt) + 3
    other_tail = [50, 51]
    expected = _decoded(engine, "ref", prompt + tokens[:3], other_tail)
    got = np.array([engine.decode(["a"], [t])[0] for t in other_tail])
    assert np.array_equal(got, expected)


def test_rewind_forgets_a_cached_block_it_will_overwrite(models) -> None:
    """Drafts that fill a block name it in the prefix cache; taken back to inside that block,
    the name goes (the sequence writes other tokens there), and a later prompt that starts
    with the rejected drafts computes them afresh: same logits as an engine without cache."""
    engine = load_model(models["llama-Q8_0"]).engine
    fresh = load_model(models["llama-Q8_0"], prefix_cache=False).engine
    prompt = list(range(100, 100 + BLOCK - 4))
    drafts = [60, 61, 62, 63, 64, 65, 66]  # positions 12..19: block 0 fills up
    engine.prefill("a", prompt)
    engine.verify([("a", drafts)])
    assert engine.cached_prefix(prompt + drafts + [1]) == BLOCK
    engine.rewind("a", len(prompt) + 2)
    assert engine.cached_prefix(prompt + drafts + [1]) == 0
    kept = prompt + drafts[:2]
    tail = [70, 71, 72, 73, 74, 75]  # overwrite the rest of block 0 and go on
    for t in tail:
        engine.decode(["a"], [t])
    engine.release("a")
    for ids in (prompt + drafts + [1], kept + tail + [2]):
        got = engine.reuse_prefix("b", ids)
        logits = engine.prefill("b", ids[got:])
        assert np.array_equal(logits, fresh.prefill("b", ids)), (ids, got)
        engine.release("b")
        fresh.release("b")
    usage = engine.kv_usage()
    assert usage["sequences"] == 0 and usage["kv_blocks"] == 0


def test_a_model_with_state_outside_the_kv_cannot_rewind(models) -> None:
    engine = load_model(models["lfm2-Q8_0"]).engine
    assert not engine.can_rewind
    engine.prefill("a", [1, 2, 3])
    engine.verify([("a", [4, 5])])
    with pytest.raises(ModelError):
        engine.rewind("a", 4)
