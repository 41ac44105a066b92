"""GGUF files: every architecture and block format against transformers reading the same
file, the tokenizer against transformers', the real default model, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from npu import ModelError, NumpyEngine, config_from_json, load_model
from npu.engine.quant import QMatrix
from tests.npu.gguf_files import tiny_tokenizer_meta, write_random_gguf
from tests.shared import MISSING, SHARED

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = [1, 969, 198, 283, 359, 253, 556, 564, 1117, 365, 28, 17, 453, 30, 216, 41]


@pytest.fixture(scope="module")
def tok_meta(tiny_dir: Path) -> dict:
    return tiny_tokenizer_meta(tiny_dir)


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


def _oracle_logits(file: Path, ids: list[int]) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _teacher_forced(model, ids: list[int]) -> np.ndarray:
    eng = model.engine
    rows = [eng.prefill("s", ids[:1])]
    for t in ids[1:]:
        rows.append(eng.decode(["s"], [t])[0])
    eng.release("s")
    return np.stack(rows)


CASES = [("llama", QT.Q8_0), ("llama", QT.Q4_0), ("llama", QT.Q4_1), ("qwen2", QT.Q5_0),
         ("qwen3", QT.Q5_1), ("qwen3", QT.F16), ("gemma3", QT.Q8_0), ("lfm2", QT.Q4_1),
         ("llama", QT.BF16), ("qwen3", QT.Q4_K), ("llama", QT.Q5_K), ("qwen3", QT.Q6_K)]
KQUANTS = (QT.Q4_K, QT.Q5_K, QT.Q6_K)


@pytest.mark.parametrize("arch,qtype", CASES, ids=[f"{a}-{q.name}" for a, q in CASES])
def test_engine_on_gguf_matches_transformers(tmp_path: Path, tok_meta: dict, arch: str,
                                             qtype: QT) -> None:
    dims = (256, 512, 2, 1, 128, 2) if qtype in KQUANTS else None
    file = write_random_gguf(tmp_path / f"{arch}.gguf", arch, qtype, tokenizer_meta=tok_meta,
                             tied=arch != "qwen2", embed_qtype=QT.Q8_0, dims=dims)
    expected = _oracle_logits(file, IDS)
    scale = np.abs(expected).max()
    for backend in ("cpu", "reference"):
        got = _teacher_forced(load_model(file, backend=backend), IDS)
        # Q6_K is converted to Q8_0 at load: that conversion's error, not arithmetic's
        # (Q4_K and Q5_K become Q4_1 and Q5_1 with their own codes, their scales rounded to
        # f16); the kernels round activations to 8 bits for the integer formats (as
        # llama.cpp), the Q8_0 embedding that is also the head included
        rounded = qtype == QT.Q6_K or backend == "cpu"
        tol = 2e-2 if rounded else 1e-3 if qtype in (QT.Q4_K, QT.Q5_K) else 2e-4
        err = np.abs(got - expected).max() / scale
        agree = (got.argmax(-1) == expected.argmax(-1)).mean()
        assert err <= tol, (backend, arch, qtype)
        assert agree >= (0.9 if rounded else 1.0)


def test_batched_and_prefill_paths_agree_on_a_quantized_model(tmp_path: Path,
                                                              tok_meta: dict) -> None:
    """Prefill (BLAS over expanded slices) and batched decode (kernels on several rows)
    give what one-token decode gives."""
    model = load_model(write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q4_1,
                                         tokenizer_meta=tok_meta))
    eng = model.engine
    ids = IDS * 2
    whole = eng.prefill("a", ids)
    stepped = _teacher_forced(model, ids)[-1]
    assert np.allclose(whole, stepped, atol=1e-4 * np.abs(whole).max())
    eng.prefill("b", ids[:5])
    eng.prefill("c", ids[:9])
    both = eng.decode(["b", "c"], [ids[5], ids[9]])
    for row, n in ((0, 6), (1, 10)):
        alone = _teacher_forced(model, ids[:n])[-1]
        assert np.allclose(both[row], alone, atol=1e-4 * np.abs(alone).max())


def test_an_engine_packed_later_runs_only_once_packed_and_as_one_packed_at_once(
        tmp_path: Path, tok_meta: dict) -> None:
    """The loader's engine leaves its last weights to `pack()` (built beside the tokenizer):
    before it a forward pass is refused, after it the logits are those of an engine whose
    weights were packed as they were made."""
    from npu.load.gguf import read_gguf

    path = write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q4_0, tokenizer_meta=tok_meta)
    g = read_gguf(path)
    config = config_from_json(g.config)
    later = NumpyEngine(config, dict(g.tensors), pack_later=True)
    now = NumpyEngine(config, dict(read_gguf(path).tensors))
    if not later.linears.unpacked:
        pytest.skip("this build has no packed layout (no AVX2): nothing is left to pack")
    with pytest.raises(RuntimeError, match="pack"):
        later.prefill("a", IDS)
    with pytest.raises(RuntimeError, match="pack"):
        later.embed([IDS])
    later.pack(threads=1)
    assert later.linears.unpacked == 0
    assert np.array_equal(later.prefill("a", IDS), now.prefill("a", IDS))
    assert np.array_equal(later.decode(["a"], [IDS[0]]), now.decode(["a"], [IDS[0]]))


def test_k_quants_converted_straight_into_the_packed_layout_compute_the_same_bits(
        tmp_path: Path, tok_meta: dict) -> None:
    """The loader's k-quant matrices come converted straight into the kernels' packed
    layout (Llama's Q/K rows reordered on the way; a layer's Q, K, V one buffer): the
    logits are those of an engine that packed the converted matrices itself."""
    from npu.engine.convert import packed_rows
    from npu.engine.linear import PackedMatrix
    from npu.load.gguf import read_gguf

    if not packed_rows():
        pytest.skip("this build has no packed layout (no AVX2)")
    path = write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q4_K, tokenizer_meta=tok_meta,
                             dims=(256, 512, 2, 1, 128, 2))
    model = load_model(path)
    layer = model.engine.layers[0]
    assert isinstance(layer.w_down.matrix, PackedMatrix)
    assert layer.w_down.matrix.qtype == QT.Q4_1
    g = read_gguf(path)
    assert not isinstance(g.tensors["model.layers.0.mlp.down_proj.weight"], PackedMatrix)
    own = NumpyEngine(model.config, dict(g.tensors))
    assert np.array_equal(model.engine.prefill("a", IDS), own.prefill("a", IDS))
    assert np.array_equal(model.engine.decode(["a"], [IDS[1]]), own.decode(["a"], [IDS[1]]))


def test_weights_stay_in_their_block_format(tmp_path: Path, tok_meta: dict) -> None:
    model = load_model(write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q4_0,
                                         tokenizer_meta=tok_meta))
    eng = model.engine
    layer = eng.layers[0]
    assert layer.wqkv.matrix.qtype == QT.Q4_0 and layer.w_down.matrix.qtype == QT.Q4_0
    # the tied head is the embedding's blocks, not a copy
    assert eng.lm_head.matrix is eng.embed_tokens.matrix
    H, F = 64, 128
    q4_bytes = (4 * 16 * H * 2 + 2 * 2 * 16 * H + 3 * F * H) * 18 // 32  # per layer
    assert eng.weight_bytes < 2 * q4_bytes + eng.embed_tokens.matrix.nbytes + 10_000


@pytest.mark.parametrize("qtype,held_as,bits", [(QT.Q4_K, QT.Q4_1, 5), (QT.Q5_K, QT.Q5_1, 6)])
def test_q4_k_and_q5_k_are_held_with_their_own_codes(tmp_path: Path, tok_meta: dict,
                                                      qtype: QT, held_as: QT, bits: int) -> None:
    """A Q4_K (Q5_K) file's matrices take 5 (6) bits a weight in memory as Q4_1 (Q5_1), not
    Q8_0's 8.5, and hold the file's values up to the f16 rounding of each block's scale and
    offset."""
    from gguf import GGUFReader

    file = write_random_gguf(tmp_path / "m.gguf", "llama", qtype, tokenizer_meta=tok_meta,
                             dims=(256, 512, 2, 1, 128, 2), embed_qtype=QT.Q8_0)
    down = next(t for t in GGUFReader(str(file)).tensors if t.name == "blk.0.ffn_down.weight")
    assert QT(int(down.tensor_type)) == qtype
    expected = QMatrix(qtype, (256, 512), np.array(down.data)).dequantize()
    held = load_model(file, backend="reference").engine.layers[0].w_down.matrix
    assert held.qtype == held_as and held.nbytes == 256 * 512 * bits // 8
    assert np.abs(held.dequantize() - expected).max() <= 2.0 ** -11 * np.abs(expected).max()


@pytest.mark.parametrize("qtype", KQUANTS)
def test_k_quant_conversions_report_a_bound_on_their_error(qtype: QT) -> None:
    from tests.npu.gguf_files import random_blocks

    m = QMatrix(qtype, (40, 512), random_blocks(np.random.default_rng(1), 40, 512, qtype))
    out, bound = m.to_native()
    assert out.qtype == {QT.Q4_K: QT.Q4_1, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}[qtype]
    values = m.dequantize()
    real = np.abs(out.dequantize() - values).max() / np.abs(values).max()
    assert real <= bound <= 1.5 * real


def test_tokenizer_matches_transformers_on_smollm2(smollm2) -> None:
    from npu.load.loader import default_model_path

    file = default_model_path()
    model = smollm2
    ref = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    texts = ["Hello world", "Ünïcödé àccents", "中文字符测试", "emoji 🎉🐍 mix", "  runs   of\t\ttabs",
             "def f(x):\n    return x**2  # code", "numbers 12345 and 3.14159",
             "<|im_start|>user\nhi<|im_end|>", "it's we'll they'd"]
    for text in texts:
        assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False), text
        ids = model.tokenizer.encode(text)
        assert model.tokenizer.decode(ids, skip_special_tokens=False) == text


def _qwen_meta(folder: Path) -> dict:
    """Qwen's vocabulary (../shared's tokenizer files) as GGUF tokenizer metadata."""
    vocab = json.loads((folder / "vocab.json").read_text())
    added = json.loads((folder / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    size = max(max(vocab.values()), max(int(i) for i in added)) + 1
    tokens, types = [f"[PAD{i}]" for i in range(size)], [1] * size
    for t, i in vocab.items():
        tokens[i] = t
    for i, a in added.items():
        tokens[int(i)] = a["content"]
        types[int(i)] = 3 if a.get("special") else 4
    merges = [line for line in (folder / "merges.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.eos_token_id": 151645,
            "tokenizer.ggml.add_bos_token": False}
    return meta


def test_tokenizer_matches_qwen_hugging_face_tokenizer() -> None:
    """Qwen's vocabulary written into GGUF metadata (pre "qwen2") encodes as its own
    tokenizer does."""
    folder = SHARED / "formats" / "tokenizers" / "qwen3"
    if not (folder / "vocab.json").exists():
        pytest.skip(MISSING)
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    from npu.load.gguf_tokenizer import tokenizer_json
    from npu.load.tokenizer import Tokenizer

    ours = Tokenizer(tokenizer_json(_qwen_meta(folder)))
    texts = ["Hello world", "Ünïcödé àccents", "中文字符测试，标点。", "emoji 🎉🐍 mix",
             "  runs   of\t\ttabs\n\n\n", "def f(x):\n    return x**2  # code",
             "numbers 12345 and 3.14159", "<|im_start|>user\nhi<|im_end|><think>x</think>"]
    for text in texts:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text


def test_qwens_fim_tokens_are_found_and_its_users_text_never_reads_as_them() -> None:
    """The real Qwen vocabulary: its FIM tokens by llama.cpp's spellings (ids from its
    tokenizer_config.json), `<|endoftext|>` ending a middle; a file that spells them is
    encoded as text (llama.cpp's parse_special off), back to the same text."""
    folder = SHARED / "formats" / "tokenizers" / "qwen3"
    if not (folder / "vocab.json").exists():
        pytest.skip(MISSING)
    from npu.load.gguf_tokenizer import tokenizer_json
    from npu.load.tokenizer import Tokenizer

    meta = _qwen_meta(folder)
    tok = Tokenizer(tokenizer_json(meta), meta=meta)
    fim = tok.fim
    assert (fim.prefix, fim.middle, fim.suffix, fim.pad, fim.repo, fim.file) == \
        (151659, 151660, 151661, 151662, 151663, 151664)
    assert fim.ends == (151643,)
    code = 'S = ["<|fim_prefix|>", "<|endoftext|>", "<|im_end|><think>"]\n'
    ids = tok.encode_text(code)
    assert not {151643, 151645, 151659, 151667} & set(ids)
    assert tok.decode(ids, skip_special_tokens=False) == code
    assert tok.encode_text("no specials here") == tok.encode("no specials here")


def test_rendering_matches_apply_chat_template() -> None:
    from npu.load.loader import default_model_path

    file = default_model_path()
    ref = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model = load_model(file)  # the file's own template, not ours
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Tell me a joke."}]
    assert model.render(msgs) == ref.apply_chat_template(msgs, tokenize=False,
                                                         add_generation_prompt=True)


def test_our_smollm2_template_keeps_a_later_system_message_as_the_files_does(smollm2) -> None:
    """A system (or developer) message past the first, as Codex-style clients send one
    beside `instructions`, is a system turn where it stands, as the file's own template
    writes it (ours dropped it)."""
    from npu.load.loader import default_model_path

    own = load_model(default_model_path())  # the file's own template, not ours
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "system", "content": "Reply in French only."},
            {"role": "user", "content": "Hi"}]
    assert smollm2.render(msgs) == own.render(msgs)
    later = [msgs[1], msgs[2], msgs[3]]  # the default system prompt, then the later one
    assert smollm2.render(later) == own.render(later)


