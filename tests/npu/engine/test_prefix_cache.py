"""The paged KV cache with prefix reuse (npu.engine.kv_cache): a prompt that starts like an
earlier one computes only its new tokens, and what it computes is exactly what it would
have computed from scratch."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu import KVCacheFull, load_model
from npu.engine.kv_cache import BLOCK, BlockPool, SeqBlocks
from npu.engine.quant import QT
from tests.npu.gguf_files import tiny_tokenizer_meta, write_random_gguf


# -- the block pool alone ----------------------------------------------------------------------
def _pool(blocks: int, caching: bool = True) -> BlockPool:
    one = BlockPool([0], 1, 1, 4, 1 << 30).block_bytes
    return BlockPool([0], 1, 1, 4, blocks * one, caching=caching)


def _run(pool: BlockPool, ids: list[int]) -> SeqBlocks:
    """A sequence that reuses what it can of `ids` and writes the rest."""
    seq = SeqBlocks()
    got = pool.adopt(seq, ids)
    pool.reserve(seq, len(ids))
    pool.written(seq, ids[got:])
    return seq


def test_a_prompt_reuses_the_whole_blocks_an_earlier_one_wrote() -> None:
    pool = _pool(16)
    a = _run(pool, list(range(40)))  # blocks 0-15, 16-31 full; 32-39 partial
    pool.release(a)
    assert pool.usage()["kv_blocks"] == 0 and pool.usage()["cached_blocks"] == 2
    b = SeqBlocks()
    assert pool.adopt(b, list(range(35)) + [99]) == 32  # both full blocks, shared
    usage = pool.usage()
    assert usage["kv_blocks"] == 2 and usage["cached_blocks"] == 0
    c = SeqBlocks()
    assert pool.adopt(c, list(range(32))) == 16  # one token must be left to compute
    d = SeqBlocks()
    assert pool.adopt(d, [1] + list(range(1, 40))) == 0  # differs in the first block
    e = SeqBlocks()
    assert pool.adopt(e, list(range(16)) + [0] * 20) == 16  # the chain breaks at block 2
    for s in (b, c, d, e):
        pool.release(s)
    assert pool.held() == 0 and all(r == 0 for r in pool.refs)


def test_least_recently_used_blocks_go_first_a_sequences_tail_before_its_head() -> None:
    pool = _pool(4)
    old = _run(pool, list(range(32)))  # 2 blocks
    pool.release(old)
    new = _run(pool, list(range(100, 132)))  # 2 more: the pool is full
    pool.release(new)
    # a third needs one block: the oldest sequence's last block goes, its first stays
    third = _run(pool, list(range(200, 216)))
    probe = SeqBlocks()
    assert pool.adopt(probe, list(range(33))) == 16  # block 2 of `old` was evicted
    assert pool.adopt(SeqBlocks(), list(range(100, 133))) == 32  # `new` is whole
    pool.release(probe)
    pool.release(third)


def test_a_full_pool_of_held_blocks_raises_and_keeps_its_state() -> None:
    pool = _pool(2)
    a = _run(pool, list(range(32)))
    with pytest.raises(KVCacheFull):
        _run(pool, [7] * 5)
    assert pool.held() == 2 and len(a.table) == 2
    pool.release(a)
    _run(pool, [7] * 5)  # room again (an evicted cached block)


def test_fork_shares_full_blocks_and_copies_the_partial_one() -> None:
    pool = _pool(8)
    a = _run(pool, list(range(20)))
    pool.k[0][a.table[1], 0, :4] = 5.0
    b = pool.fork(a)
    assert b.table[0] == a.table[0] and b.table[1] != a.table[1]
    assert np.array_equal(pool.k[0][b.table[1]], pool.k[0][a.table[1]])
    assert pool.refs[a.table[0]] == 2 and pool.held() == 3
    pool.release(a)
    pool.release(b)
    assert pool.held() == 0


def test_without_caching_nothing_is_kept_and_memory_returns() -> None:
    pool = _pool(8, caching=False)
    a = _run(pool, list(range(40)))
    pool.release(a)
    assert pool.adopt(SeqBlocks(), list(range(40))) == 0
    assert pool.usage() == {"kv_blocks": 0, "cached_blocks": 0, "kv_bytes": 0}


# -- the engine: output with the cache is output without it ------------------------------------
@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory, tiny_dir) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("prefix-models")
    meta = tiny_tokenizer_meta(tiny_dir)  # a small vocabulary: quick to load
    out = {}
    for arch, qtype in (("llama", QT.Q8_0), ("qwen3", QT.Q4_0), ("gemma3", QT.Q4_1),
                        ("lfm2", QT.Q8_0), ("llama", QT.F32)):
        out[f"{arch}-{qtype.name}"] = write_random_gguf(folder / f"{arch}-{qtype.name}.gguf",
                                                        arch, qtype, seed=3,
                                                        tokenizer_meta=meta)
    return out


@pytest.fixture(scope="module")
def engine_pairs(gguf_models) -> dict:
    """Per model an engine with the cache and one without, kept across examples."""
    return {name: (load_model(f).engine, load_model(f, prefix_cache=False).engine)
            for name, f in gguf_models.items() if name in ("llama-Q8_0", "qwen3-Q4_0",
                                                           "gemma3-Q4_1")}


def _greedy(engine, sid, ids: list[int], steps: int, reuse: bool) -> tuple[list, list, int]:
    """Greedy decoding of `ids` for `steps` tokens: (tokens, logits, tokens reused)."""
    got = engine.reuse_prefix(sid, ids) if reuse else 0
    logits = engine.prefill(sid, ids[got:])
    out, rows = [], [logits]
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = engine.decode([sid], [out[-1]])[0]
        rows.append(logits)
    return out, rows, got


CONVERSATIONS = st.lists(  # turns: (tokens of the reply kept, new tokens)
    st.tuples(st.integers(0, 6), st.lists(st.integers(0, 999), min_size=1, max_size=40)),
    min_size=2, max_size=4)


@pytest.mark.parametrize("name", ["llama-Q8_0", "qwen3-Q4_0", "gemma3-Q4_1"])
@settings(max_examples=12, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(turns=CONVERSATIONS)
def test_a_conversation_decodes_exactly_as_without_the_cache(engine_pairs, name, turns) -> None:
    """Each turn's prompt is the previous prompt, part of its reply and new tokens (a chat
    whose template re-renders the reply, cut anywhere): with the cache, each turn reuses the
    earlier turns' blocks and still gives bit-identical logits and the same tokens as an
    engine that recomputes everything (quantized weights: every row's product is exact)."""
    cached, fresh = engine_pairs[name]
    cached.kv.clear()  # each example starts cold
    prompt: list[int] = []
    reply: list[int] = []
    for turn, (kept, new) in enumerate(turns):
        shared = len(prompt) + min(kept, len(reply))  # what the last turn wrote of this one
        prompt = prompt + reply[:kept] + new
        try:
            reply, rows, reused = _greedy(cached, "turn", prompt, 5, reuse=True)
            want, want_rows, none = _greedy(fresh, "turn", prompt, 5, reuse=True)
        finally:
            cached.release("turn")  # a finished request: its blocks stay cached
            fresh.release("turn")
        assert none == 0 and reply == want
        assert all(np.array_equal(a, b) for a, b in zip(rows, want_rows))
        assert reused % BLOCK == 0 and reused < len(prompt)
        assert reused >= min(shared, len(prompt) - 1) // BLOCK * BLOCK
    assert cached.kv.held() == 0 and fresh.kv.usage()["kv_bytes"] == 0


def test_a_tokens_output_does_not_depend_on_its_batch(engine_pairs) -> None:
    """With quantized weights a token's logits are the same bits whether it is decoded
    alone, in a batch, or prefilled within a chunk (what makes the KV a decode step wrote
    reusable by a later prompt)."""
    engine, _ = engine_pairs["qwen3-Q4_0"]
    ids = list(range(10, 50))
    engine.prefill("x", ids[:30])
    engine.prefill("y", ids[:7])
    alone = engine.decode(["x"], [ids[30]])[0]
    engine.release("x")
    engine.prefill("x", ids[:30])
    batched = engine.decode(["y", "x"], [ids[7], ids[30]])[1]
    chunk = engine.prefill("z", ids[:31])
    for s in ("x", "y", "z"):
        engine.release(s)
    assert np.array_equal(alone, batched) and np.array_equal(alone, chunk)


def test_float_weights_reuse_to_blas_rounding(gguf_models) -> None:
    """F32 weights run on BLAS, whose sums depend on how many rows a product has (batched
    and one-at-a-time decoding differ the same way): reuse agrees to rounding."""
    cached = load_model(gguf_models["llama-F32"]).engine
    ids = list(range(50, 120))
    _, first, _ = _greedy(cached, "a", ids, 0, reuse=True)
    cached.release("a")
    _, again, reused = _greedy(cached, "b", ids, 0, reuse=True)
    assert reused == 64
    assert np.abs(first[0] - again[0]).max() <= 1e-4 * np.abs(first[0]).max()


def test_gpt_oss_sinks_and_window_reuse_to_rounding(tmp_path, tiny_dir) -> None:
    """gpt-oss (attention sinks, sliding-window layers): its state is all in the KV, so a
    prompt reuses it; its experts multiply on BLAS (rows per expert vary with the batch), so
    the logits agree to rounding rather than bit for bit."""
    from tests.gpt_oss_model import build_gpt_oss

    build_gpt_oss(tmp_path / "m", tiny_dir.parent)
    model = load_model(tmp_path / "m", quantize="q8_0")
    engine = model.engine
    assert engine.prefix_cache
    ids = list(range(3, 60))
    first = engine.prefill("a", ids)
    engine.release("a")
    assert engine.reuse_prefix("b", ids) == 48
    again = engine.prefill("b", ids[48:])
    assert np.abs(first - again).max() <= 1e-4 * np.abs(first).max()
    engine.release("b")


def test_concurrent_sequences_share_blocks_and_fork_shares_too(gguf_models) -> None:
    engine = load_model(gguf_models["llama-Q8_0"]).engine
    fresh = load_model(gguf_models["llama-Q8_0"], prefix_cache=False).engine
    system = list(range(300, 340))  # 40 tokens: 2 full blocks
    engine.prefill("a", system + [1, 2, 3])
    assert engine.reuse_prefix("b", system + [4, 5]) == 32  # a's blocks, while a runs
    out = engine.prefill("b", system[32:] + [4, 5])
    assert np.array_equal(out, fresh.prefill("b", system + [4, 5]))
    assert engine.kv_usage()["kv_blocks"] == 3 + 1  # a: 3, b: its own third block
    engine.fork("b", "b2")  # n = 2: full blocks shared, the partial one copied
    assert engine.kv_usage()["kv_blocks"] == 5
    assert np.array_equal(engine.decode(["b2"], [9])[0], engine.decode(["b"], [9])[0])
    for s in ("a", "b", "b2"):
        engine.release(s)
    assert engine.kv.held() == 0 and engine.kv_usage()["cached_blocks"] == 2


def test_lfm2_recomputes_prompts_and_says_why(gguf_models, caplog) -> None:
    """LFM2's convolution layers carry a state that is not per-token KV: its prompts are
    never reused (a reuse would skip the state the skipped tokens leave)."""
    with caplog.at_level(logging.INFO, logger="npu.engine.numpy_engine"):
        engine = load_model(gguf_models["lfm2-Q8_0"]).engine
    assert not engine.prefix_cache
    assert "convolution" in caplog.text
    ids = list(range(40))
    engine.prefill("a", ids)
    engine.release("a")
    assert engine.reuse_prefix("b", ids) == 0 and engine.kv_usage()["cached_blocks"] == 0


def test_a_tiny_budget_evicts_and_then_refuses(gguf_models) -> None:
    """A budget of 4 blocks: a finished prompt's blocks are evicted for a new one; a prompt
    that needs more than the budget raises KVCacheFull before running anything."""
    probe = load_model(gguf_models["llama-Q8_0"]).engine
    engine = load_model(gguf_models["llama-Q8_0"], kv_cache_bytes=4 * probe.kv.block_bytes
                        ).engine
    engine.prefill("a", list(range(48)))  # 3 blocks
    engine.release("a")
    engine.prefill("b", list(range(100, 148)))  # 3 blocks: 2 of a's are evicted
    assert engine.reuse_prefix("c", list(range(48))) == 16  # a's first block survived
    engine.release("c")
    with pytest.raises(KVCacheFull):
        engine.prefill("d", list(range(500, 580)))  # 5 blocks > 4
    engine.release("d")
    engine.release("b")
    assert engine.kv.held() == 0
