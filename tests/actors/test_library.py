"""actors/library.py: a folder's models by name, with header facts, rescanned cheaply."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter

import actors.library as library
from actors.errors import RequestError
from actors.library import Library, model_key


def write_gguf(path: Path, arch: str = "llama", *, ctx: int = 4096, file_type: int | None = 15,
               rows: int = 4, split: tuple[int, int] | None = None,
               pooling: int | None = None, extra: tuple[str, ...] = (),
               tokens: list[str] | None = None) -> Path:
    """A GGUF file with a header of `arch` and one small f32 tensor (`split`: part, count;
    `pooling`: its pooling_type; `extra`: more tensors' names; `tokens`: its vocabulary)."""
    w = GGUFWriter(str(path), arch)
    if tokens is not None:
        w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_uint32(f"{arch}.context_length", ctx)
    if file_type is not None:
        w.add_uint32("general.file_type", file_type)
    if pooling is not None:
        w.add_uint32(f"{arch}.pooling_type", pooling)
    w.add_string("tokenizer.chat_template", "{{ messages }} tools")
    if split:
        w.add_uint16("split.no", split[0] - 1)
        w.add_uint16("split.count", split[1])
    w.add_tensor(f"blk.{split[0] if split else 0}.w", np.zeros((rows, 32), np.float32))
    for name in extra:
        w.add_tensor(name, np.zeros((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_hf(folder: Path, shards: int = 1) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "qwen3", "max_position_embeddings": 32768}))
    for i in range(shards):
        header = json.dumps({f"w{i}": {"dtype": "BF16", "shape": [8, 16],
                                       "data_offsets": [0, 256]}}).encode()
        (folder / f"model-{i}.safetensors").write_bytes(
            struct.pack("<Q", len(header)) + header + bytes(256))
    return folder


def test_model_names_are_lower_case_and_latest_is_the_bare_name() -> None:
    assert model_key("Qwen3-0.6B-Q4_K_M:latest") == "qwen3-0.6b-q4_k_m"
    assert model_key("qwen3:8b") == "qwen3:8b"
    assert model_key(" SmolLM2 ") == "smollm2"


def test_gguf_files_split_files_tags_and_hf_directories_are_models(tmp_path: Path) -> None:
    write_gguf(tmp_path / "Qwen3-0.6B-Q4_K_M.gguf", "qwen3")
    for part in (1, 2, 3):
        write_gguf(tmp_path / f"big-model-0000{part}-of-00003.gguf", split=(part, 3))
    (tmp_path / "llama3").mkdir()
    write_gguf(tmp_path / "llama3" / "8B-Q8_0.gguf", file_type=7)
    write_gguf(tmp_path / "llama3" / "latest.gguf")  # the tag `latest`: the name itself
    write_hf(tmp_path / "Tiny-HF", shards=2)
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / ".hidden.gguf").write_bytes(b"x")
    models = Library(tmp_path).models()
    assert sorted(models) == ["big-model", "llama3", "llama3:8b-q8_0", "qwen3-0.6b-q4_k_m",
                              "tiny-hf"]
    big = models["big-model"]
    assert big.path.endswith("big-model-00001-of-00003.gguf") and len(big.files) == 3
    assert big.parameters == 3 * 4 * 32 and not big.error  # every part's tensors
    assert big.size == sum(os.path.getsize(f) for f in big.files)
    qwen = models["qwen3-0.6b-q4_k_m"]
    assert (qwen.family, qwen.quantization, qwen.context_length) == ("qwen3", "Q4_K_M", 4096)
    assert qwen.format == "gguf" and "tools" in qwen.chat_template
    assert models["llama3:8b-q8_0"].quantization == "Q8_0"
    hf = models["tiny-hf"]
    assert (hf.format, hf.family, hf.context_length) == ("safetensors", "qwen3", 32768)
    assert (hf.parameters, hf.quantization) == (2 * 8 * 16, "BF16")
    lib = Library(tmp_path)
    assert lib.get("Qwen3-0.6B-Q4_K_M:latest") is not None and lib.get("nope") is None
    assert lib.get("llama3:latest") == lib.get("llama3") == models["llama3"]