def _greedy(model, prompt: str, tokens: int) -> list[int]:
    ids = model.prompt_ids(model.render([{"role": "user", "content": prompt}]))
    logits = model.engine.prefill("g", ids)
    out = []
    for _ in range(tokens):
        tok = int(np.argmax(logits))
        out.append(tok)
        if tok in model.eos_token_ids:
            break
        logits = model.engine.decode(["g"], [tok])[0]
    model.engine.release("g")
    return out


def _forced(model, prompt: str, reply: list[int]) -> np.ndarray:
    """Teacher-forced along `reply`: the logits before each of its tokens [len(reply), V]
    (up to and including an end-of-sequence token)."""
    ids = model.prompt_ids(model.render([{"role": "user", "content": prompt}]))
    rows = [model.engine.prefill("g", ids)]
    for tok in reply[:-1]:
        if tok in model.eos_token_ids:
            break
        rows.append(model.engine.decode(["g"], [tok])[0])
    model.engine.release("g")
    return np.stack(rows)


def _gaps(logits: np.ndarray, reply: list[int]) -> np.ndarray:
    """How far each of the reply's tokens is below its step's best logit (0: the greedy
    choice)."""
    return logits.max(axis=1) - logits[np.arange(len(logits)), reply[:len(logits)]]


def _relative_error(ours: np.ndarray, exact: np.ndarray) -> float:
    """The logits' error against float32 relative to their spread, a shift common to a
    step's logits left out (softmax ignores it): mean over the steps of
    |d - mean d| / |x - mean x|, d = ours - exact."""
    d = ours - exact
    d = d - d.mean(axis=1, keepdims=True)
    x = exact - exact.mean(axis=1, keepdims=True)
    return float(np.mean(np.linalg.norm(d, axis=1) / np.linalg.norm(x, axis=1)))


