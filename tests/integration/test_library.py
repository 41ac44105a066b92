"""A models_dir app through HTTP with the official `ollama` and `openai` clients: every
model listed before any load, loaded on first use (once for requests at once), unloaded by
keep_alive and past max_loaded_models, clear errors for files that cannot be served
(unreadable, unsupported, over the memory budget) while the others serve, and a file dropped
in later."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import LIBRARY_PREFIX, library_args

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LLAMA, QWEN, GEMMA = "llama-q8_0", "qwen3-tiny", "gemma-tiny"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture()
def oc(serve_url, library_dir):
    return ollama.Client(host=serve_url + LIBRARY_PREFIX, timeout=120)


@pytest.fixture()
def ai(serve_url, library_dir):
    return openai.OpenAI(base_url=serve_url + LIBRARY_PREFIX + "/v1", api_key="unused",
                         max_retries=0)


def _loaded(oc) -> dict:
    return {m.model: m for m in oc.ps().models}


def _replica():
    from ray import serve

    return serve.get_deployment_handle("worker-library", app_name="library")


def test_every_model_is_listed_before_any_load(oc, ai) -> None:
    assert _loaded(oc) == {}
    models = {m.model: m for m in oc.list().models}
    assert {f"{LLAMA}:latest", f"{QWEN}:latest", f"{GEMMA}:latest", "broken:latest",
            "mamba:latest"} <= set(models)
    qwen = models[f"{QWEN}:latest"]
    assert qwen.details.family == "qwen3" and qwen.details.format == "gguf"
    assert qwen.details.quantization_level == "Q8_0" and qwen.details.parameter_size
    assert len(qwen.digest) == 64 and qwen.size > 100_000 and qwen.modified_at  # bare hex
    ids = {m.id for m in ai.models.list().data}
    assert {LLAMA, QWEN, GEMMA} <= ids
    assert ai.models.retrieve("Gemma-Tiny").context_length == 256
    shown = oc.show(f"{LLAMA}:latest")
    assert shown.modelinfo["llama.context_length"] == 256 and "<|im_start|>" in shown.template
    assert _loaded(oc) == {}  # listing and showing loaded nothing


def test_first_request_loads_and_keep_alive_0_unloads(oc) -> None:
    first = oc.generate(model=LLAMA, prompt="Once", raw=True, options={"num_predict": 3})
    assert first.eval_count == 3 and first.load_duration > 0
    assert first.total_duration > first.load_duration
    again = oc.generate(model=f"{LLAMA}:latest", prompt="Once", raw=True,
                        options={"num_predict": 3})
    assert again.load_duration == 0
    running = _loaded(oc)[f"{LLAMA}:latest"]
    assert running.context_length == 256 and running.size > 0
    left = running.expires_at.timestamp() - time.time()
    assert 200 < left <= 300  # the app's keep_alive, 5m
    done = oc.generate(model=LLAMA, prompt="", keep_alive=0)
    assert done.done_reason == "unload"
    assert f"{LLAMA}:latest" not in _loaded(oc)


def test_requests_at_once_wait_for_one_load(ai, oc) -> None:
    def ask(_):
        return ai.chat.completions.create(model=QWEN, messages=HI, max_tokens=4)

    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(ask, range(3)))
    assert all(r.choices[0].finish_reason in ("length", "stop") for r in replies)
    (entry,) = [m for m in _replica().running.remote().result() if m["id"] == QWEN]
    assert entry["loads"] == 1
    oc.chat(model=QWEN, messages=[], keep_alive=0)
    assert f"{QWEN}:latest" not in _loaded(oc)


def test_loads_past_max_loaded_models_evict_the_least_recently_used(oc) -> None:
    for name in (LLAMA, QWEN, GEMMA):
        r = oc.chat(model=name, messages=[])  # a load request
        assert r.done_reason == "load"
    assert set(_loaded(oc)) == {f"{QWEN}:latest", f"{GEMMA}:latest"}
    r = oc.chat(model=QWEN, messages=HI, options={"num_predict": 2}, keep_alive="-1")
    assert r.eval_count == 2
    assert _loaded(oc)[f"{QWEN}:latest"].expires_at.year > 2100  # -1: never
    for name in (QWEN, GEMMA):
        oc.chat(model=name, messages=[], keep_alive=0)
    assert _loaded(oc) == {}


def test_a_short_keep_alive_expires(oc) -> None:
    oc.generate(model=GEMMA, prompt="a", raw=True, options={"num_predict": 1},
                keep_alive="300ms")
    deadline = time.monotonic() + 20
    while f"{GEMMA}:latest" in _loaded(oc) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"{GEMMA}:latest" not in _loaded(oc)


def test_files_that_cannot_be_served_are_clear_errors_and_the_rest_serve(oc, ai) -> None:
    with pytest.raises(ollama.ResponseError) as oerr:
        oc.chat(model="mamba", messages=HI)  # its header says why (listed unavailable)
    assert oerr.value.status_code == 422
    assert "mamba.gguf" in oerr.value.error and "'mamba' is not supported" in oerr.value.error
    for name in (LLAMA, QWEN):
        oc.chat(model=name, messages=[])
    # known failures are refused before Serve's loader, which would evict a loaded model
    with pytest.raises(openai.UnprocessableEntityError) as err:
        ai.chat.completions.create(model="broken", messages=HI, max_tokens=2)
    assert "broken.gguf" in err.value.message and "magic" in err.value.message
    with pytest.raises(ollama.ResponseError) as lerr:
        oc.generate(model="mamba", prompt="")  # a load request says so too
    assert lerr.value.status_code == 422 and "mamba.gguf" in lerr.value.error
    with pytest.raises(ollama.ResponseError) as huge:
        oc.chat(model="huge", messages=HI)
    assert huge.value.status_code == 507
    assert "MB" in huge.value.error and "budget is 40 MB" in huge.value.error
    with pytest.raises(ollama.ResponseError) as missing:
        oc.chat(model="nothing-here", messages=HI)
    assert missing.value.status_code == 404
    assert set(_loaded(oc)) == {f"{LLAMA}:latest", f"{QWEN}:latest"}
    r = ai.chat.completions.create(model=LLAMA, messages=HI, max_tokens=2)
    assert r.usage.completion_tokens == 2
    with pytest.raises(ollama.ResponseError) as bad:
        oc.chat(model=LLAMA, messages=HI, keep_alive="soon")
    assert bad.value.status_code == 400 and "keep_alive" in bad.value.error
    for name in (LLAMA, QWEN):
        oc.chat(model=name, messages=[], keep_alive=0)


def test_a_file_dropped_in_later_shows_up_and_serves(oc, ai, library_dir) -> None:
    shutil.copy(library_dir / "qwen3-tiny.gguf", library_dir / "Late-Comer.gguf")
    try:
        assert "late-comer:latest" in {m.model for m in oc.list().models}
        r = ai.chat.completions.create(model="late-comer", messages=HI, max_tokens=2)
        assert r.usage.completion_tokens == 2
        oc.chat(model="late-comer", messages=[], keep_alive=0)
    finally:
        (library_dir / "Late-Comer.gguf").unlink()
    assert "late-comer:latest" not in {m.model for m in oc.list().models}


def test_a_loaded_models_file_replaced_serves_the_new_file(oc, library_dir) -> None:
    """A new file moved over a loaded model's (as the docs say to replace one): its next
    request loads the new file, as Ollama's reloads a model whose digest changed."""
    path = library_dir / "swap.gguf"
    shutil.copy(library_dir / "Llama-Q8_0.gguf", path)
    try:
        oc.generate(model="swap", prompt="hi", options={"num_predict": 1})
        assert _loaded(oc)["swap:latest"].details.family == "llama"
        shutil.copy(library_dir / "qwen3-tiny.gguf", library_dir / ".swap.tmp")
        (library_dir / ".swap.tmp").rename(path)
        r = oc.generate(model="swap", prompt="hi", options={"num_predict": 1})
        assert r.load_duration > 0  # loaded again
        assert _loaded(oc)["swap:latest"].details.family == "qwen3"
    finally:
        oc.generate(model="swap", prompt="", keep_alive=0)
        path.unlink()