def test_quantization_falls_back_to_the_matrices_type(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", file_type=None)
    assert Library(tmp_path).models()["m"].quantization == "F32"


def test_rescans_read_only_new_or_changed_files(tmp_path: Path, monkeypatch) -> None:
    write_gguf(tmp_path / "a.gguf")
    reads: list[str] = []
    real = library.read_header
    monkeypatch.setattr(library, "read_header", lambda p: reads.append(Path(p).name) or real(p))
    lib = Library(tmp_path)
    first = lib.models()
    assert reads == ["a.gguf"]
    assert lib.models() == first and reads == ["a.gguf"]  # unchanged: a stat, no read
    write_gguf(tmp_path / "b.gguf", "qwen3")  # dropped in later
    assert sorted(lib.models()) == ["a", "b"] and reads == ["a.gguf", "b.gguf"]
    write_gguf(tmp_path / "a.gguf", ctx=8192, rows=8)  # replaced
    again = lib.models()
    assert again["a"].context_length == 8192 and reads[-1] == "a.gguf"
    assert again["a"].digest != first["a"].digest
    (tmp_path / "b.gguf").unlink()
    assert sorted(lib.models()) == ["a"]


def test_digest_reads_only_the_ends_of_a_big_file(tmp_path: Path, monkeypatch) -> None:
    path = write_gguf(tmp_path / "big.gguf")
    with open(path, "ab") as f:
        f.truncate(64 << 20)  # 64 MB, mostly a hole
    read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def seek(self, *a):
            return self.f.seek(*a)

    monkeypatch.setattr(library, "open", lambda p, mode="r": Counting(real_open(p, mode)),
                        raising=False)
    digest = library._digest([path])
    assert digest.startswith("sha256:") and sum(read) <= 2 * library.SAMPLE
    assert library._digest([path]) == digest


def test_a_served_file_or_folder_has_the_librarys_digest(tmp_path: Path) -> None:
    """What Ollama's listings show of a configured model: the digest the library gives the
    same file; a folder's over its files; it changes when a file does."""
    path = write_gguf(tmp_path / "one.gguf")
    assert library.path_digest(path) == library._digest([path])
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    before = library.path_digest(folder)
    assert before.startswith("sha256:") and before != library.path_digest(path)
    (folder / "model.safetensors").write_bytes(b"y" * 10)
    assert library.path_digest(folder) != before
    assert library.path_digest(tmp_path / "missing.gguf") == ""


def test_unreadable_files_are_listed_with_the_reason_and_the_rest_serve(tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"NOPE" + bytes(64))
    write_gguf(tmp_path / "half-00001-of-00002.gguf", split=(1, 2))
    write_gguf(tmp_path / "good.gguf")
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text("{}")
    models = Library(tmp_path).models()
    assert not models["good"].error
    assert "broken.gguf" in models["broken"].error and "magic" in models["broken"].error
    assert "1 of its 2 split parts" in models["half"].error
    assert "safetensors" in models["no-weights"].error
    assert models["broken"].info()["error"] == models["broken"].error


def test_a_missing_folder_is_an_empty_library(tmp_path: Path) -> None:
    assert Library(tmp_path / "nowhere").models() == {}


def test_two_files_with_one_name_keep_the_first(tmp_path: Path) -> None:
    write_gguf(tmp_path / "M.gguf")
    write_gguf(tmp_path / "m.gguf", ctx=1)
    lib = Library(tmp_path)
    models = lib.models()
    assert list(models) == ["m"] and models["m"].path.endswith("M.gguf")
    assert len(lib.conflicts) == 1


@pytest.mark.parametrize("qtype", [QT.Q8_0])
def test_info_is_what_the_listings_read(tmp_path: Path, qtype: QT) -> None:
    write_gguf(tmp_path / "x.gguf", file_type=7)
    info = Library(tmp_path).models()["x"].info()
    assert info["id"] == "x" and info["quantization"] == qtype.name
    assert info["file_format"] == "gguf" and info["weight_bytes"] > 0
    assert info["digest"].startswith("sha256:") and info["library"] is True


def test_a_configured_gguf_file_is_listed_by_its_own_type(tmp_path: Path) -> None:
    """A served GGUF file shows the type users know it by (Q4_K_M), not the formats the
    engine holds it in; a directory holding one the same; other paths: none."""
    from actors.library import gguf_quantization

    assert gguf_quantization(write_gguf(tmp_path / "a.gguf", file_type=15)) == "Q4_K_M"
    (tmp_path / "d").mkdir()
    write_gguf(tmp_path / "d" / "m.gguf", file_type=7)
    assert gguf_quantization(tmp_path / "d") == "Q8_0"
    assert gguf_quantization(write_gguf(tmp_path / "b.gguf", file_type=None)) is None
    # the names llama.cpp gives past the k-quants, and none for a number it does not know
    assert gguf_quantization(write_gguf(tmp_path / "i.gguf", file_type=30)) == "IQ4_XS"
    assert gguf_quantization(write_gguf(tmp_path / "f.gguf", file_type=0)) == "F32"
    assert gguf_quantization(write_gguf(tmp_path / "u.gguf", file_type=999)) is None
    assert gguf_quantization(tmp_path / "nowhere") is None
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03")
    assert gguf_quantization(tmp_path / "bad.gguf") is None


def test_each_model_says_what_it_serves_before_it_loads(tmp_path: Path) -> None:
    """Chat, embeddings or rerank, from the header alone (Ollama's /api/show capabilities
    of a library model): llama.cpp's reranker files by their pooling type or head."""
    write_gguf(tmp_path / "chat.gguf", "qwen3")
    write_gguf(tmp_path / "embed.gguf", "bert", pooling=1)
    write_gguf(tmp_path / "bge-reranker.gguf", "bert", pooling=4,
               extra=("cls.weight", "cls.output.weight"))
    write_gguf(tmp_path / "qwen3-reranker.gguf", "qwen3", pooling=4,
               extra=("cls.output.weight",))
    write_hf(tmp_path / "ms-marco")
    (tmp_path / "ms-marco" / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertForSequenceClassification"]}))
    write_hf(tmp_path / "minilm")
    (tmp_path / "minilm" / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertModel"]}))
    models = Library(tmp_path).models()
    assert {name: m.capability for name, m in models.items()} == {
        "chat": "completion", "embed": "embedding", "bge-reranker": "rerank",
        "qwen3-reranker": "rerank", "ms-marco": "rerank", "minilm": "embedding"}


def test_a_roberta_rerankers_listed_context_is_the_one_it_loads_with(tmp_path) -> None:
    """An XLM-RoBERTa classifier's positions start past pad_token_id + 1: its context is
    max_position_embeddings less those rows (130 -> 128), listed as it is served."""
    write_hf(tmp_path / "xlmr")
    (tmp_path / "xlmr" / "config.json").write_text(json.dumps(
        {"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"],
         "max_position_embeddings": 130, "pad_token_id": 1}))
    assert Library(tmp_path).models()["xlmr"].context_length == 128


def test_a_code_models_file_says_it_fills_in_the_middle_before_it_loads(tmp_path) -> None:
    """Ollama's `insert` capability from the header: a decoder's vocabulary with FIM tokens
    (Qwen2.5-Coder's spelling, or StarCoder2's), not a vocabulary without, nor a reranker."""
    qwen = ["a", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "b"]
    write_gguf(tmp_path / "coder.gguf", "qwen3", tokens=qwen)
    write_gguf(tmp_path / "starcoder.gguf", "llama",
               tokens=["<fim_prefix>", "<fim_middle>", "<fim_suffix>"])
    write_gguf(tmp_path / "chat.gguf", "qwen3", tokens=["a", "<|fim_prefix|>", "b"])
    write_gguf(tmp_path / "rerank.gguf", "qwen3", pooling=4, extra=("cls.output.weight",),
               tokens=qwen)
    models = Library(tmp_path).models()
    assert {name: m.insert for name, m in models.items()} == {
        "coder": True, "starcoder": True, "chat": False, "rerank": False}


def test_a_file_whose_tokenizer_cannot_load_is_listed_with_the_reason(tmp_path: Path) -> None:
    """A file whose vocabulary is not read here (llama.cpp's "rwkv"): listed with why, not as
    a reranker the first request would find unloadable."""
    from gguf import GGUFWriter as Writer

    w = Writer(str(tmp_path / "bge-reranker-v2-m3.gguf"), "bert")
    w.add_uint32("bert.pooling_type", 4)
    w.add_string("tokenizer.ggml.model", "rwkv")
    w.add_tensor("cls.output.weight", np.zeros((1, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    entry = Library(tmp_path).models()["bge-reranker-v2-m3"]
    assert "tokenizer model 'rwkv' is not supported" in entry.error


def test_a_file_of_an_architecture_not_run_here_is_listed_with_the_reason(
        tmp_path: Path) -> None:
    """A Phi-3 GGUF was listed ready, with tools, and every request got a 422 (found
    probing live): its header says why it cannot be served."""
    write_gguf(tmp_path / "phi.gguf", "phi3")
    entry = Library(tmp_path).models()["phi"]
    assert "architecture 'phi3' is not supported" in entry.error
    assert entry.info()["error"] == entry.error


def test_no_alias_or_variant_is_made_of_a_model_that_cannot_be_served(tmp_path: Path) -> None:
    """Found probing live: /api/copy and /api/create from a broken file made one more
    broken entry."""
    write_gguf(tmp_path / "phi.gguf", "phi3")
    lib = Library(tmp_path)
    with pytest.raises(RequestError) as err:
        lib.copy("phi", "mine", system="Be brief.")
    assert err.value.status == 422 and "'phi3' is not supported" in err.value.message
    assert lib.get("mine") is None