# What 8-bit activations cost this model, as both instruction-set paths of the kernels
# compute it (AVX-512 VNNI's packed product with exact integer code sums; AVX2's block
# product with llama.cpp's f16 code sums), measured teacher-forced along the six fixture
# replies on a VNNI Xeon/EPYC (-march=native) and with -march=x86-64-v3:
# - relative error (_relative_error over all steps): 0.036 (VNNI), 0.035 (AVX2); per reply
#   0.030-0.046. A kernel with one activation block's scale 10% off in every product reads
#   0.078-0.104 per reply (0.09 over all): REL_ERROR sits between, 1.6x above the correct
#   paths.
# - the change the rounding makes to the difference of two of float32's five best logits at
#   a step: up to 1.66 (VNNI), 1.36 (AVX2); 0.3-0.6 on most steps. The peers' replies part at
#   near ties, so a peer's token can be that far below ours. PAIR_ERROR bounds it.
# - the cats reply: float32's best leads its second by 0.41 or more at every step, and the
#   rounding moved those two by at most 0.29 (VNNI) / 0.31 (AVX2): both paths keep it.
REL_ERROR = 0.06
PAIR_ERROR = 2.0


def test_smollm2_greedy_replies_are_transformers_and_llama_cpps(smollm2) -> None:
    """The default model against both peers' greedy replies (bench/record_greedy.py recorded
    them in bench/fixtures/smollm2_greedy.json; they differ on two of the three prompts).
    On the numpy reference (float32, as transformers) the greedy replies are transformers',
    token for token. On the kernels (8-bit activations, as llama.cpp) the cats sentence is
    both peers' reply token for token; teacher-forced along every peer reply the kernels'
    logits are within what 8-bit rounding costs of float32's (REL_ERROR), and each reply
    token is below the kernels' best by at most its distance below float32's best plus the
    most the rounding moves a difference of two top logits (PAIR_ERROR): transformers'
    tokens are float32's greedy choices, llama.cpp's are its own under the same kind of
    rounding. Bounds measured on the AVX-512 VNNI and AVX2 paths (above); the first-token
    tie of the France prompt ("The" and "L", 0.08 apart in float32) is what makes the
    peers part."""
    fixture = json.loads((Path(__file__).parents[3] / "bench" / "fixtures" /
                          "smollm2_greedy.json").read_text())
    cases = fixture["cases"]
    assert [c["llama_cpp_agrees"] for c in cases] == [True, False, False]
    assert _greedy(smollm2, cases[0]["prompt"], cases[0]["tokens"]) == cases[0]["ids"]
    reference = load_model("smollm2-135m", backend="reference")
    ours, exact = [], []
    for case in cases:
        for reply in (case["ids"], case["llama_cpp_ids"]):
            k = _forced(smollm2, case["prompt"], reply)
            r = _forced(reference, case["prompt"], reply)
            assert np.all(_gaps(k, reply) <= _gaps(r, reply) + PAIR_ERROR), case["prompt"]
            ours.append(k)
            exact.append(r)
    assert _relative_error(np.concatenate(ours), np.concatenate(exact)) <= REL_ERROR
    for case in cases:
        assert _greedy(reference, case["prompt"], case["tokens"]) == case["ids"]