def test_pull_of_a_library_model_succeeds_and_of_another_says_where_models_come_from(
        oc) -> None:
    statuses = [p.status for p in oc.pull(f"{QWEN}:latest", stream=True)]
    assert statuses[-1] == "success" and len(statuses) == 4
    assert oc.pull(LLAMA).status == "success"
    with pytest.raises(ollama.ResponseError) as err:
        oc.pull("qwen9:72b")
    assert err.value.status_code == 404 and "registry" in err.value.error
    assert "models_dir" in err.value.error
    assert _loaded(oc) == {}  # a pull loads nothing


def test_loads_and_unloads_reach_the_metrics(serve_url, library_dir, oc) -> None:
    import httpx

    oc.generate(model=GEMMA, prompt="")
    oc.generate(model=GEMMA, prompt="", keep_alive=0)
    with pytest.raises(ollama.ResponseError):  # its header reads; its load fails
        oc.chat(model="hollow", messages=HI)
    want = [f'flm_model_loads_total{{model="{GEMMA}",outcome="loaded"}}', 'outcome="failed"',
            f'flm_model_unloads_total{{model="{GEMMA}",reason="keep_alive"}}',
            f'flm_model_unloads_total{{model="{LLAMA}",reason="evicted"}}',  # past N (above)
            "flm_model_load_seconds_count", "flm_models_loaded"]
    deadline, text = time.monotonic() + 30, ""
    # each replica's worker pushes its metrics every 5 s, on its own clock: the counters of
    # one replica can come a push after another's
    while time.monotonic() < deadline:
        text = httpx.get(serve_url + LIBRARY_PREFIX + "/metrics").text
        if all(w in text for w in want):
            break
        time.sleep(0.5)
    assert [w for w in want if w not in text] == []


