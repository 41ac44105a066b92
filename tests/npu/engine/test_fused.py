"""The fused layers (one kernel call per step, npu.engine.fused) against the Python path
over the same kernels: the same logits bit for bit, for decode steps, batches, prompt pieces
and prompts that start on a cached prefix, across the formats and architectures it takes;
and the engines it does not take keep the Python path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from npu import load_model
from npu.engine import fused as fused_module
from npu.engine.fused import FusedLayers
from tests.npu.gguf_files import tiny_tokenizer_meta, write_random_gguf

try:
    from npu.engine.cpu_kernels import kernels

    kernels()
    HAVE_KERNELS = True
except Exception:  # no C compiler here: the Python path is all there is
    HAVE_KERNELS = False
pytestmark = pytest.mark.skipif(not HAVE_KERNELS, reason="the CPU kernels cannot be built here")

CASES = {  # name: (arch, format, other formats by tensor)
    "llama-Q4_0": ("llama", QT.Q4_0, None),
    "qwen3-Q8_0": ("qwen3", QT.Q8_0, None),               # q/k norms, head size 128
    "qwen2-Q4_1-bias": ("qwen2", QT.Q4_1, None),          # q/k/v biases
    "llama-mixed": ("llama", QT.Q4_1, {"attn_v": QT.Q8_0, "ffn_down": QT.Q5_0}),  # split q/k/v
    # Gemma 3: norms of the attention's and the MLP's outputs, GeGLU, q/k norms, a scaled
    # embedding, sliding windows of 8 keys; split q/k/v as its Q4_K_M files have them
    "gemma3-Q5_0-mixed": ("gemma3", QT.Q5_0, {"attn_v": QT.Q8_0, "ffn_down": QT.Q4_1}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fused")
    meta = tiny_tokenizer_meta(tiny_dir)
    return {name: write_random_gguf(folder / f"{name}.gguf", arch, qtype, seed=5,
                                    tokenizer_meta=meta, tensor_types=types)
            for name, (arch, qtype, types) in CASES.items()}


def _run(engine) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 900, 120).tolist()
    out = [engine.prefill("a", ids[:70])]                           # 70 rows: 5 row blocks
    out.append(engine.prefill_many([("b", ids[:37]), ("c", ids[50:53])]))  # two pieces
    out.append(engine.prefill("b", ids[37:61]))                     # a piece after a prefix
    got = engine.reuse_prefix("d", ids[:70] + [5, 6, 7])            # whole blocks cached
    out.append(engine.prefill("d", (ids[:70] + [5, 6, 7])[got:]))
    for step in range(4):                                           # batched decode
        out.append(engine.decode(["a", "b", "c", "d"], [step, 11, 12, 13]))
    out.append(engine.decode(["c"], [3]))                           # one sequence
    return out


def _no_python_path(*args):
    raise AssertionError("the fused engine took the Python path")


@pytest.mark.parametrize("name", list(CASES))
def test_one_call_per_step_is_the_python_path_bit_for_bit(files, name: str) -> None:
    fused = load_model(files[name]).engine
    python = load_model(files[name]).engine
    assert fused.fused is not None
    python.fused = None

    fused._layers = _no_python_path
    seconds = fused.fused.seconds.copy()
    for got, want in zip(_run(fused), _run(python)):
        assert np.array_equal(got, want)
    assert (fused.fused.seconds > seconds).all()  # products, attention, the rest were timed


@pytest.mark.parametrize("name", ["llama-mixed", "gemma3-Q5_0-mixed"])
def test_rope_tables_grown_between_steps_keep_the_python_paths_bits(files, name: str,
                                                                     monkeypatch) -> None:
    """The kernels look each row's cos and sin up by its position in tables the step's
    positions grow (each rope's, Gemma 3's local and global alike): tables begun at 8
    positions and grown by prompts, a cached prefix and decode steps past their ends give
    the Python path's logits bit for bit."""
    monkeypatch.setattr(fused_module, "ROPE_ROWS", 8)
    fused = load_model(files[name]).engine
    python = load_model(files[name]).engine
    python.fused = None
    fused._layers = _no_python_path
    for got, want in zip(_run(fused), _run(python)):
        assert np.array_equal(got, want)
    assert len(fused.fused._rope_tables[0][0]) >= 74  # grown past every position seen