def _broken(file: Path, tok_meta: dict, damage: str) -> str:
    """Write a damaged file; returns what the error must name."""
    if damage == "iq2":  # a type the engine does not run, in real IQ2_XXS blocks
        write_random_gguf(file, "llama", QT.Q8_0, tokenizer_meta=tok_meta,
                          tensor_types={"ffn_up": QT.IQ2_XXS}, dims=(256, 256, 4, 2, 64, 1))
        return "blk.0.ffn_up.weight: tensor type IQ2_XXS"
    write_random_gguf(file, "llama", QT.Q8_0, tokenizer_meta=tok_meta)
    data = file.read_bytes()
    if damage == "shape":  # the metadata's FFN width no longer matches the tensors
        from gguf import GGUFReader

        reader = GGUFReader(str(file), "r+")
        reader.fields["llama.feed_forward_length"].parts[-1][0] = 96
        reader.data.flush()
        del reader
        return "ffn_gate.weight"
    file.write_bytes({"truncated": data[: len(data) // 2], "magic": b"XXXX" + data[4:],
                      "arch": data.replace(b"llama", b"zorba")}[damage])
    return "zorba" if damage == "arch" else "bad.gguf"


@pytest.mark.parametrize("damage", ["truncated", "magic", "arch", "iq2", "shape"])
def test_bad_gguf_files_are_model_errors_naming_them(tmp_path: Path, tok_meta: dict,
                                                     damage: str) -> None:
    file = tmp_path / "bad.gguf"
    named = _broken(file, tok_meta, damage)
    with pytest.raises(ModelError, match=named):
        load_model(file)


def test_a_directory_holding_one_gguf_loads_and_chat_template_overrides(
        tmp_path: Path, tok_meta: dict) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    write_random_gguf(folder / "m.gguf", "qwen3", QT.Q8_0, tokenizer_meta=tok_meta)
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    model = load_model(folder, chat_template=tmp_path / "t.jinja")
    assert model.render([{"role": "user", "content": "x"}]) == "[x]"
    shutil.copy(folder / "m.gguf", folder / "n.gguf")
    with pytest.raises(ModelError, match="several GGUF"):
        load_model(folder)


def test_quantize_option_for_hugging_face_checkpoints(tiny_dir: Path) -> None:
    """A safetensors checkpoint quantized at load: weights in Q8_0, outputs close."""
    full = load_model(tiny_dir)
    q8 = load_model(tiny_dir, quantize="q8_0")
    assert q8.engine.layers[0].wqkv.matrix.qtype == QT.Q8_0
    assert q8.engine.weight_bytes < 0.4 * full.engine.weight_bytes
    ids = [1, 2, 3, 4, 5, 6]
    a, b = full.engine.prefill("x", ids), q8.engine.prefill("x", ids)
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
    with pytest.raises(ModelError, match="quantize"):
        load_model(tiny_dir, quantize="q3_x")


STORIES = SHARED / "models" / "stories260K"
STORIES_GREEDY = [403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
                  401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
                  328]


def _stories_gguf(path: Path, qtype: QT) -> Path:
    """stories260K (a real trained Llama) written as llama.cpp writes a GGUF: its
    SentencePiece vocabulary with scores from tok512.bin (`llama` tokenizer model), and
    attn_q / attn_k rows permuted for ggml's RoPE."""
    import struct

    from gguf import GGUFWriter, quants
    from safetensors.numpy import load_file

    hf = STORIES / "hf-f32"
    cfg = json.loads((hf / "config.json").read_text())
    raw = (STORIES / "tok512.bin").read_bytes()  # max length, then per id: score, length, bytes
    at, scores = 4, []
    while at < len(raw):
        score, n = struct.unpack_from("<fi", raw, at)
        scores.append(score)
        at += 8 + n
    vocab = json.loads((hf / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)  # the pieces as SentencePiece spells them
    types = [2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else
             6 if t.startswith("<0x") else 1 for t in tokens]
    w = GGUFWriter(str(path), "llama")
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for key, value in (("block_count", cfg["num_hidden_layers"]), ("context_length", 512),
                       ("embedding_length", cfg["hidden_size"]),
                       ("feed_forward_length", cfg["intermediate_size"]),
                       ("attention.head_count", heads), ("attention.head_count_kv", kv)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", scores)
    w.add_array("tokenizer.ggml.token_type", types)
    for key, value in (("bos_token_id", 1), ("eos_token_id", 2), ("unknown_token_id", 0)):
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "q_proj": "attn_q",
             "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, a in load_file(str(hf / "model.safetensors")).items():
        parts = name.split(".")
        kind = names[parts[-2]]
        gname = (f"blk.{parts[2]}.{kind}.weight" if parts[1] == "layers" else f"{kind}.weight")
        if kind in ("attn_q", "attn_k"):  # llama.cpp's converter: halves -> adjacent pairs
            n = heads if kind == "attn_q" else kv
            a = a.reshape(n, 2, a.shape[0] // n // 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape)
        if a.ndim == 2 and kind != "token_embd" and qtype != QT.F32:
            w.add_tensor(gname, quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.skipif(not (STORIES / "tok512.bin").exists(), reason=MISSING)
def test_stories260k_as_gguf_tokenizes_and_generates_like_its_checkpoint(tmp_path: Path) -> None:
    """A SentencePiece (`llama`) GGUF tokenizer encodes as the checkpoint's tokenizer.json,
    and the permuted Q/K rows are undone: greedy output is the reference text."""
    from npu.load.tokenizer import Tokenizer

    model = load_model(_stories_gguf(tmp_path / "stories.gguf", QT.F32))
    ref = Tokenizer(STORIES / "hf-f32" / "tokenizer.json")
    for text in ["Once upon a time, there was a little girl named Lily.", "  two  spaces",
                 "Zoë's café: 42 apples!", "line one\nline two", "日本"]:
        assert model.tokenizer.encode(text) == ref.encode(text), text
        assert model.tokenizer.decode(model.tokenizer.encode(text)) == ref.decode(
            ref.encode(text))
    eng = model.engine
    logits, out = eng.prefill("s", [1]), []
    for _ in range(len(STORIES_GREEDY)):
        out.append(int(np.argmax(logits)))
        logits = eng.decode(["s"], [out[-1]])[0]
    assert out == STORIES_GREEDY


def test_rope_freqs_tensor_scales_the_frequencies_as_llama3(tmp_path: Path,
                                                            tok_meta: dict) -> None:
    """Llama 3.1 GGUFs carry Llama 3's RoPE scaling as a rope_freqs tensor of divisors."""
    from npu.engine.rope import inv_freq
    from npu.config import Rope

    llama3 = Rope(theta=10000.0, kind="llama3", factor=8.0, original_max_position=64)
    plain = inv_freq(Rope(theta=10000.0), 16)
    factors = (plain / inv_freq(llama3, 16)).astype(np.float32)
    assert not np.allclose(factors, 1.0)
    file = write_random_gguf(tmp_path / "m.gguf", "llama", QT.Q8_0, tokenizer_meta=tok_meta,
                             extra={"rope_freqs.weight": factors})
    model = load_model(file)
    assert np.allclose(inv_freq(model.config.rope["default"], 16), inv_freq(llama3, 16),
                       rtol=1e-6)
    assert model.engine.prefill("a", IDS).shape == (model.engine.vocab_size,)


def test_a_tool_use_template_is_kept_beside_the_default(tmp_path: Path, tok_meta: dict) -> None:
    """A GGUF file's named `tokenizer.chat_template.tool_use` (Hermes', Command-R's, as
    llama.cpp's converter writes named templates) is the template for conversations with
    tools; a chat_template given at load replaces both."""
    meta = {**tok_meta, "tokenizer.chat_template": "{{ messages[0].content }}",
            "tokenizer.chat_template.tool_use": "{{ tools[0].function.name }}"}
    file = write_random_gguf(tmp_path / "m.gguf", "qwen3", QT.Q8_0, tokenizer_meta=meta)
    model = load_model(file)
    assert model.template.source == "{{ messages[0].content }}"
    assert model.tool_template.source == "{{ tools[0].function.name }}"
    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}!")
    assert load_model(file, chat_template=tmp_path / "t.jinja").tool_template is None