def test_copy_makes_an_alias_served_by_the_same_load_and_delete_removes_it(oc) -> None:
    oc.copy(LLAMA, "My-Llama:v1")
    assert "my-llama:v1" in {m.model for m in oc.list().models}
    r = oc.chat(model="my-llama:v1", messages=HI, options={"num_predict": 2})
    assert r.eval_count == 2 and r.model == "my-llama:v1"
    oc.chat(model=LLAMA, messages=HI, options={"num_predict": 1})
    assert set(_loaded(oc)) == {f"{LLAMA}:latest"}  # one load serves both names
    oc.delete("my-llama:v1")
    assert "my-llama:v1" not in {m.model for m in oc.list().models}
    with pytest.raises(ollama.ResponseError) as err:
        oc.delete(LLAMA)  # a file: only with allow_delete
    assert err.value.status_code == 403 and "allow_delete" in err.value.error
    with pytest.raises(ollama.ResponseError) as missing:
        oc.copy("nothing-here", "x")
    assert missing.value.status_code == 404
    oc.chat(model=LLAMA, messages=[], keep_alive=0)


def test_create_makes_a_variant_with_its_own_system_prompt_and_parameters(oc, ai) -> None:
    oc.create(model="terse", from_=LLAMA, system="You answer in one word, always.",
              parameters={"num_predict": 3, "temperature": 0})
    base = oc.chat(model=LLAMA, messages=HI, options={"num_predict": 1})
    r = oc.chat(model="terse", messages=HI)
    assert r.eval_count == 3  # the variant's num_predict
    assert r.prompt_eval_count > base.prompt_eval_count  # its system prompt is in
    again = ai.chat.completions.create(model="terse", messages=HI)
    assert again.usage.completion_tokens == 3 and again.choices[0].message.content == (
        oc.chat(model="terse", messages=HI).message.content)  # temperature 0 on both APIs
    own = oc.chat(model="terse", messages=HI, options={"num_predict": 1})
    assert own.eval_count == 1  # a request's own options win
    # Ollama's TEMPLATE (a Go template): the prompt is the user's text alone, no chat markers
    oc.create(model="bare", from_=LLAMA, template="{{ .Prompt }}")
    bare = oc.chat(model="bare", messages=HI, options={"num_predict": 1})
    assert bare.eval_count == 1 and bare.prompt_eval_count < base.prompt_eval_count - 4
    assert "{%" in oc.show("bare").template  # shown as the Jinja it renders with
    with pytest.raises(ollama.ResponseError) as err:
        oc.create(model="x", from_=LLAMA, template="{{ .Prompt ")
    assert err.value.status_code == 400 and "template" in err.value.error
    oc.delete("terse")
    oc.delete("bare")
    oc.chat(model=LLAMA, messages=[], keep_alive=0)


