"""Sampler: greedy, seeds, options, and the mask (applied to a copy, with a fallback)."""

from __future__ import annotations

import numpy as np
import pytest

from npu import Sampler, SamplingParams, logprobs
from npu.sampler import row_logprobs


def _mask(allowed: list[int], size: int) -> np.ndarray:
    bits = np.zeros((size + 31) // 32 * 32, dtype=np.uint8)
    bits[allowed] = 1
    return np.packbits(bits, bitorder="little").view(np.uint32)


def test_greedy_takes_the_argmax() -> None:
    s = Sampler(SamplingParams(temperature=0.0), 5)
    assert s.sample(np.array([0.1, 3.0, 2.0, -1.0, 0.0], np.float32)) == 1


def test_same_seed_same_tokens() -> None:
    logits = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    runs = [[Sampler(SamplingParams(seed=42), 100).sample(logits) for _ in range(1)]
            for _ in range(2)]
    a = Sampler(SamplingParams(seed=42, temperature=1.3), 100)
    b = Sampler(SamplingParams(seed=42, temperature=1.3), 100)
    assert [a.sample(logits) for _ in range(50)] == [b.sample(logits) for _ in range(50)]
    assert runs[0] == runs[1]


def test_mask_is_applied_to_a_copy() -> None:
    logits = np.array([5.0, 1.0, 4.0, 0.0], np.float32)
    before = logits.copy()
    s = Sampler(SamplingParams(temperature=0.0), 4)
    assert s.sample(logits, _mask([1, 3], 4)) == 1
    assert np.array_equal(logits, before)
    hot = Sampler(SamplingParams(temperature=5.0, seed=1), 4)
    assert {hot.sample(logits, _mask([1, 3], 4)) for _ in range(200)} <= {1, 3}


def test_nan_logits_fall_back_to_the_best_allowed_token() -> None:
    logits = np.full(8, np.nan, np.float32)
    logits[6] = 1.0
    s = Sampler(SamplingParams(temperature=0.8, seed=3), 8)
    assert s.sample(logits, _mask([2, 6], 8)) == 6
    assert Sampler(SamplingParams(temperature=0.0), 8).sample(
        np.full(8, np.nan, np.float32), _mask([5], 8)) == 5


def test_top_k_one_is_greedy_and_top_p_keeps_the_head() -> None:
    logits = np.array([1.0, 2.0, 9.0, 3.0], np.float32)
    s = Sampler(SamplingParams(top_k=1, seed=0), 4)
    assert {s.sample(logits) for _ in range(20)} == {2}
    s = Sampler(SamplingParams(top_p=0.5, seed=0), 4)
    assert {s.sample(logits) for _ in range(20)} == {2}
    s = Sampler(SamplingParams(min_p=0.5, seed=0), 4)
    assert {s.sample(logits) for _ in range(20)} == {2}


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, repetition_penalty=10.0),
    SamplingParams(temperature=0.0, frequency_penalty=5.0),
    SamplingParams(temperature=0.0, presence_penalty=5.0),
])
def test_penalties_move_away_from_used_tokens(params) -> None:
    logits = np.array([2.0, 1.9, 0.0], np.float32)
    s = Sampler(params, 3)
    first = s.sample(logits)
    s.accept(first)
    assert first == 0 and s.sample(logits) == 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_moves_the_tokens_it_names_alone_and_in_a_batch(temperature: float) -> None:
    """OpenAI's logit_bias: -100 bans a token, +100 all but forces one, a bias past the
    vocabulary is ignored; a batch samples what each row does alone."""
    from npu.sampler import sample_rows

    logits = np.array([[5.0, 4.0, 0.0, -1.0]] * 4, np.float32)
    ban = SamplingParams(temperature=temperature, seed=1, logit_bias={0: -100.0, 1: -100.0})
    force = SamplingParams(temperature=temperature, seed=2, logit_bias={3: 100.0, 9: 50.0})
    for _ in range(20):
        assert Sampler(ban, 4).sample(logits[0]) == 2
        assert Sampler(force, 4).sample(logits[0]) == 3
    rows = [Sampler(p, 4) for p in (ban, force, ban, force)]
    assert sample_rows(rows, logits) == [2, 3, 2, 3]
    assert Sampler(SamplingParams(temperature=0.0), 4).sample(logits[0]) == 0  # none: no bias


