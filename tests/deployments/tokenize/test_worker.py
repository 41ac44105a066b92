"""The tokenize routes over a real Worker (flm-tiny, no Ray): the real app and Ingress in
front of an in-process Worker. Text round-trips through /tokenize and /detokenize, pieces
add up to the text's bytes, a conversation's count is the prompt_tokens /v1/chat/completions
reports for it, ids outside the vocabulary are a 400 naming the id, special-token text read
as text where asked, mixed content, /apply-template's rendering; and actors.tokenize's own
rules (special tokens, the generation prompt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

# imported here, before any Worker: a Worker's grammar warm-up thread imports transformers
# (through xgrammar), and a test importing it at the same moment can find it half-imported
from transformers import PreTrainedTokenizerFast

from actors.events import ChatGenerate
from actors.session import render_prompt
from actors.tokenize import Detokenize, Text, Tokenize, Tokens, answer
from actors.worker import Worker
from deployments.ingress import Ingress, current
from deployments.server import make_app
from npu import load_model
from npu.load.tiny import ensure_tiny
from tests.deployments.test_ingress import _Method

pytestmark = pytest.mark.timeout(120)
TEXT = "Hello world! á 媽 🤗 <|im_end|>\n  indented"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


class _Gen:
    """A Worker's event stream as Serve's handle gives it (`__anext__`, `cancel`)."""

    def __init__(self, agen) -> None:
        self.agen = agen

    def __aiter__(self) -> _Gen:
        return self

    async def __anext__(self) -> list:
        return await self.agen.__anext__()

    def cancel(self) -> None:
        pass


class LocalHandle:
    """A worker deployment handle over an in-process Worker."""

    def __init__(self, worker: Worker) -> None:
        self.generate = _Method(lambda greq, *args: _Gen(worker.generate(greq)))

    def options(self, **_: object) -> LocalHandle:
        return self


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Worker:
    folder: Path = ensure_tiny(tmp_path_factory.mktemp("cache"))
    w = Worker(lambda: load_model(folder, name="flm-tiny"), max_batch=2)
    yield w
    w.close()


@pytest.fixture()
def client(worker):
    ingress = Ingress({"flm-tiny": LocalHandle(worker)}, {})
    app = make_app()
    app.dependency_overrides[current] = lambda: ingress
    with TestClient(app) as c:
        yield c


def test_text_round_trips_in_both_shapes(client) -> None:
    llama = client.post("/tokenize", json={"content": TEXT}).json()["tokens"]
    vllm = client.post("/tokenize", json={"model": "flm-tiny", "prompt": TEXT}).json()
    assert vllm["tokens"] == llama and vllm["count"] == len(llama)  # no BOS on this model
    assert vllm["max_model_len"] == 4096 and vllm["token_strs"] is None
    im_end = client.post("/tokenize", json={"content": "<|im_end|>"}).json()["tokens"]
    assert len(im_end) == 1  # special-token text reads as the token
    back = client.post("/detokenize", json={"tokens": llama}).json()
    assert back == {"content": TEXT, "prompt": TEXT}
    assert client.post("/tokenize", json={"content": ""}).json() == {"tokens": []}
    assert client.post("/detokenize", json={"tokens": []}).json()["content"] == ""


def test_parse_special_off_reads_control_tokens_as_text(client, worker) -> None:
    """As llama.cpp's parse_special false: a control token's text (`<|im_end|>`, special in
    tokenizer.json) is tokenized as text and round-trips; a user-defined added token
    (`<think>`, not special) is still that token."""
    im_end = {"content": "a<|im_end|>b", "parse_special": False}
    plain = client.post("/tokenize", json=im_end).json()["tokens"]
    assert worker.model.tokenizer.eos_id not in plain and len(plain) > 3
    assert client.post("/detokenize", json={"tokens": plain}).json()["content"] == "a<|im_end|>b"
    think = client.post("/tokenize", json={"content": "<think>", "parse_special": False})
    assert len(think.json()["tokens"]) == 1
    with_pieces = client.post("/tokenize", json={**im_end, "with_pieces": True}).json()
    assert "".join(t["piece"] for t in with_pieces["tokens"]) == "a<|im_end|>b"


def test_mixed_content_joins_ids_and_texts(client) -> None:
    hello = client.post("/tokenize", json={"content": "Hello"}).json()["tokens"]
    world = client.post("/tokenize", json={"content": " world"}).json()["tokens"]
    mixed = client.post("/tokenize", json={"content": [*hello, " world", 5]}).json()
    assert mixed["tokens"] == [*hello, *world, 5]
    r = client.post("/tokenize", json={"content": ["x", 10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "content"


def test_apply_template_is_the_models_rendering(client, worker) -> None:
    r = client.post("/apply-template", json={"messages": MESSAGES})
    assert r.status_code == 200 and r.json() == {"prompt": worker.model.render(MESSAGES)}
    bare = client.post("/apply-template", json={"messages": MESSAGES,
                                                "add_generation_prompt": False}).json()
    assert bare["prompt"] == worker.model.render(MESSAGES, add_generation_prompt=False)
    # a last assistant message is continued: the prompt ends with its text
    begun = client.post("/apply-template", json={"messages": [
        *MESSAGES, {"role": "assistant", "content": "Sure, here"}]}).json()["prompt"]
    assert begun.startswith(worker.model.render(MESSAGES)) and begun.endswith("Sure, here")


def test_pieces_add_up_to_the_texts_bytes(client) -> None:
    got = client.post("/tokenize", json={"content": TEXT, "with_pieces": True}).json()
    pieces = [t["piece"] for t in got["tokens"]]
    data = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in pieces)
    assert data == TEXT.encode()
    assert any(isinstance(p, list) for p in pieces)  # a character split across tokens



def test_vllms_token_strs_are_the_vocabularys_spellings(client, worker) -> None:
    """As vLLM answers (transformers' convert_ids_to_tokens): `Ġworld`, not " world"."""
    got = client.post("/tokenize", json={"prompt": TEXT, "add_special_tokens": False,
                                         "return_token_strs": True}).json()
    hf = PreTrainedTokenizerFast(tokenizer_file=str(worker.model.path / "tokenizer.json"))
    assert got["token_strs"] == hf.convert_ids_to_tokens(got["tokens"])
    assert "Ġwor" in got["token_strs"] and "<|im_end|>" in got["token_strs"]


def test_a_conversations_count_is_chat_completions_prompt_tokens(client) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    for extra in ({}, {"tools": [tool]}):
        counted = client.post("/tokenize", json={"messages": MESSAGES, **extra}).json()
        chat = client.post("/v1/chat/completions", json={
            "model": "flm-tiny", "messages": MESSAGES, "max_tokens": 1, **extra}).json()
        assert counted["count"] == chat["usage"]["prompt_tokens"] == len(counted["tokens"])
    # without the generation prompt: the same conversation, less the assistant's opening
    bare = client.post("/tokenize", json={"messages": MESSAGES,
                                          "add_generation_prompt": False}).json()
    full = client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert bare["count"] < full["count"] and full["tokens"][:bare["count"]] == bare["tokens"]
    text = client.post("/detokenize", json={"tokens": full["tokens"]}).json()["content"]
    assert text.endswith("assistant\n") and "Be brief." in text


def test_lm_evaluation_harness_remote_tokenizer_finds_what_it_reads(client, worker) -> None:
    """lm-evaluation-harness's remote tokenizer (its `local-completions` model, tokenizer
    backend "auto") uses the server's tokenizer when GET /tokenizer_info has `eos_token`
    and POST /tokenize answers `tokens`; it decodes with /detokenize's `prompt` and renders
    chats with `chat_template`."""
    info = client.get("/tokenizer_info").json()
    tok = worker.model.tokenizer
    assert info["eos_token"] == tok.eos_token and info["bos_token"] == tok.bos_token
    assert info["chat_template"] == worker.model.chat_template_source
    assert info["model_max_length"] == worker.model.context_length
    eos = client.post("/tokenize", json={"prompt": info["eos_token"],
                                         "add_special_tokens": False}).json()["tokens"]
    assert eos == [tok.eos_id]
    ids = client.post("/tokenize", json={"prompt": TEXT, "add_special_tokens": False}).json()
    assert client.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == TEXT
    assert client.get("/v1/tokenizer_info?model=flm-tiny").json() == info
    missing = client.get("/tokenizer_info?model=nope")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_ids_outside_the_vocabulary_are_400s_naming_the_id(client, worker) -> None:
    vocab = worker.model.config.vocab_size
    for bad, at in (([1, vocab], "tokens[1]"), ([-1], "tokens[0]")):
        r = client.post("/detokenize", json={"tokens": bad})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == at and str(bad[-1]) in err["message"]
        assert err["type"] == "invalid_request_error"
    assert client.post("/detokenize", json={"tokens": [vocab - 1]}).status_code == 200


def test_an_encoder_adds_its_own_specials_and_refuses_a_chat(tmp_path) -> None:
    from tests.bert_model import build_bert

    bert = load_model(build_bert(tmp_path / "bert"), name="bert-tiny")
    plain = answer(Tokenize(request_id="t", text="the cat"), bert)[1].ids
    [_, special] = answer(Tokenize(request_id="t", text="the cat", add_special=True,
                                   pieces=True), bert)
    assert special.ids == bert.embedding_ids("the cat") and special.ids[1:-1] == plain
    assert special.pieces[0] == b"[CLS]" and special.pieces[-1] == b"[SEP]"
    [refused] = answer(Tokenize(request_id="t", chat=ChatGenerate(request_id="t",
                                                                  messages=MESSAGES)), bert)
    assert refused.status == 400 and refused.param == "model"
    assert "embedding" in refused.message


def test_answer_never_raises_and_names_what_it_refuses(worker) -> None:
    model = worker.model
    [accepted, tokens] = answer(Tokenize(request_id="t", text="hi"), model)
    assert isinstance(tokens, Tokens) and accepted.prompt_tokens == len(tokens.ids)
    assert tokens.context_length == model.context_length and tokens.pieces is None
    [rejected] = answer(Detokenize(request_id="t", tokens=[10**9]), model)
    assert rejected.status == 400 and rejected.param == "tokens[0]"
    [_, text] = answer(Detokenize(request_id="t", tokens=tokens.ids), model)
    assert isinstance(text, Text) and text.text == "hi"
    [failed] = answer(Tokenize(request_id="t", text=None), model)  # a bug: a 500, no raise
    assert failed.status == 500 and failed.type == "server_error"


def test_the_generation_prompt_is_what_the_template_adds(worker) -> None:
    model = worker.model
    chat = ChatGenerate(request_id="t", messages=MESSAGES)
    with_prompt = render_prompt(chat, model)
    without = render_prompt(chat, model, add_generation_prompt=False)
    assert with_prompt.startswith(without) and len(with_prompt) > len(without)
    assert with_prompt == model.render(MESSAGES)
    assert without == model.render(MESSAGES, add_generation_prompt=False)