def test_embed_loads_a_library_model_and_keep_alive_0_unloads_it_after(oc) -> None:
    r = oc.embed(model=QWEN, input=["hi", "there"], keep_alive=0)
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) > 0
    assert f"{QWEN}:latest" not in _loaded(oc)


def test_anthropics_count_tokens_counts_on_a_library_model(serve_url, oc) -> None:
    import httpx

    body = {"model": QWEN, "messages": [{"role": "user", "content": "hi there"}]}
    r = httpx.post(serve_url + LIBRARY_PREFIX + "/v1/messages/count_tokens", json=body,
                   timeout=60)
    assert r.status_code == 200 and r.json()["input_tokens"] > 2
    oc.chat(model=QWEN, messages=[], keep_alive=0)


def test_ps_shows_the_models_of_every_replica_and_requests_go_to_the_one_holding_theirs(
        serve_url, library_dir) -> None:
    """Two replicas holding one model each: /api/ps lists both models (one replica's view
    would list one), and once Serve's routers know where each model is, requests for it go
    to its replica (the prefix router keyed by model: no load after the first)."""
    from ray import serve

    from deployments.app import build_app

    args = library_args(library_dir)
    args["library"] = {**args["library"], "replicas": 2, "max_loaded_models": 1}
    serve.run(build_app(args), name="library-2x", route_prefix="/library-2x")
    oc2 = ollama.Client(host=serve_url + "/library-2x", timeout=120)
    try:
        held: dict = {}
        for _ in range(6):  # until the routers have heard which replica holds which model
            loads = [oc2.chat(model=m, messages=HI, options={"num_predict": 1}).load_duration
                     for m in (LLAMA, QWEN)]
            held = {m.model: m for m in oc2.ps().models}
            if not any(loads) and len(held) == 2:
                break
        assert set(held) == {f"{LLAMA}:latest", f"{QWEN}:latest"}
        assert not any(loads)  # both served where they were loaded
        assert all(m.size > 0 and m.context_length == 256 for m in held.values())
    finally:
        serve.delete("library-2x")


def test_aliases_and_variants_survive_a_restart_of_the_app(oc, library_dir) -> None:
    """(Last in this file: it replaces the library app's replicas.)"""
    from ray import serve

    from deployments.app import build_app

    oc.copy(LLAMA, "kept-alias")
    oc.create(model="kept-variant", from_=QWEN, system="Be brief.",
              template="{{ .System }} U:{{ .Prompt }} A:", parameters={"num_predict": 2})
    before = oc.chat(model="kept-variant", messages=HI)
    serve.delete("library")  # a new ingress and worker, with nothing but the folder
    serve.run(build_app(library_args(library_dir)), name="library",
              route_prefix=LIBRARY_PREFIX)
    deadline = time.monotonic() + 60
    while True:  # until the proxy routes to the new app
        try:
            names = {m.model for m in oc.list().models}
            break
        except (ollama.ResponseError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert {"kept-alias:latest", "kept-variant:latest"} <= names
    assert _loaded(oc) == {}  # a fresh worker: nothing loaded
    after = oc.chat(model="kept-variant", messages=HI)
    assert after.eval_count == 2 and after.prompt_eval_count == before.prompt_eval_count
    assert oc.chat(model="kept-alias", messages=HI, options={"num_predict": 1}).eval_count == 1
    oc.delete("kept-alias")
    oc.delete("kept-variant")
    for model in (QWEN, LLAMA):
        oc.chat(model=model, messages=[], keep_alive=0)
