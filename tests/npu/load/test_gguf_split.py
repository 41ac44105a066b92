"""read_gguf on split files (llama.cpp's gguf-split parts): the same model as the whole
file, and a missing part or a later part named instead is a ModelError that says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npu import ModelError, load_model
from npu.load.tiny import ensure_tiny
from tests.npu.gguf_files import tiny_tokenizer_meta, write_random_gguf


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("split")
    meta = tiny_tokenizer_meta(ensure_tiny())
    whole = write_random_gguf(folder / "whole.gguf", "qwen3", tokenizer_meta=meta)
    write_random_gguf(folder / "parts.gguf", "qwen3", tokenizer_meta=meta, split_max_tensors=8)
    parts = sorted(folder.glob("parts-*-of-*.gguf"))
    return whole, parts


def test_split_parts_load_as_the_whole_file(files) -> None:
    whole, parts = files
    assert len(parts) > 2 and parts[0].name.endswith("-00001-of-" + f"{len(parts):05d}.gguf")
    a = load_model(whole, backend="reference")
    b = load_model(parts[0], backend="reference")
    ids = a.tokenizer.encode("hello there")
    np.testing.assert_array_equal(a.engine.prefill(0, ids), b.engine.prefill(0, ids))


def test_a_missing_part_or_a_later_part_is_named(files, tmp_path: Path) -> None:
    _, parts = files
    with pytest.raises(ModelError, match="give the first one"):
        load_model(parts[1])
    for p in parts:
        if p != parts[-1]:
            (tmp_path / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ModelError, match=f"split parts missing: {parts[-1].name}"):
        load_model(tmp_path / parts[0].name)
