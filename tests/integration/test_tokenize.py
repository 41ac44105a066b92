"""/tokenize and /detokenize through HTTP on the shared Serve instance: llama-server's and
vLLM's shapes round-trip on the default model (SmolLM2), a conversation's count is what
/v1/chat/completions reports as prompt_tokens, `model` may be left out on an app of one
model (and must be named on a models_dir app, whose model is loaded for it), and bad input
is a 400 / 404 in OpenAI's error shape."""

from __future__ import annotations

import pytest

from tests.integration.conftest import LIBRARY_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMOL = "smollm2-135m"
TEXT = "Tokenizers split text: naïve café, 媽, 🤗 and <|im_end|> too."
MESSAGES = [{"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of France?"}]


def _error(r, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    return err


def test_text_round_trips_in_both_shapes(client) -> None:
    llama = client.post("/tokenize", json={"model": SMOL, "content": TEXT,
                                           "with_pieces": True}).json()["tokens"]
    ids = [t["id"] for t in llama]
    data = b"".join(p.encode() if isinstance(p, str) else bytes(p)
                    for p in (t["piece"] for t in llama))
    assert data == TEXT.encode()
    vllm = client.post("/v1/tokenize", json={"model": SMOL, "prompt": TEXT}).json()
    assert vllm == {"count": len(ids), "max_model_len": 8192, "tokens": ids,
                    "token_strs": None}
    back = client.post("/detokenize", json={"model": SMOL, "tokens": ids}).json()
    assert back == {"content": TEXT, "prompt": TEXT}


def test_a_conversations_count_is_chat_completions_prompt_tokens(client) -> None:
    counted = client.post("/tokenize", json={"model": SMOL, "messages": MESSAGES}).json()
    chat = client.post("/v1/chat/completions", json={"model": SMOL, "messages": MESSAGES,
                                                     "max_tokens": 1}).json()
    assert counted["count"] == chat["usage"]["prompt_tokens"] == len(counted["tokens"])
    text = client.post("/detokenize", json={"model": SMOL,
                                            "tokens": counted["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")


def test_model_is_optional_on_an_app_of_one_model(client) -> None:
    ids = client.post("/npu/tokenize", json={"content": "hello"}).json()["tokens"]
    assert client.post("/npu/detokenize", json={"tokens": ids}).json()["content"] == "hello"
    _error(client.post("/tokenize", json={"content": "hello"}), 400, "model")


def test_bad_input_is_a_400_or_404_in_llama_servers_and_vllms_shape(client) -> None:
    """`code` the status as a number, as both servers answer on their tokenizer routes."""
    both = {"model": SMOL, "content": "x", "messages": MESSAGES}
    _error(client.post("/tokenize", json=both), 400, "messages")
    err = _error(client.post("/detokenize", json={"model": SMOL, "tokens": [1, 49152]}),
                 400, "tokens[1]")
    assert "49152" in err["message"] and err["type"] == "invalid_request_error"
    _error(client.post("/detokenize", json={"model": SMOL, "tokens": [1, "2"]}), 400,
           "tokens[1]")
    err = _error(client.post("/tokenize", json={"model": "nope", "prompt": "x"}), 404, "model")
    assert err["code"] == 404 and err["type"] == "not_found_error"
    # an encoder does not chat: its refusal names the model
    err = _error(client.post("/tokenize", json={"model": "bert-tiny", "messages": MESSAGES}),
                 400, "model")
    assert "embedding" in err["message"]


def test_a_library_model_is_loaded_to_tokenize(client, library_dir) -> None:
    url = LIBRARY_PREFIX + "/tokenize"
    counted = client.post(url, json={"model": "qwen3-tiny", "messages": MESSAGES}).json()
    chat = client.post(LIBRARY_PREFIX + "/v1/chat/completions", json={
        "model": "qwen3-tiny", "messages": MESSAGES, "max_tokens": 1}).json()
    assert counted["count"] == chat["usage"]["prompt_tokens"]
    _error(client.post(url, json={"content": "x"}), 400, "model")  # a library: a choice