def test_repetition_penalty_counts_the_prompt() -> None:
    s = Sampler(SamplingParams(temperature=0.0, repetition_penalty=10.0), 3, prompt_ids=[0])
    assert s.sample(np.array([2.0, 1.9, 0.0], np.float32)) == 1


def test_a_windowed_penalty_reads_only_the_latest_tokens() -> None:
    """llama.cpp's and Ollama's repeat_last_n: the penalties read the last n tokens of
    prompt and output, a token leaving the window is free again; 0 turns them off."""
    logits = np.array([2.0, 1.9, 1.0, -5.0], np.float32)
    for name, value in (("repetition_penalty", 10.0), ("frequency_penalty", 5.0),
                        ("presence_penalty", 5.0)):
        s = Sampler(SamplingParams(temperature=0.0, repeat_last_n=2, **{name: value}), 4,
                    prompt_ids=[0, 3])
        assert s.sample(logits) == 1  # 0 is in the window (the prompt's)
        s.accept(3)  # the window: 3, 3
        assert s.sample(logits) == 0  # 0 has left it
        s.accept(0)
        s.accept(1)  # the window: 0, 1
        assert s.sample(logits) == 2
        off = Sampler(SamplingParams(temperature=0.0, repeat_last_n=0, **{name: value}), 4,
                      prompt_ids=[0])
        assert off.sample(logits) == 0
    whole = Sampler(SamplingParams(temperature=0.0, repetition_penalty=10.0), 4,
                    prompt_ids=[0, 3, 3, 3])
    assert whole.sample(logits) == 1  # -1: the whole sequence


def test_a_window_past_any_sequence_reads_the_whole_sequence() -> None:
    """Ollama's options.repeat_last_n 2**70 (or 1e308): the sampler failed to build (a
    deque's maxlen is a C ssize_t) and the request was a 500; now it is a window holding
    every token, prompt and output."""
    logits = np.array([2.0, 1.9, 1.0, -5.0], np.float32)
    for last_n in (2**63, 2**70, int(1e308)):
        s = Sampler(SamplingParams(temperature=0.0, repeat_last_n=last_n,
                                   presence_penalty=5.0), 4, prompt_ids=[0, 3])
        assert s.sample(logits) == 1  # 0 is in the window (the prompt's)
        s.accept(1)
        assert s.sample(logits) == 2


def test_frequency_counts_only_the_window() -> None:
    """A token written three times, the window holding two of them: penalized twice."""
    logits = np.array([2.0, 0.0, 0.0], np.float32)
    s = Sampler(SamplingParams(temperature=0.0, frequency_penalty=0.9, repeat_last_n=3), 3)
    for token in (0, 0, 0, 2):
        s.accept(token)
    x, _ = s._prepare(logits, None)
    assert x.tolist() == pytest.approx([2.0 - 2 * 0.9, 0.0, -0.9])


def test_logprobs() -> None:
    lp, top = logprobs(np.log(np.array([0.5, 0.25, 0.25], np.float32)), 1, top=2)
    assert lp == pytest.approx(np.log(0.25), abs=1e-6)
    assert top[0][0] == 0 and top[0][1] == pytest.approx(np.log(0.5), abs=1e-6)


