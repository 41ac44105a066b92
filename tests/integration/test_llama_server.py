"""llama-server's own completion and fill in the middle through HTTP on the shared Serve
instance: /completion continues a prompt (text or token ids) as /v1/completions does; the
library's coder-tiny (a random Qwen3 GGUF whose vocabulary has Qwen2.5-Coder's FIM tokens,
found by their spelling as llama.cpp finds them) answers llama-server's /infill (whole and
streamed, its prompt in the repository-level layout), OpenAI's `suffix` through the
`openai` client and Ollama's through the `ollama` client, and lists `insert` among its
capabilities; the default model (no FIM tokens) refuses each in its API's shape (/infill
llama-server's 501). /completion's prompt forms: a mixed prompt in a batch."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import LIBRARY_PREFIX

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CODER, SMOL = "coder-tiny", "smollm2-135m"
PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


@pytest.fixture()
def oc(serve_url, library_dir):
    client = ollama.Client(host=serve_url + LIBRARY_PREFIX, timeout=120)
    yield client
    client.generate(model=CODER, keep_alive=0)  # unloaded again, as the library tests expect


def test_llama_servers_infill_whole_and_streamed(client, oc) -> None:
    body = {"model": CODER, "input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "a",
            "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "n_predict": 6,
            "temperature": 0, "ignore_eos": True}
    r = client.post(LIBRARY_PREFIX + "/infill", json=body)
    assert r.status_code == 200, r.text
    whole = r.json()
    assert whole["prompt"].startswith("<|repo_name|>myproject\n<|file_sep|>util.py\nX = 1\n")
    assert whole["prompt"].endswith(f"<|fim_prefix|>{PREFIX}a<|fim_suffix|>{SUFFIX}"
                                    "<|fim_middle|>")
    assert whole["tokens_predicted"] == 6 and whole["stop_type"] == "limit"
    with client.stream("POST", LIBRARY_PREFIX + "/infill", json={**body, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == whole["content"]  # greedy: the same
    assert events[-1]["stop"] is True and events[-1]["timings"]["predicted_n"] == 6


def test_a_warm_up_with_n_predict_0_caches_the_files_for_the_completion(client, oc) -> None:
    """llama.vim's way: the extra files sent first with n_predict 0, then completions with
    them: the files' tokens come from the KV cache (their cut does not move between
    requests), the prompt's own end is computed."""
    files = [{"filename": f"m{i}.py", "text": " ".join(f"v{i}_{j} = {j}" for j in range(40))}
             for i in range(3)]
    warm = client.post(LIBRARY_PREFIX + "/infill", json={
        "model": CODER, "input_prefix": "", "input_suffix": "", "input_extra": files,
        "n_predict": 0})
    assert warm.status_code == 200 and warm.json()["tokens_predicted"] == 0
    done = client.post(LIBRARY_PREFIX + "/infill", json={
        "model": CODER, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": files,
        "n_predict": 4, "response_fields": ["timings/cache_n", "tokens_evaluated"]}).json()
    # the shared start: the files and <PRE>, in whole blocks of 16
    assert done["timings/cache_n"] >= warm.json()["tokens_evaluated"] - 2 - 15
    assert done["timings/cache_n"] < done["tokens_evaluated"]


def test_openai_and_ollama_clients_send_suffix(serve_url, oc) -> None:
    ai = openai.OpenAI(base_url=serve_url + LIBRARY_PREFIX + "/v1", api_key="unused",
                       max_retries=0)
    done = ai.completions.create(model=CODER, prompt=PREFIX, suffix=SUFFIX, max_tokens=5,
                                 temperature=0)
    # the gap alone: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>
    gap = oc.generate(model=CODER, prompt=PREFIX, suffix=SUFFIX,
                      options={"num_predict": 5, "temperature": 0}, raw=False)
    # the same prompt, greedy: the same middle
    assert done.usage.prompt_tokens == gap.prompt_eval_count
    assert done.choices[0].text == gap.response
    assert "insert" in oc.show(CODER).capabilities


def test_a_model_without_fim_tokens_says_so_in_each_apis_shape(client, serve_url) -> None:
    r = client.post("/infill", json={"model": SMOL, "input_prefix": PREFIX,
                                     "input_suffix": SUFFIX})
    assert r.status_code == 501  # llama-server's not_supported_error
    assert r.json()["error"]["param"] == "input_suffix"
    assert r.json()["error"]["code"] == 501
    message = r.json()["error"]["message"]
    assert "the middle ('input_suffix')" in message  # named as sent
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=serve_url, timeout=60).generate(model=SMOL, prompt=PREFIX,
                                                           suffix=SUFFIX)
    assert err.value.status_code == 400 and "does not support insert" in err.value.error
    ai = openai.OpenAI(base_url=serve_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        ai.completions.create(model=SMOL, prompt=PREFIX, suffix=SUFFIX, max_tokens=2)
    assert bad.value.body["param"] == "suffix"
    assert "insert" not in ollama.Client(host=serve_url).show(SMOL).capabilities


def test_completion_continues_a_prompt_as_openais_completions_do(client) -> None:
    body = {"model": SMOL, "prompt": "The capital of France is", "temperature": 0}
    native = client.post("/completion", json={**body, "n_predict": 8}).json()
    openai_ = client.post("/v1/completions", json={**body, "max_tokens": 8}).json()
    assert native["content"] == openai_["choices"][0]["text"] and native["stop"] is True
    assert native["tokens_evaluated"] == openai_["usage"]["prompt_tokens"]
    assert native["prompt"] == body["prompt"] and native["model"] == SMOL
    ids = client.post("/tokenize", json={"model": SMOL, "content": body["prompt"]}).json()
    by_ids = client.post("/completion", json={**body, "prompt": ids["tokens"],
                                              "n_predict": 8}).json()
    assert by_ids["content"] == native["content"]
    # the same prompt as ids and text mixed, and beside another prompt in a batch
    cut = len(ids["tokens"]) // 2
    text = client.post("/detokenize", json={"model": SMOL,
                                            "tokens": ids["tokens"][cut:]}).json()["content"]
    mixed = {"model": SMOL, "temperature": 0, "n_predict": 8}
    batch = client.post("/completion", json={**mixed, "prompt": [
        "Hello", [*ids["tokens"][:cut], text]]}).json()
    assert [b["index"] for b in batch] == [0, 1] and batch[1]["content"] == native["content"]
    # n_probs: each token and its most likely alternatives (greedy: the first of them)
    probs = client.post("/completion", json={**body, "n_predict": 3, "n_probs": 3}).json()
    rows = probs["completion_probabilities"]
    assert "".join(r["token"] for r in rows) == probs["content"] == native["content"][
        :len(probs["content"])]
    assert all(r["id"] == r["top_logprobs"][0]["id"] and len(r["top_logprobs"]) == 3
               for r in rows)
    props = client.get("/props", params={"model": SMOL}).json()
    assert props["default_generation_settings"]["n_ctx"] == 8192
    assert "<|im_start|>" in props["chat_template"] and props["model_alias"] == SMOL