@pytest.mark.parametrize("name", ["llama-mixed", "gemma3-Q5_0-mixed"])
def test_sixteen_threads_are_the_python_paths_bits(files, name: str) -> None:
    """A 16-core machine's default: prompts (their tiles, attention blocks and rows shared
    among 16 threads, most with nothing to do in a 3-token piece), cached prefixes and
    batched steps give the logits of the Python path (on this machine's cores) bit for bit."""
    fused = load_model(files[name]).engine
    python = load_model(files[name]).engine
    python.fused = None
    fused.set_threads(16)
    fused._layers = _no_python_path
    for got, want in zip(_run(fused), _run(python)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("name", ["gemma3-Q5_0-mixed", "qwen2-Q4_1-bias"])
@pytest.mark.parametrize("threads", [2, 3, 16])
def test_decode_steps_are_the_python_paths_bits_on_any_thread_count(files, name: str,
                                                                    threads: int) -> None:
    """A small decode step has every thread do the norms, gates and roundings of whole rows
    on its own copies (no barrier after them); a larger one splits the rows as prompts do.
    Either way, on any number of threads, the logits are the Python path's bit for bit."""
    fused = load_model(files[name]).engine
    python = load_model(files[name]).engine
    python.fused = None
    fused.set_threads(threads)
    fused._layers = _no_python_path
    seconds = fused.fused.seconds.copy()
    ids = np.random.default_rng(2).integers(0, 900, 30).tolist()
    for batch in (1, 3, 50):  # 50 rows of this model's 128 products: rows split
        seqs = [f"s{batch}-{i}" for i in range(batch)]
        out = []
        for engine in (fused, python):
            engine.prefill(seqs[0], ids)
            for sid in seqs[1:]:
                engine.fork(seqs[0], sid)
            out.append([engine.decode(seqs, list(range(step, step + batch)))
                        for step in range(3)])
            for sid in seqs:
                engine.release(sid)
        for got, want in zip(*out):
            assert np.array_equal(got, want)
    assert (fused.fused.seconds > seconds).all()  # the one-call step ran


@pytest.mark.parametrize("name", ["qwen3-Q8_0", "gemma3-Q5_0-mixed"])
def test_a_q8_0_cache_is_the_python_paths_bits(files, name: str) -> None:
    """On a Q8_0 KV cache (kv_cache_type q8_0) too: prompts, pieces after a prefix, cached
    prefixes, forks and batched steps, the Python path's logits bit for bit."""
    fused = load_model(files[name], kv_cache_type="q8_0").engine
    python = load_model(files[name], kv_cache_type="q8_0").engine
    python.fused = None
    assert fused.fused is not None and fused.kv.dtype == np.uint8
    fused._layers = _no_python_path
    seconds = fused.fused.seconds.copy()
    for got, want in zip(_run(fused), _run(python)):
        assert np.array_equal(got, want)
    assert (fused.fused.seconds > seconds).all()


def test_a_cache_given_back_and_made_anew_is_the_one_attended(files) -> None:
    """With nothing held and nothing cached the KV arrays go back; the next prompt gets new
    ones, and the one-call step reads and writes those (a fork's copied block is seen: the
    same logits as the Python path), not the arrays it was given before."""
    fused = load_model(files["llama-Q4_0"], prefix_cache=False).engine
    python = load_model(files["llama-Q4_0"], prefix_cache=False).engine
    python.fused = None
    for engine in (fused, python):
        engine.prefill("a", list(range(100, 140)))
        engine.decode(["a"], [7])
        engine.release("a")
    assert fused.kv.capacity == 0  # given back
    for ids in ([5, 6, 7], list(range(300, 360))):
        out = []
        for engine in (fused, python):
            logits = [engine.prefill("e", ids)]
            engine.fork("e", "f")  # the partial last block copied in the arrays themselves
            logits.append(engine.decode(["e", "f"], [9, 10]))
            engine.release("e")
            engine.release("f")
            out.append(logits)
        for got, want in zip(*out):
            assert np.array_equal(got, want)


@pytest.mark.parametrize("window, length", [(1024, 1039), (700, 799), (128, 1039)])
def test_sliding_windows_of_any_length_decode_as_the_python_path(files, window: int,
                                                                 length: int) -> None:
    """Layers that see only the last `window` keys cut a row's keys into spans of their
    own (1,024 of 1,040 keys: more spans than all 1,040 are cut into): the one-call step
    holds every layer's spans and decodes as the Python path does, bit for bit."""
    engines = []
    for fused in (True, False):
        engine = load_model(files["llama-Q4_0"], prefix_cache=False).engine
        engine.max_context = 4096
        for layer in engine.layers:
            layer.window = window
        engine.fused = FusedLayers.of(engine) if fused else None
        engines.append(engine)
    assert engines[0].fused is not None
    ids = np.random.default_rng(1).integers(0, 900, length).tolist()
    got, want = ([e.prefill("a", ids), e.decode(["a"], [7])] for e in engines)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_engines_it_does_not_take_keep_the_python_path(tmp_path, tiny_dir) -> None:
    meta = tiny_tokenizer_meta(tiny_dir)
    for arch, qtype in (("lfm2", QT.Q8_0), ("llama", QT.F32)):
        path = write_random_gguf(tmp_path / f"{arch}.gguf", arch, qtype, tokenizer_meta=meta)
        engine = load_model(path).engine
        assert engine.fused is None, arch
        assert np.isfinite(engine.prefill("p", [1, 2, 3])).all()