def test_top_p_keeps_exactly_the_nucleus() -> None:
    from npu.sampler import _top_p

    rng = np.random.default_rng(0)
    for size, scale in ((50, 0.3), (5000, 0.05), (5000, 5.0)):
        probs = np.exp(rng.standard_normal(size) * scale)
        probs /= probs.sum()
        for p in (0.1, 0.5, 0.9, 0.99):
            ids, weights = _top_p(probs, p)
            order = np.argsort(-probs, kind="stable")
            cut = int(np.searchsorted(np.cumsum(probs[order]), p)) + 1
            assert set(ids.tolist()) == set(order[:cut].tolist())
            assert np.allclose(weights, probs[ids])


def test_top_k_draws_from_the_k_best_in_proportion() -> None:
    probs = np.array([0.4, 0.1, 0.25, 0.05, 0.2], np.float32)
    s = Sampler(SamplingParams(seed=0, top_k=3), 5)
    draws = np.bincount([s.sample(np.log(probs)) for _ in range(4000)], minlength=5)
    assert draws[1] == draws[3] == 0
    assert np.allclose(draws[[0, 2, 4]] / 4000, probs[[0, 2, 4]] / 0.85, atol=0.03)
    s = Sampler(SamplingParams(seed=0, top_k=2), 4)  # a tie at the k-th value keeps all tied
    draws = np.bincount([s.sample(np.array([1, 1, 1, 0], np.float32)) for _ in range(3000)],
                        minlength=4)
    assert draws[3] == 0 and np.allclose(draws[:3] / 3000, 1 / 3, atol=0.04)
    s = Sampler(SamplingParams(seed=0, top_k=3), 5)  # fewer allowed tokens than k
    assert {s.sample(np.log(probs), _mask([3], 5)) for _ in range(50)} == {3}


def test_sampling_follows_the_distribution() -> None:
    probs = np.array([0.5, 0.3, 0.2, 0.0], np.float32)
    s = Sampler(SamplingParams(seed=0), 4)
    draws = np.bincount([s.sample(np.log(probs + 1e-30)) for _ in range(4000)], minlength=4)
    assert np.allclose(draws / 4000, probs, atol=0.03) and draws[3] == 0
    s = Sampler(SamplingParams(seed=0, top_p=0.75), 4)
    assert {s.sample(np.log(probs + 1e-30)) for _ in range(300)} == {0, 1}


def test_a_large_vocabulary_draws_in_proportion_and_never_a_zero_weight() -> None:
    """Past 16,384 tokens the draw finds its place block by block: the frequencies are the
    distribution's (a chi-square test: 12 likely tokens spread over blocks, the rest of a
    20,000-token vocabulary sharing the remaining mass), masked and min-p'd tokens (weight
    0) never come, whatever the draw, and the first and last tokens can."""
    V = 20_000
    likely = np.array([0, 5, 1023, 1024, 2047, 4000, 4096, 5000, 8191, 8192, 19998, 19999])
    logits = np.full(V, -30.0, np.float32)
    logits[likely] = np.log(np.arange(1, 13, dtype=np.float32))
    s = Sampler(SamplingParams(seed=3), V)
    n = 6000
    draws = np.bincount([s.sample(logits) for _ in range(n)], minlength=V)
    assert draws.sum() - draws[likely].sum() <= 2  # 1e-12 of the mass elsewhere
    want = np.arange(1, 13) / 78.0 * draws[likely].sum()
    assert np.sum((draws[likely] - want) ** 2 / want) < 31.26  # chi-square, 11 dof, p 0.001
    allowed = likely[::2]
    s = Sampler(SamplingParams(seed=4, min_p=1e-6), V)
    mask = _mask(allowed.tolist(), V)
    got = {s.sample(logits, mask) for _ in range(2000)}
    assert got == set(allowed.tolist())


OPTIONS = [dict(temperature=0.7, top_p=0.9), dict(temperature=0.7, top_p=0.9),
           dict(temperature=1.0), dict(temperature=1.3, top_p=0.5), dict(temperature=0.0),
           dict(temperature=0.7, top_p=0.9, repetition_penalty=1.3), dict(top_k=5),
           dict(temperature=2.0, top_p=0.999), dict(temperature=0.7, top_p=0.9, min_p=0.1),
           dict(top_k=5, presence_penalty=0.5, frequency_penalty=0.3),
           dict(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.3,
                repeat_last_n=3)]
