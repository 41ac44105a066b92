"""Our GGUF header reader gives what gguf's GGUFReader gives, fast, and fails cleanly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from npu.load import gguf_header
from npu.load.gguf_header import read_header
from npu.load.loader import default_model_path


def _theirs(path: Path) -> tuple[dict, list[tuple]]:
    r = GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    table = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset),
              int(t.n_bytes)) for t in r.tensors]
    return meta, table


@pytest.fixture(params=["python", "c"])
def walk(request):
    """The runs of strings walked in Python, or by the kernels' C (the loader's)."""
    if request.param == "python":
        return None
    from npu.engine import convert

    if not convert.available():
        pytest.skip("the kernels cannot be built here (no C walk of strings)")
    return convert.strings_joined


def _ours(path: Path, walk=None) -> tuple[dict, list[tuple]]:
    h = read_header(path, walk=walk)
    return h.meta, [(t.name, t.shape, t.tensor_type, t.data_offset, t.n_bytes)
                    for t in h.tensors]


def _every_kind(path: Path, *, alignment: int | None = None) -> Path:
    w = GGUFWriter(str(path), "llama")
    if alignment:
        w.add_uint32("general.alignment", alignment)
    for i, kind in enumerate(("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                              "int64")):
        getattr(w, f"add_{kind}")(f"test.{kind}", i + 1 if kind.startswith("u") else -i - 1)
    w.add_float32("test.float32", 1e-5)
    w.add_float64("test.float64", 1e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo <|im_end|>")
    w.add_array("test.strings", ["a", "", "ü" * 300, "Ġthe"])
    # long arrays are decoded at once, joined by NULs: one holding a NUL reads one by one
    w.add_array("test.many", [f"{i}é" * (i % 5) for i in range(200)])
    w.add_array("test.nul", [*("x" * 70), "a\0b", ""])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.bools", [True, False])
    w.add_array("test.empty", [])
    w.add_key_value("test.nested", [[1, 2], [3]], GGUFValueType.ARRAY)
    rng = np.random.default_rng(0)
    from gguf import quants

    w.add_tensor("a.weight", quants.quantize(rng.standard_normal((8, 64)).astype(np.float32),
                                             QT.Q4_1), raw_dtype=QT.Q4_1)
    w.add_tensor("b.weight", np.ones(7, dtype=np.float32))
    w.add_tensor("c.weight", rng.standard_normal((3, 5)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_kind_and_the_tensor_table_read_as_gguf_reads_them(
        tmp_path: Path, alignment: int | None, walk) -> None:
    path = _every_kind(tmp_path / "k.gguf", alignment=alignment)
    meta, table = _ours(path, walk)
    # arrays of arrays: GGUFReader's contents() runs them together; ours keeps the nesting
    assert meta.pop("test.nested") == [[1, 2], [3]]
    theirs = _theirs(path)
    assert theirs[0].pop("test.nested") == [1, 2, 3]
    assert (meta, table) == theirs
    assert meta["test.strings"][2] == "ü" * 300
    assert table[0][4] == 8 * 64 // 32 * 20 and table[0][3] % (alignment or 32) == 0


def test_the_default_model_reads_as_gguf_reads_it(walk) -> None:
    path = default_model_path()
    assert _ours(path, walk) == _theirs(path)


def test_a_header_longer_than_the_first_read_is_read_on(tmp_path: Path, monkeypatch,
                                                         walk) -> None:
    path = _every_kind(tmp_path / "k.gguf")
    monkeypatch.setattr(gguf_header, "FIRST_READ", 16)
    assert _ours(path, walk)[1] == _theirs(path)[1]
    whole = _ours(path)
    for first in range(500, 5000, 250):  # some cut inside the run of 200 strings
        monkeypatch.setattr(gguf_header, "FIRST_READ", first)
        assert _ours(path, walk) == whole


def test_damaged_headers_are_value_errors(tmp_path: Path, walk) -> None:
    good = _every_kind(tmp_path / "k.gguf").read_bytes()
    # the table ends at most 31 bytes before the data (padded to the alignment, 32)
    end = read_header(tmp_path / "k.gguf").tensors[0].data_offset - 31
    bad = tmp_path / "bad.gguf"
    for cut in range(0, end, 7):  # cuts through the header
        bad.write_bytes(good[:cut])
        with pytest.raises(ValueError):
            read_header(bad, walk=walk)
    for damaged in (b"GGML" + good[4:], good[:4] + b"\x09" + good[5:]):  # magic, version
        bad.write_bytes(damaged)
        with pytest.raises(ValueError, match="magic|version"):
            read_header(bad)


def test_a_run_of_strings_longer_than_the_file_is_a_value_error(tmp_path: Path, walk) -> None:
    """A count no file could hold (a corrupt header) fails as a damaged header does."""
    import struct

    key = b"test.strings"
    for count in (2**64 - 1, 2**40, 1000):
        data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                + struct.pack("<IIQ", 9, 8, count) + struct.pack("<Q", 1) + b"a" * 64)
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(data)
        with pytest.raises(ValueError):
            read_header(bad, walk=walk)
