"""Fill in the middle in the worker (no Ray), on flm-tiny's tokenizer with Qwen2.5-Coder's
FIM tokens added: the prompt each peer's layout makes (Ollama's templates' and OpenAI's
gap alone, llama-server's repository-level /infill with its shares of the batch), the
middle written after it as the same tokens given as ids are continued, the FIM tokens that
end a middle, and a model without FIM tokens refusing it naming `suffix`."""

from __future__ import annotations

import asyncio

import pytest

from actors.errors import RequestError
from actors.events import Accepted, CompletionGenerate, Deltas, Finished, Infill, Prompt, Usage
from actors.infill import BATCH, infill_ids
from actors.session import build_session
from actors.worker import Worker
from chat import detect_format
from npu import load_model
from npu.load.fim import fim_tokens
from npu.load.tiny import ensure_tiny
from tests.npu.gguf_files import coder_dir

pytestmark = pytest.mark.timeout(120)

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    return load_model(coder_dir(tmp_path_factory.mktemp("coder") / "model"), name="coder")


def _text(model, ids: list[int]) -> str:
    return model.tokenizer.decode(ids, skip_special_tokens=False)


def test_the_fim_tokens_are_found_by_their_spelling(coder) -> None:
    fim = coder.fim
    tok = coder.tokenizer
    assert (fim.prefix, fim.suffix, fim.middle, fim.pad, fim.repo, fim.file) == tuple(
        tok.id_of(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"))
    # <|endoftext|> ends a middle (an instruct model's EOS is <|im_end|>), so do pad,
    # repo and file, as llama.cpp ends a generation on them
    assert set(fim.stops) == {tok.id_of("<|endoftext|>"), fim.pad, fim.repo, fim.file}


def test_other_families_spellings_and_a_gguf_files_ids() -> None:
    codellama = {"▁<PRE>": 32007, "▁<SUF>": 32008, "▁<MID>": 32009, "▁<EOT>": 32010}
    fim = fim_tokens(codellama.get, 32016)
    assert (fim.prefix, fim.suffix, fim.middle, fim.ends) == (32007, 32008, 32009, (32010,))
    deepseek = {"<｜fim▁begin｜>": 5, "<｜fim▁hole｜>": 6, "<｜fim▁end｜>": 7}
    assert fim_tokens(deepseek.get, 10).middle == 7
    starcoder = {"<fim_prefix>": 1, "<fim_middle>": 2, "<fim_suffix>": 3, "<fim_pad>": 4,
                 "<reponame>": 17}
    fim = fim_tokens(starcoder.get, 20)
    assert (fim.pad, fim.repo, fim.file, fim.stops) == (4, 17, None, (4, 17))
    # a GGUF file's ids come first (the older keys too); one past the vocabulary is not read
    meta = {"tokenizer.ggml.fim_pre_token_id": 9, "tokenizer.ggml.suffix_token_id": 8,
            "tokenizer.ggml.fim_mid_token_id": 99}
    fim = fim_tokens(starcoder.get, 20, meta)
    assert (fim.prefix, fim.suffix, fim.middle) == (9, 8, 2)
    # no middle: no FIM
    assert fim_tokens({"<fim_prefix>": 1, "<fim_suffix>": 3}.get, 20) is None


def test_the_gap_alone_is_ollamas_template_layout(coder) -> None:
    ids = infill_ids(coder, PREFIX, Infill(suffix=SUFFIX), limit=4096)
    assert _text(coder, ids) == f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    tok = coder.tokenizer
    assert ids == ([coder.fim.prefix] + tok.encode(PREFIX) + [coder.fim.suffix]
                   + tok.encode(SUFFIX) + [coder.fim.middle])


def test_llama_servers_layout_names_the_repository_and_files(coder) -> None:
    infill = Infill(suffix=SUFFIX, middle="a + ", repository=True,
                    extra=[("util.py", "X = 1\n"), ("b.py", "Y = 2\n")])
    text = _text(coder, infill_ids(coder, PREFIX, infill, limit=4096))
    assert text == ("<|repo_name|>myproject\n<|file_sep|>util.py\nX = 1\n"
                    "<|file_sep|>b.py\nY = 2\n<|file_sep|>filename\n"
                    f"<|fim_prefix|>{PREFIX}a + <|fim_suffix|>{SUFFIX}<|fim_middle|>")


LONG_PREFIX = " ".join(f"p{i}" for i in range(1200))
LONG_SUFFIX = " ".join(f"s{i}" for i in range(400))
FILES = [(f"f{i}.py", " ".join(f"x{i}_{j}" for j in range(200))) for i in range(8)]


def _parts(coder, ids: list[int]) -> tuple[list[int], list[int], list[int]]:
    """The extra files' ids, the prefix's (and the gap's start) and the suffix's."""
    pre, suf, mid = coder.fim.prefix, coder.fim.suffix, coder.fim.middle
    return (ids[: ids.index(pre)], ids[ids.index(pre) + 1 : ids.index(suf)],
            ids[ids.index(suf) + 1 : ids.index(mid)])


def test_llama_servers_shares_cut_the_prefix_start_the_suffix_end_and_old_files(coder) -> None:
    tok = coder.tokenizer
    infill = Infill(suffix=LONG_SUFFIX, middle="m", extra=FILES, repository=True)
    ids = infill_ids(coder, LONG_PREFIX, infill, limit=8192)
    extra, before, after = _parts(coder, ids)
    middle = tok.encode("m")
    # the prefix's last 3/4 of the batch (then the text written in the gap), the suffix's
    # first quarter less the gap's tokens
    assert before == tok.encode(LONG_PREFIX)[-3 * BATCH // 4:] + middle
    assert after == tok.encode(LONG_SUFFIX)[: BATCH // 4 - len(middle)]
    # the files before: their end, in what the context leaves beside the batch, the three
    # FIM tokens and 256 tokens for the middle
    assert len(extra) == 8192 - 1 - 256 - 3 - BATCH
    assert _text(coder, extra).endswith("<|file_sep|>filename\n")
    assert len(ids) == 8192 - 1 - 256


@pytest.mark.parametrize("limit", [4096, 2048, 512, 40])
def test_any_context_leaves_room_for_the_middle(coder, limit: int) -> None:
    """A context of a batch or less shrinks the batch too; the files' cut does not move
    with the request's own output limit (their cached prompt is reused)."""
    infill = Infill(suffix=LONG_SUFFIX, middle="m", extra=FILES, repository=True)
    ids = infill_ids(coder, LONG_PREFIX, infill, limit=limit)
    assert len(ids) == limit - 1 - min(256, limit // 8)
    extra, before, after = _parts(coder, ids)
    assert len(before) > len(after) > 0 or limit == 40


def test_special_token_text_in_the_users_code_stays_text(coder) -> None:
    """A file that spells a FIM or end token (llama.cpp reads input_prefix, input_suffix
    and extra files with parse_special off) is not read as that token; llama-server's
    `prompt` (the gap's start) is read with special tokens, as there."""
    tok = coder.tokenizer
    code = 'END = "<|endoftext|>"; MID = "<|fim_middle|><|fim_middle|>"\n'
    ids = infill_ids(coder, code, Infill(suffix=code, extra=[("t.py", code)],
                                         repository=True), limit=4096)
    assert ids.count(coder.fim.middle) == 1 and tok.id_of("<|endoftext|>") not in ids
    assert _text(coder, ids).count(code) == 3  # the text itself, unchanged
    ids = infill_ids(coder, "x", Infill(suffix="", middle="<|endoftext|>", repository=True),
                     limit=4096)
    assert tok.id_of("<|endoftext|>") in ids


def test_a_model_without_fim_tokens_refuses_naming_suffix(tmp_path) -> None:
    tiny = load_model(ensure_tiny(tmp_path), name="flm-tiny")
    assert tiny.fim is None
    with pytest.raises(RequestError) as err:
        infill_ids(tiny, PREFIX, Infill(suffix=SUFFIX), limit=4096)
    assert err.value.param == "suffix" and "does not support insert" in err.value.message


def test_a_middle_ends_on_the_fim_stops_a_completion_does_not(coder) -> None:
    spec = detect_format(coder.chat_template_source, coder.tokenizer.is_token)
    middle = build_session(CompletionGenerate(request_id="i", prompt=PREFIX,
                                              infill=Infill(suffix=SUFFIX)),
                           coder, spec, lambda: None)
    plain = build_session(CompletionGenerate(request_id="c", prompt=PREFIX), coder, spec,
                          lambda: None)
    fim = coder.fim
    assert set(fim.stops) <= middle.eos_ids
    assert not {fim.pad, fim.repo, fim.file} & plain.eos_ids


async def _events(worker: Worker, request) -> list:
    return [ev async for batch in worker.generate(request) for ev in batch]


def test_the_middle_is_the_continuation_of_the_layouts_tokens(coder) -> None:
    worker = Worker(lambda: coder, max_batch=2)
    try:
        infill = Infill(suffix=SUFFIX, middle="a", repository=True, extra=[("u.py", "U = 1")])
        ids = infill_ids(coder, PREFIX, infill, limit=coder.context_length)
        common = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
        filled = asyncio.run(_events(worker, CompletionGenerate(
            request_id="f", prompt=PREFIX, infill=infill, echo_prompt=True, **common)))
        given = asyncio.run(_events(worker, CompletionGenerate(
            request_id="g", prompt_ids=ids, **common)))
    finally:
        worker.close()
    assert isinstance(filled[0], Accepted) and filled[0].prompt_tokens == len(ids)
    prompt = next(e for e in filled if isinstance(e, Prompt))
    assert prompt.text == _text(coder, ids)  # the prompt as the model read it

    def written(events: list) -> str:
        return "".join(e.text for e in events if isinstance(e, Deltas))

    assert written(filled) == written(given) and written(filled)
    assert [e.completion_tokens for e in filled if isinstance(e, Finished)] == [12]
    assert isinstance(filled[-1], Usage) and filled[-1].prompt_tokens == len(ids)


def _lines(tmp_path, **variants: dict) -> dict[str, tuple[str, list[str]]]:
    """flm-tiny's sampled output of a code prompt (seed 1: it has lines; the coder's random
    middles repeat one FIM token), as it is ("whole") and with each variant's fields: the
    text and the finish reasons of each."""
    tiny = load_model(ensure_tiny(tmp_path), name="flm-tiny")
    worker = Worker(lambda: tiny, max_batch=2)
    common = dict(prompt="def add(a, b):\n    return a\n\n", max_tokens=24,
                  temperature=1.0, seed=1, ignore_eos=True)
    out = {}
    try:
        for name, fields in {"whole": {}, **variants}.items():
            events = asyncio.run(_events(worker, CompletionGenerate(
                request_id=name, **common, **fields)))
            out[name] = ("".join(e.text for e in events if isinstance(e, Deltas)),
                         [e.finish_reason for e in events if isinstance(e, Finished)])
    finally:
        worker.close()
    return out


def test_min_indent_ends_the_output_at_a_dedented_line_as_a_limit(tmp_path) -> None:
    """llama-server's n_indent in the worker: the same sampled output, cut where a line after
    the first is indented less (here a blank line), finish_reason "length"."""
    runs = _lines(tmp_path, cut={"min_indent": 1})
    text = runs["whole"][0]
    start = text.find("\n") + 1
    assert 0 < start < len(text), "this seed's output has a second line"
    ws = len(text[start:]) - len(text[start:].lstrip(" \t"))
    assert runs["cut"] == (text[:start + ws], ["length"])
    assert runs["whole"][1] == ["length"]


def test_a_time_limit_ends_the_output_at_its_next_newline(tmp_path) -> None:
    """llama-server's t_max_predict_ms: past the limit (here any time at all), the output
    ends with the next token that writes a newline, that token kept; finish "length"."""
    runs = _lines(tmp_path, timed={"time_limit_s": 1e-9}, free={"time_limit_s": 3600.0})
    whole, (timed, reasons) = runs["whole"][0], runs["timed"]
    first_line = whole[: whole.index("\n") + 1]
    assert timed.startswith(first_line) and "\n" not in timed[len(first_line):]
    assert len(timed) < len(whole) and reasons == ["length"]
    assert runs["free"][0] == whole  # within the limit: the same output


def test_return_ids_names_each_token_written_once(tmp_path) -> None:
    """llama-server's return_tokens in the worker: the Deltas' ids are the tokens written,
    in order, each once, the text theirs; without it, none."""
    tiny = load_model(ensure_tiny(tmp_path), name="flm-tiny")
    worker = Worker(lambda: tiny, max_batch=2)
    common = dict(prompt="def add(a, b):\n    return a\n\n", max_tokens=24,
                  temperature=1.0, seed=1, ignore_eos=True)
    try:
        plain = asyncio.run(_events(worker, CompletionGenerate(request_id="p", **common)))
        events = asyncio.run(_events(worker, CompletionGenerate(
            request_id="r", return_ids=True, **common)))
    finally:
        worker.close()
    ids = [i for e in events if isinstance(e, Deltas) for i in e.ids or []]
    text = "".join(e.text for e in events if isinstance(e, Deltas))
    assert len(ids) == 24 and tiny.tokenizer.decode(ids) == text
    assert text == "".join(e.text for e in plain if isinstance(e, Deltas))
    assert all(e.ids is None for e in plain if isinstance(e, Deltas))
