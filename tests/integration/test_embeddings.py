"""Embeddings through HTTP with the official clients: `openai` (floats, base64,
dimensions, token ids, errors) and `ollama` (embed, embeddings), on a served decoder model
(SmolLM2) and on a BERT encoder (chat on it is a 400 naming its kind)."""

from __future__ import annotations

import numpy as np
import pytest

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMOL = "smollm2-135m"
TEXTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "A kitten is sleeping."]


@pytest.fixture()
def oa(serve_url):
    return openai.OpenAI(base_url=serve_url + "/v1", api_key="unused", timeout=120)


@pytest.fixture()
def oc(serve_url):
    return ollama.Client(host=serve_url, timeout=120)


def _matrix(data) -> np.ndarray:
    return np.array([d.embedding for d in data], dtype=np.float32)


def test_openai_embeddings_floats_base64_dimensions(oa) -> None:
    r = oa.embeddings.create(model=SMOL, input=TEXTS, encoding_format="float")
    m = _matrix(r.data)
    assert m.shape == (3, 576) and np.allclose(np.linalg.norm(m, axis=1), 1, atol=1e-5)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    # the SDK asks for base64 by default and decodes it: the same vectors
    b = _matrix(oa.embeddings.create(model=SMOL, input=TEXTS).data)
    np.testing.assert_array_equal(b, m)
    # a real model: related sentences are nearer than unrelated ones
    assert m[0] @ m[2] > m[0] @ m[1]
    d = _matrix(oa.embeddings.create(model=SMOL, input=TEXTS[0], dimensions=64).data)
    assert d.shape == (1, 64)
    np.testing.assert_allclose(d[0], m[0, :64] / np.linalg.norm(m[0, :64]), atol=1e-5)


def test_an_answer_past_grpcs_default_4_mib_arrives(oa) -> None:
    """2,000 inputs of SmolLM2's 576 floats are 4.6 MB from the worker to the ingress, past
    the 4 MiB a gRPC message takes by default (a 500 before app.GRPC_ENV). One token each:
    the answer's size is the point, not the compute."""
    inputs = [[10 + i % 1000] for i in range(2000)]
    r = oa.embeddings.create(model=SMOL, input=inputs)  # the SDK's base64
    m = _matrix(r.data)
    assert m.shape == (2000, 576) and [d.index for d in r.data] == list(range(2000))
    one = _matrix(oa.embeddings.create(model=SMOL, input=inputs[1500:1501]).data)
    np.testing.assert_allclose(m[1500:1501], one, atol=1e-5)


def test_openai_token_ids_are_the_texts_tokens(oa, oc) -> None:
    text = oa.embeddings.create(model=SMOL, input=TEXTS[0], encoding_format="float")
    ids = oa.completions.create(model=SMOL, prompt=TEXTS[0], max_tokens=1, logprobs=0)
    assert ids.usage.prompt_tokens == text.usage.prompt_tokens
    r = oa.embeddings.create(model=SMOL, input=[[1, 2, 3], [4, 5]], encoding_format="float")
    assert len(r.data) == 2 and r.usage.prompt_tokens == 5


def test_openai_errors(oa) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        oa.embeddings.create(model=SMOL, input=["ok", "word " * 10000])
    assert exc.value.code == "context_length_exceeded" and "Input 1" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        oa.embeddings.create(model=SMOL, input="ok", dimensions=100000)
    assert exc.value.param == "dimensions"
    with pytest.raises(openai.NotFoundError):
        oa.embeddings.create(model="nope", input="ok")


def test_vllms_truncate_prompt_tokens_keeps_the_last_tokens(oa) -> None:
    """vLLM's `truncate_prompt_tokens` (the SDK's extra_body): an encoder's input keeps its
    last k tokens inside [CLS] ... [SEP] (two texts that end alike, WordPiece tokenizing
    word by word, embed alike); -1 keeps the context, where the input alone is a 400; past
    the context is a 400 naming it."""
    def embed(text: str, **kw):
        return oa.embeddings.create(model="bert-tiny", input=text, encoding_format="float",
                                    **({"extra_body": kw} if kw else {}))

    one = embed("a dog ran to the cat on the mat", truncate_prompt_tokens=5)
    other = embed("the bird sat there on the mat", truncate_prompt_tokens=5)
    assert one.usage.prompt_tokens == other.usage.prompt_tokens == 5
    np.testing.assert_allclose(_matrix(one.data), _matrix(other.data), atol=1e-5)
    whole = embed("the bird sat there on the mat")
    assert whole.usage.prompt_tokens > 5
    assert not np.allclose(_matrix(whole.data), _matrix(other.data), atol=1e-3)
    long = "the cat " * 2000
    with pytest.raises(openai.BadRequestError):
        embed(long)
    kept = embed(long, truncate_prompt_tokens=-1)
    assert len(kept.data) == 1 and kept.usage.prompt_tokens > 5
    with pytest.raises(openai.BadRequestError) as exc:
        embed("ok", truncate_prompt_tokens=10**6)
    assert exc.value.param == "truncate_prompt_tokens"


def test_ollama_embed_and_embeddings(oa, oc) -> None:
    r = oc.embed(model=SMOL + ":latest", input=TEXTS)
    m = np.array(r.embeddings, dtype=np.float32)
    ref = _matrix(oa.embeddings.create(model=SMOL, input=TEXTS, encoding_format="float").data)
    np.testing.assert_allclose(m, ref, atol=1e-6)
    assert r.prompt_eval_count > 3 and r.total_duration > 0
    one = oc.embeddings(model=SMOL, prompt=TEXTS[0])
    np.testing.assert_allclose(one.embedding, ref[0], atol=1e-6)
    # Ollama cuts a long input to the context by default, refuses it with truncate=False
    r = oc.embed(model=SMOL, input="word " * 100, options={"num_ctx": 16})
    assert r.prompt_eval_count == 16 and len(r.embeddings) == 1
    with pytest.raises(ollama.ResponseError) as exc:
        oc.embed(model=SMOL, input="word " * 100, truncate=False, options={"num_ctx": 16})
    assert exc.value.status_code == 400 and "16" in exc.value.error


def test_an_encoder_embeds_and_refuses_to_chat(oa, oc) -> None:
    r = oa.embeddings.create(model="bert-tiny", input=["the cat", "the cat", "a dog ran"],
                             encoding_format="float")
    m = _matrix(r.data)
    assert m.shape == (3, 64) and np.allclose(np.linalg.norm(m, axis=1), 1, atol=1e-5)
    np.testing.assert_array_equal(m[0], m[1])  # same input, same vector in one batch
    assert r.usage.prompt_tokens == 6 + 6 + 9  # [CLS] and [SEP] around each input's pieces
    assert oc.show("bert-tiny").capabilities == ["embedding"]
    with pytest.raises(openai.BadRequestError) as exc:
        oa.chat.completions.create(model="bert-tiny", messages=[{"role": "user",
                                                                 "content": "hi"}])
    assert "embedding model" in exc.value.message and exc.value.param == "model"
    with pytest.raises(ollama.ResponseError) as exc:
        oc.generate(model="bert-tiny", prompt="hi")
    assert exc.value.status_code == 400
