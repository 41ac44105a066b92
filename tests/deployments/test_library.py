"""deployments/library.py without Serve: /api/ps's one view of every replica's models."""

from __future__ import annotations

import asyncio

from deployments.library import LibraryFront, merge_running


def _m(name: str, replica: str, loaded_at: float, expires_at: float) -> dict:
    return {"id": name, "replica": replica, "loaded_at": loaded_at, "expires_at": expires_at,
            "weight_bytes": 100, "size": 120, "active": 1, "loads": 1, "context_length": 256}


def test_a_model_on_several_replicas_is_one_entry_with_its_total_size() -> None:
    held = [_m("b", "r2", 5.0, 50.0), _m("a", "r1", 1.0, 40.0), _m("a", "r2", 2.0, 60.0)]
    out = merge_running(held)
    assert [m["id"] for m in out] == ["a", "b"]  # in the order they were loaded
    a = out[0]
    assert a["replicas"] == ["r1", "r2"] and a["weight_bytes"] == 200 and a["size"] == 240
    assert a["expires_at"] == 60.0 and a["active"] == 2 and a["context_length"] == 256
    assert merge_running([]) == []


class _Remote:
    def __init__(self, value) -> None:
        self.value, self.calls = value, 0

    def remote(self):
        self.calls += 1

        async def answer():
            return self.value
        return answer()


class _Handle:
    def __init__(self, value) -> None:
        self.running = _Remote(value)


def test_ps_asks_the_hub_for_every_replica_and_without_one_a_replica() -> None:
    front = LibraryFront(_Handle([_m("own", "r1", 1.0, 9.0)]), {"models_dir": "/nowhere"})
    front.streams = {}
    assert [m["id"] for m in asyncio.run(front.running())] == ["own"]
    front.hub = type("Hub", (), {"held": _Remote([_m("a", "r1", 1.0, 9.0),
                                                  _m("a", "r2", 1.5, 9.0)])})()
    (entry,) = asyncio.run(front.running())
    assert entry["replicas"] == ["r1", "r2"] and front.library_handle.running.calls == 1


def test_a_chat_for_a_variant_with_a_template_carries_it_and_nothing_else_does(
        tmp_path) -> None:
    from actors.events import ChatGenerate, CompletionGenerate
    from actors.library import Library
    from tests.actors.test_library import write_gguf

    write_gguf(tmp_path / "base.gguf", "qwen3")
    Library(tmp_path).copy("base", "bare", template="{{ .Prompt }}")
    Library(tmp_path).copy("base", "terse", system="Be terse.")
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    chat = ChatGenerate(request_id="a", messages=[{"role": "user", "content": "hi"}])
    sent = front.with_variant_template("Bare:latest", chat)
    assert sent.template is not None and "{%" in sent.template and chat.template is None
    assert front.with_variant_template("terse", chat) is chat  # no template of its own
    assert front.with_variant_template("base", chat) is chat
    raw = CompletionGenerate(request_id="b", prompt="hi")
    assert front.with_variant_template("bare", raw) is raw  # a raw prompt has no template


def test_deleting_a_models_files_unloads_it_and_an_alias_leaves_the_model_loaded(
        tmp_path) -> None:
    """/api/delete of a loaded model's files: unloaded now (its replica asked, keep_alive
    0), not listed by /api/ps until its keep_alive ends; an alias's removal unloads
    nothing (the model it named still serves)."""
    from actors.library import Library
    from tests.actors.test_library import write_gguf

    unloads: list[tuple[str, float]] = []

    class Handle:
        def options(self, multiplexed_model_id: str):
            handle = type("H", (), {})()
            handle.load = type("L", (), {"remote": lambda _, keep: _unload(
                multiplexed_model_id, keep)})()
            return handle

    async def _unload(target: str, keep: float) -> dict:
        unloads.append((target, keep))
        return {"done_reason": "unload"}

    write_gguf(tmp_path / "base.gguf", "qwen3")
    Library(tmp_path).copy("base", "nick")
    front = LibraryFront(Handle(), {"models_dir": str(tmp_path), "allow_delete": True})
    front.streams = {}
    asyncio.run(front.delete("nick"))
    assert unloads == [] and front.resolve("base") == "base"
    asyncio.run(front.delete("base"))
    assert unloads == [("base", 0)] and not (tmp_path / "base.gguf").exists()


def test_a_loaded_model_whose_file_was_removed_unloads_with_keep_alive_0(tmp_path) -> None:
    """A folder model's file removed by hand while it is loaded: Ollama's keep_alive 0
    still unloads it (it answered 404 and stayed loaded until evicted); loading it is a
    404, as is unloading a model that was never loaded."""
    import pytest

    from deployments.errors import ApiError

    unloads: list[tuple[str, float]] = []

    class Handle:
        running = _Remote([_m("gone", "r1", 1.0, 9.0)])

        def options(self, multiplexed_model_id: str):
            async def load(keep: float) -> dict:
                unloads.append((multiplexed_model_id, keep))
                return {"done_reason": "unload"}
            return type("H", (), {"load": type("L", (), {"remote": lambda _, k: load(k)})()})()

    front = LibraryFront(Handle(), {"models_dir": str(tmp_path)})
    front.streams = {}
    assert asyncio.run(front.load("Gone:latest", 0)) == {"done_reason": "unload"}
    assert unloads == [("gone", 0)]
    for name, keep in [("gone", None), ("never", 0)]:
        with pytest.raises(ApiError) as err:
            asyncio.run(front.load(name, keep))
        assert err.value.status == 404
    assert unloads == [("gone", 0)]