# rows (of len(OPTIONS) * 3) sampled under a mask on odd steps: plain, top-k with a
# penalised neighbour, min-p, and the row whose logits hold a NaN
MASKED = {2, 6, 6 + len(OPTIONS), 8, 3, 3 + len(OPTIONS)}


@pytest.mark.parametrize("vocab", [50, 300, 2000, 20000])
def test_batched_sampling_draws_what_one_row_at_a_time_draws(vocab: int) -> None:
    from npu.sampler import sample_rows

    rng = np.random.default_rng(vocab)
    rows = len(OPTIONS) * 3
    pairs = []
    for r in range(rows):
        params = SamplingParams(seed=r, **OPTIONS[r % len(OPTIONS)])
        pairs.append((Sampler(params, vocab, [1, 2]), Sampler(params, vocab, [1, 2])))
    for step in range(30):
        logits = (rng.standard_normal((rows, vocab)) * (1 + step % 4)).astype(np.float32)
        logits[0, :] = 1.0  # ties everywhere
        logits[3, 7] = np.nan if step % 5 == 0 else logits[3, 7]
        logits[4, :] = -np.inf if step % 7 == 0 else logits[4, :]
        logits[2, :] = -np.inf if step % 7 == 0 else logits[2, :]  # masked on odd steps
        if step % 3 == 0:  # mass spread wider than the first candidates looked at
            logits[1, :] = 0.001 * rng.standard_normal(vocab).astype(np.float32)
        masks = [_mask([1, 3, 5, 7, vocab - 1], vocab) if r in MASKED and step % 2 else None
                 for r in range(rows)]
        one = [a.sample(logits[r], masks[r]) for r, (a, _) in enumerate(pairs)]
        many = sample_rows([b for _, b in pairs], logits, masks)
        assert many == one
        for (a, b), t in zip(pairs, one):
            a.accept(t)
            b.accept(t)


