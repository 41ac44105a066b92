"""actors/aliases.py and Library.copy / delete: aliases kept in the folder (or the cache when
it is read-only), surviving a restart; files deleted only when allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

import actors.aliases as aliases_module
from actors.aliases import FILE_NAME, Alias, AliasStore
from actors.errors import RequestError
from actors.library import Library
from tests.actors.test_library import write_gguf


def test_aliases_persist_in_the_folder_and_are_re_read_when_changed(tmp_path: Path) -> None:
    a = AliasStore(tmp_path)
    a.set("mine", Alias(model="qwen3", system="Be brief.", parameters={"temperature": 0}))
    assert (tmp_path / FILE_NAME).exists()
    b = AliasStore(tmp_path)  # another replica, or after a restart
    assert b.read() == {"mine": Alias(model="qwen3", system="Be brief.",
                                      parameters={"temperature": 0})}
    a.set("other", Alias(model="llama"))
    assert set(b.read()) == {"mine", "other"}
    assert b.remove("mine") and not b.remove("mine")
    assert a.read() == {"other": Alias(model="llama")}


def test_a_read_only_folder_keeps_its_aliases_in_the_cache(tmp_path: Path, monkeypatch) -> None:
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("FLM_CACHE", str(cache))
    monkeypatch.setattr(aliases_module.os, "access", lambda p, mode: False)
    AliasStore(folder).set("x", Alias(model="y"))
    assert not (folder / FILE_NAME).exists() and len(list(cache.glob("aliases-*.json"))) == 1
    assert AliasStore(folder).read() == {"x": Alias(model="y")}


def test_an_unreadable_alias_file_means_no_aliases(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("{not json")
    assert AliasStore(tmp_path).read() == {}
    (tmp_path / FILE_NAME).write_text('{"aliases": {"a": "b", "c": {"model": "d"}}}')
    assert AliasStore(tmp_path).read() == {"a": Alias(model="b"), "c": Alias(model="d")}


@pytest.fixture()
def lib(tmp_path: Path) -> Library:
    write_gguf(tmp_path / "qwen3-4b.gguf", "qwen3")
    write_gguf(tmp_path / "llama.gguf")
    return Library(tmp_path)


def test_an_alias_is_listed_as_its_model_and_survives_a_restart(lib: Library) -> None:
    assert lib.copy("Qwen3-4B:latest", "Assistant:v2") == "assistant:v2"
    again = Library(lib.root).models()
    assert again["assistant:v2"].alias_of == "qwen3-4b"
    assert again["assistant:v2"].path == again["qwen3-4b"].path
    lib.copy("assistant:v2", "second")  # an alias of an alias names the model
    assert lib.models()["second"].alias_of == "qwen3-4b"


def test_a_variant_carries_its_defaults_over_its_sources(lib: Library) -> None:
    lib.copy("qwen3-4b", "terse", system="Answer in one word.",
             parameters={"temperature": 0.2, "num_predict": 8})
    lib.copy("terse", "terse-hot", parameters={"temperature": 1.5})
    m = Library(lib.root).models()
    assert (m["terse"].system, m["terse"].options) == (
        "Answer in one word.", {"temperature": 0.2, "num_predict": 8})
    assert m["terse-hot"].alias_of == "qwen3-4b" and m["terse-hot"].system == "Answer in one word."
    assert m["terse-hot"].options == {"temperature": 1.5, "num_predict": 8}
    assert m["qwen3-4b"].system is None and m["qwen3-4b"].options == {}


@pytest.mark.parametrize("source,destination,status,text", [
    ("nothing", "x", 404, "not found"),
    ("qwen3-4b", "llama", 400, "llama.gguf"),
    ("qwen3-4b", "bad name!", 400, "not a model name"),
])
def test_bad_copies_say_why(lib: Library, source, destination, status, text) -> None:
    with pytest.raises(RequestError) as err:
        lib.copy(source, destination)
    assert err.value.status == status and text in err.value.message


def test_delete_removes_aliases_and_files_only_when_allowed(lib: Library) -> None:
    lib.copy("qwen3-4b", "mine")
    assert lib.delete("mine", allow_files=False).alias_of == "qwen3-4b"
    assert "mine" not in lib.models()
    with pytest.raises(RequestError) as err:
        lib.delete("qwen3-4b", allow_files=False)
    assert err.value.status == 403 and "allow_delete" in err.value.message
    lib.copy("qwen3-4b", "mine")
    lib.delete("qwen3-4b", allow_files=True)
    assert not (lib.root / "qwen3-4b.gguf").exists()
    assert set(lib.models()) == {"llama"} and lib.aliases.read() == {}
    with pytest.raises(RequestError) as missing:
        lib.delete("qwen3-4b", allow_files=True)
    assert missing.value.status == 404


def test_a_variants_template_is_kept_as_jinja_and_shown_as_its_chat_template(
        lib: Library) -> None:
    lib.copy("qwen3-4b", "plain", template="{{ if .System }}S:{{ .System }} {{ end }}"
                                           "U:{{ .Prompt }} A:{{ .Response }}")
    lib.copy("qwen3-4b", "jinja", template="{% for m in messages %}{{ m.content }}{% endfor %}")
    lib.copy("plain", "plain-hot", parameters={"temperature": 1.5})  # the template comes along
    m = Library(lib.root).models()
    assert "{%" in m["plain"].template and m["plain"].chat_template == m["plain"].template
    assert m["plain-hot"].template == m["plain"].template
    assert m["jinja"].template == "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert m["qwen3-4b"].template is None
    with pytest.raises(RequestError) as err:
        lib.copy("qwen3-4b", "bad", template="{{ .Prompt")
    assert err.value.status == 400 and err.value.param == "template"
    with pytest.raises(RequestError) as jinja_err:
        lib.copy("qwen3-4b", "bad", template="{% for m in messages %}")
    assert jinja_err.value.status == 400 and "does not compile" in jinja_err.value.message
    assert "bad" not in lib.models()