def test_a_configured_models_name_is_not_edited_in_the_folder(tmp_path, caplog) -> None:
    """A folder model that a configured model of the same name hides: listed once (the
    configured one, which requests reach), logged once; /api/delete, copy and create under
    that name are a 400 naming the field, and the folder's file stays."""
    import pytest

    from actors.library import Library
    from deployments.errors import ApiError
    from tests.actors.test_library import write_gguf

    write_gguf(tmp_path / "qwen.gguf", "qwen3")
    write_gguf(tmp_path / "base.gguf", "qwen3")
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path), "allow_delete": True})
    front.streams = {"qwen": object()}
    with caplog.at_level("WARNING"):
        assert set(asyncio.run(front.library_models())) == {"base"}
        asyncio.run(front.library_models())
    assert [r.getMessage() for r in caplog.records if "hidden" in r.getMessage()] == [
        "the models folder's qwen: hidden by the configured model(s) of the same name, "
        "which requests reach"]
    for edit, names, param in [
            (lambda lib: lib.delete("qwen", allow_files=True), {"model": "qwen"}, "model"),
            (lambda lib: lib.copy("base", "qwen"),
             {"source": "base", "destination": "qwen"}, "destination"),
            (lambda lib: lib.copy("qwen", "mine"),
             {"source": "qwen", "destination": "mine"}, "source")]:
        with pytest.raises(ApiError) as err:
            front.edit_library(edit, names)
        assert err.value.status == 400 and err.value.param == param
    with pytest.raises(ApiError):
        asyncio.run(front.delete("qwen"))
    assert (tmp_path / "qwen.gguf").exists() and Library(tmp_path).get("mine") is None


def test_a_variants_num_ctx_is_its_requests_context_unless_they_set_one(tmp_path) -> None:
    """Modelfile's most common line, PARAMETER num_ctx: the variant's requests, on every
    API, run in that context; a request's own (Ollama's options.num_ctx) wins."""
    from actors.events import ChatGenerate, CompletionGenerate
    from actors.library import Library
    from tests.actors.test_library import write_gguf

    write_gguf(tmp_path / "base.gguf", "qwen3")
    Library(tmp_path).copy("base", "small", parameters={"num_ctx": 256})
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    chat = ChatGenerate(request_id="a", messages=[{"role": "user", "content": "hi"}])
    assert front.with_variant_template("small", chat).context_limit == 256
    raw = CompletionGenerate(request_id="b", prompt="hi")
    assert front.with_variant_template("small", raw).context_limit == 256
    own = CompletionGenerate(request_id="c", prompt="hi", context_limit=64)
    assert front.with_variant_template("small", own).context_limit == 64
    assert front.with_variant_template("base", chat).context_limit is None


def test_show_gives_a_variants_system_prompt_and_parameters_as_modelfile_lines(
        tmp_path) -> None:
    from actors.library import Library
    from deployments.ollama.reply import show
    from tests.actors.test_library import write_gguf

    write_gguf(tmp_path / "base.gguf", "qwen3")
    Library(tmp_path).copy("base", "terse", system="Be terse.",
                           parameters={"temperature": 0.2, "stop": ["<a>", "b"]})
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    shown = show(front.library_info("terse", verbose=True))
    assert shown["system"] == "Be terse."
    assert shown["parameters"] == 'temperature 0.2\nstop "<a>"\nstop "b"'
    plain = show(front.library_info("base"))
    assert "system" not in plain and plain["parameters"] == ""


def test_show_gives_the_modelfile_that_makes_a_variant_again(tmp_path) -> None:
    """`ollama show --modelfile` printed nothing (found probing live): the Modelfile reads
    back (parse_modelfile, /api/create) as the variant; its license is kept and shown, its
    parent named, and it is dated when it was made, not as its file."""
    import time

    from actors.library import Library
    from deployments.ollama import request
    from deployments.ollama.modelfile import parse_modelfile
    from deployments.ollama.reply import show, tag
    from tests.actors.test_library import write_gguf

    write_gguf(tmp_path / "base.gguf", "qwen3")
    made = time.time()
    Library(tmp_path).copy("base", "terse", system="Be terse.\nAlways.", license="MIT",
                           parameters={"temperature": 0.2, "stop": ["<a>", "b"]})
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    info = front.library_info("terse", verbose=True)
    shown = show(info)
    assert shown["license"] == "MIT" and shown["details"]["parent_model"] == "base"
    assert tag("terse", info)["details"]["parent_model"] == "base"
    assert info["created"] >= int(made) > front.library_info("base")["created"] - 1e9
    mf = parse_modelfile(shown["modelfile"])
    assert mf["from"] == "base" and mf["system"] == "Be terse.\nAlways."
    assert mf["parameters"] == {"temperature": 0.2, "stop": ["<a>", "b"]}
    assert mf["license"] == ["MIT"] and mf["template"] == info["template"]
    again = request.variant_request(request.CreateIn(model="again", modelfile=shown["modelfile"]))
    assert (again.source, again.system, again.license) == ("base", "Be terse.\nAlways.", "MIT")
    base = show(front.library_info("base", verbose=True))
    assert base["modelfile"].splitlines()[4] == f"FROM {tmp_path / 'base.gguf'}"
    assert base["license"] == "" and base["details"]["parent_model"] == ""