# -- speculative decoding: verify() accepts a draft so the token keeps sample()'s law ------------
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def _law(logits: np.ndarray, *, temperature: float, top_k: int = 0, top_p: float = 1.0,
         allowed: np.ndarray | None = None) -> np.ndarray:
    """The sampler's final distribution, written out independently: mask, temperature,
    top-k, then the smallest most-likely set reaching top_p."""
    x = logits.astype(np.float64) / temperature
    if allowed is not None:
        x = np.where(allowed, x, -np.inf)
    if top_k:
        x = np.where(x >= np.sort(x)[-top_k], x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    cut = int(np.searchsorted(np.cumsum(p[order]), top_p * p.sum())) + 1
    out = np.zeros_like(p)
    out[order[:cut]] = p[order[:cut]]
    return out / out.sum()


@pytest.mark.parametrize("options,draft,masked", [
    (dict(temperature=1.0), 0, None),  # the likeliest token drafted
    (dict(temperature=0.8), 3, None),  # an unlikely one
    (dict(temperature=1.2, top_k=4, top_p=0.9), 5, None),  # one outside top-k: never kept
    (dict(temperature=0.7, top_p=0.95), 1, [1, 2, 4, 6]),  # under a mask that allows it
    (dict(temperature=0.7), 0, [1, 2, 4, 6]),  # a draft the mask forbids
])
def test_verify_keeps_the_samplers_distribution(options, draft, masked) -> None:
    """Chi-square (p = 0.001) of 3,000 verified tokens against the sampler's final
    distribution written out independently: the draft is kept as often as it gives the
    draft, and the rest follow it."""
    logits = np.array([2.0, 1.2, 0.9, 0.1, -0.4, 0.5, 0.3], np.float32)
    allowed = None if masked is None else np.isin(np.arange(7), masked)
    law = _law(logits, allowed=allowed, **options)
    s = Sampler(SamplingParams(seed=7, **options), 7)
    n = 3000
    mask = None if masked is None else _mask(masked, 7)
    draws = np.bincount([s.verify(logits, draft, mask) for _ in range(n)], minlength=7)
    support = law > 0
    assert draws[~support].sum() == 0
    expected = law[support] * n
    chi2 = float((((draws[support] - expected) ** 2) / expected).sum())
    assert chi2 < CHI2_999[int(support.sum()) - 1], (draws, law)


def test_verify_draws_what_sample_draws_whatever_the_draft() -> None:
    """The draw of every place is the one without drafts (same seed, same tokens): the
    draft decides only whether the tokens verified in one forward are kept."""
    logits = np.array([1.5, 1.4, 0.2, 0.1], np.float32)
    params = SamplingParams(seed=1, temperature=0.9, top_p=0.95, repetition_penalty=1.3)
    a, b = Sampler(params, 4, prompt_ids=[0]), Sampler(params, 4, prompt_ids=[0])
    for i in range(200):
        token = a.sample(logits)
        assert b.verify(logits, i % 4) == token
        a.accept(token)
        b.accept(token)


def test_greedy_verify_keeps_the_draft_only_when_it_is_the_argmax() -> None:
    s = Sampler(SamplingParams(temperature=0.0), 4)
    logits = np.array([0.1, 2.0, 2.0, -1.0], np.float32)  # a tie: the first one wins
    assert s.verify(logits, 1) == 1
    assert s.verify(logits, 2) == 1
    assert s.verify(logits, 3) == 1
    assert s.verify(logits, 1, _mask([2, 3], 4)) == 2


@pytest.mark.parametrize("top", [0, 1, 3])
def test_row_logprobs_are_each_rows_logprobs(top: int) -> None:
    """A prompt's rows scored together (in blocks) give what each row gives alone: the
    token's logprob and the top ones, the token equal to the best where it is the best."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((70, 500)) * 4).astype(np.float32)
    tokens = [int(t) for t in rng.integers(0, 500, 70)]
    tokens[5] = int(np.argmax(logits[5]))
    got = row_logprobs(logits, tokens, top, block=16)
    for row, (value, best) in enumerate(got):
        want_value, want_best = logprobs(logits[row], tokens[row], top)
        assert value == pytest.approx(want_value, abs=1e-5)
        assert [i for i, _ in best] == [i for i, _ in want_best]
        assert [v for _, v in best] == pytest.approx([v for _, v in want_best], abs=1e-5)
    if top:
        assert got[5][0] == got[5][1][0][1]  # lm-eval's greedy check: exactly equal


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_holds_the_end_tokens_back_until_that_many_alone_and_in_a_batch(
        temperature: float) -> None:
    """vLLM's min_tokens: the end tokens the model all but insists on are not sampled
    before the request's minimum, then they are (it was ignored: a chat asking for 40
    ended at 10); a batch samples what each row does alone."""
    from npu.sampler import sample_rows

    logits = np.array([[9.0, 0.0, -1.0, 8.0]] * 3, np.float32)  # 0 and 3: end tokens
    held = SamplingParams(temperature=temperature, seed=3, min_tokens=2, end_ids=(0, 3))
    alone = Sampler(held, 4)
    rows = [Sampler(held, 4), Sampler(held, 4), Sampler(SamplingParams(temperature=0.0), 4)]
    for step in range(3):
        tokens = [alone.sample(logits[0]), *sample_rows(rows, logits)]
        ended = [t in (0, 3) for t in tokens]
        assert ended == [step == 2] * 3 + [True]
        alone.accept(tokens[0])
        for s, t in zip(rows, tokens[1:]):
            s.accept(t)
    assert Sampler(SamplingParams(temperature=0.0, end_ids=(0,)), 4).sample(logits[0]) == 0
