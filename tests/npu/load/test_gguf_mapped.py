"""GGUF files read through a memory map hold the bytes the former reading (each tensor read
into memory of its own, k-quants converted by the numpy reference) held, format by format;
the formats held as stored are views of the map, not copies."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from npu.engine import convert
from npu.engine.quant import QMatrix
from npu.load.gguf import hf_name, read_gguf, unpermute_order
from tests.npu.gguf_files import tiny_tokenizer_meta, write_random_gguf

FORMATS = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.F16, QT.BF16, QT.Q4_K, QT.Q5_K,
           QT.Q6_K]
STORED = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.F16, QT.BF16}
# hidden, ffn, heads, kv heads, head dim, layers: rows of 256 values for the k-quants
DIMS = (256, 512, 2, 1, 128, 1)


@pytest.fixture(scope="module")
def tok_meta(tiny_dir: Path) -> dict:
    return tiny_tokenizer_meta(tiny_dir)


def _former(file: Path) -> dict[str, np.ndarray | QMatrix]:
    """The tensors as the former reader held them (Llama's Q/K rows unpermuted)."""
    out = {}
    for t in GGUFReader(str(file)).tensors:
        name, qtype = hf_name("llama", t.name), QT(int(t.tensor_type))
        raw = np.array(t.data).view(np.uint8).reshape(-1)
        shape = tuple(int(d) for d in t.shape[::-1])
        if len(shape) == 1:
            out[name] = QMatrix(qtype, (1, shape[0]), raw).dequantize()[0]
            continue
        m = QMatrix(qtype, shape, raw)
        if ".attn_q." in t.name or ".attn_k." in t.name:
            m = m.reorder(unpermute_order(shape[0], DIMS[2] if ".attn_q." in t.name else DIMS[3]))
        out[name] = m.to_native(reference=True)[0]
    return out


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_mapped_reading_holds_the_former_bytes(tmp_path: Path, tok_meta: dict,
                                               qtype: QT) -> None:
    file = write_random_gguf(tmp_path / "m.gguf", "llama", qtype, tokenizer_meta=tok_meta,
                             dims=DIMS, tied=False)
    got = read_gguf(file, progress=False).tensors
    want = _former(file)
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        if isinstance(w, np.ndarray):
            assert np.array_equal(g, w), name
            continue
        assert (g.qtype, g.shape) == (w.qtype, w.shape), name
        assert np.array_equal(g.data, w.data), name
        # held as stored: a view of the mapped file, unless reordered (Llama's Q and K)
        mapped = not g.data.flags.writeable
        assert mapped == (qtype in STORED and ".q_proj" not in name and ".k_proj" not in name), name


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED") or not Path("/proc/self/status").exists(),
                    reason="needs Linux: madvise(MADV_DONTNEED) and /proc/self/status's RssFile")
def test_pages_handed_back_read_again_the_same(tmp_path: Path, tok_meta: dict) -> None:
    """`QMatrix.concat` hands its mapped parts' pages back; the parts still read the file."""
    file = write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q8_0, tokenizer_meta=tok_meta,
                             dims=(256, 4096, 2, 1, 128, 1))  # FFN matrices of many pages
    t = read_gguf(file, progress=False).tensors
    gate, up = t["model.layers.0.mlp.gate_proj.weight"], t["model.layers.0.mlp.up_proj.weight"]
    before = gate.data.copy(), up.data.copy()  # their pages now resident
    resident = _rss_file()
    both = QMatrix.concat([up, gate])  # (gate then up lie one after the other: a view)
    handed_back = resident - _rss_file()
    assert handed_back > 0.8 * (gate.nbytes + up.nbytes), (handed_back, gate.nbytes)
    assert np.array_equal(both.data, np.concatenate(before[::-1]))
    assert np.array_equal(gate.data, before[0]) and np.array_equal(up.data, before[1])


def _rss_file() -> int:
    """This process's resident pages of mapped files, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssFile in /proc/self/status")


@pytest.mark.skipif(not convert.available(), reason="the CPU kernels cannot be built here (the "
                    "numpy conversion makes each matrix its own)")
def test_a_layers_converted_matrices_stack_without_a_copy(tmp_path: Path,
                                                            tok_meta: dict) -> None:
    """Q/K/V and gate/up converted into one buffer each, in the engine's order: stacking
    them is a view with the bytes a copy would hold (V in another format stays apart)."""
    file = write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q4_K, tokenizer_meta=tok_meta,
                             dims=DIMS, tensor_types={"attn_v": QT.Q6_K})
    t = read_gguf(file, progress=False).tensors
    p = "model.layers.0."
    q, k, v = (t[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
    gate, up = t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]
    for parts in ([q, k], [gate, up]):
        both = QMatrix.concat(parts)
        assert np.shares_memory(both.data, parts[0].data)
        assert np.array_equal(both.data, np.concatenate([m.data for m in parts]))
    assert v.qtype == QT.Q8_0 and not np.shares_memory(v.data, k.data)