def test_show_lists_a_library_models_capability_from_its_header(tmp_path) -> None:
    """Ollama's /api/show of a model not loaded yet: an embedding or rerank file is not a
    chat model with tools (its header's chat template mentions them)."""
    from deployments.ollama.reply import show
    from tests.actors.test_library import write_gguf

    write_gguf(tmp_path / "chat.gguf", "qwen3")
    write_gguf(tmp_path / "embed.gguf", "bert", pooling=1)
    write_gguf(tmp_path / "rerank.gguf", "qwen3", pooling=4, extra=("cls.output.weight",))
    write_gguf(tmp_path / "coder.gguf", "qwen3",
               tokens=["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"])
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    caps = {name: show(front.library_info(name))["capabilities"]
            for name in ("chat", "embed", "rerank", "coder")}
    assert caps == {"chat": ["completion", "tools"], "embed": ["embedding"],
                    "rerank": ["rerank"], "coder": ["completion", "tools", "insert"]}


def test_show_lists_a_directorys_fim_tokens_as_insert(tmp_path) -> None:
    """A Hugging Face directory of a code model (Qwen2.5-Coder's FIM tokens among its added
    tokens, CodeLlama's in its vocabulary) was listed without "insert", though its suffix
    and /infill were served: only a GGUF header's vocabulary was read."""
    import json

    from deployments.ollama.reply import show
    from tests.actors.test_library import write_hf

    def tokenizer(folder, vocab, added=()) -> None:
        (folder / "tokenizer.json").write_text(json.dumps({
            "model": {"vocab": vocab},
            "added_tokens": [{"id": 10 + i, "content": t} for i, t in enumerate(added)]}))

    tokenizer(write_hf(tmp_path / "qwen-coder"), {"a": 0, "b": 1},
              ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"])
    tokenizer(write_hf(tmp_path / "codellama"),
              [["a", 0.0], ["▁<PRE>", 0.0], ["▁<SUF>", 0.0], ["▁<MID>", 0.0]])
    tokenizer(write_hf(tmp_path / "chat"), {"a": 0}, ["<|im_start|>"])
    write_hf(tmp_path / "bare")
    (write_hf(tmp_path / "broken") / "tokenizer.json").write_text("{")
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    names = ("qwen-coder", "codellama", "chat", "bare", "broken")
    caps = {name: show(front.library_info(name))["capabilities"] for name in names}
    assert caps == {"qwen-coder": ["completion", "insert"], "codellama": ["completion", "insert"],
                    "chat": ["completion"], "bare": ["completion"], "broken": ["completion"]}


def test_show_lists_a_directorys_capabilities_from_its_templates(tmp_path) -> None:
    """A Hugging Face directory's chat template was not read at all: every one listed as
    "completion" alone. Now its tokenizer_config.json's template (and a named tool_use
    one) says tools and thinking as a GGUF file's does."""
    import json

    from actors.library import Library
    from deployments.ollama.reply import show
    from tests.actors.test_library import write_hf

    def template(folder, chat_template) -> None:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"chat_template": chat_template}))

    template(write_hf(tmp_path / "qwen"), "{% if tools %}{{ tools }}{% endif %}<think>")
    template(write_hf(tmp_path / "hermes"), [
        {"name": "default", "template": "{{ messages }}"},
        {"name": "tool_use", "template": "{{ tools }}"}])
    write_hf(tmp_path / "bare")
    template(write_hf(tmp_path / "oss"),  # gpt-oss's: its reasoning channel
             "{{ tools }}<|start|>assistant<|channel|>analysis<|message|>")
    Library(tmp_path).copy("hermes", "own", template="{{ .Prompt }}")  # its own serves all
    front = LibraryFront(_Handle([]), {"models_dir": str(tmp_path)})
    front.streams = {}
    names = ("qwen", "hermes", "bare", "oss", "own")
    caps = {name: show(front.library_info(name))["capabilities"] for name in names}
    assert caps == {"qwen": ["completion", "tools", "thinking"],
                    "hermes": ["completion", "tools"], "bare": ["completion"],
                    "oss": ["completion", "tools", "thinking"], "own": ["completion"]}
    listed = asyncio.run(front.library_models())  # /v1/models and /api/tags say the same
    assert {name: listed[name]["capabilities"] for name in names} == caps
