"""Fill in the middle: a completion's prompt (the text before a gap) and its `Infill` (the
text after it, llama-server's extra files) laid out in the model's FIM tokens, the prompt
the model writes the middle after.

Two layouts, each as its peer writes it:
- the gap alone (Ollama's code models' templates, OpenAI's `suffix`):
  [BOS] <PRE> prefix <SUF> suffix <MID>
- llama-server's /infill (format_prompt_infill): a repository-level header where the model
  has its tokens (Qwen2.5-Coder's <|repo_name|> and <|file_sep|>), each extra file, the
  gap's own file, then the gap with the text already written at its start after the prefix:
  [BOS] <REPO>myproject\n <FILE>name\n text ... <FILE>filename\n
        <PRE> prefix middle <SUF> suffix <MID>
  the prefix's end and the suffix's start cut to llama-server's shares of its 2,048-token
  batch (3/4 and 1/4), the extra files' end to what the context leaves (llama-server puts
  BOS after the extra files; here it leads, where the model was trained to read it).
"""

from __future__ import annotations

from actors.errors import FIM_UNSUPPORTED, RequestError
from actors.events import Infill
from npu import Model

BATCH = 2048  # llama-server's default batch: the prefix and suffix get shares of it
RESERVE = 256  # the most tokens kept free for the middle (llama-server keeps 2 x n_predict)
REPOSITORY = "myproject\n"  # llama-server's name of the repository
OWN_FILE = "filename\n"  # ... of the gap's own file
SNIPPET = "\n\n--- snippet ---\n\n"  # ... before an extra file, without file tokens


def fim_refusal(model: Model) -> RequestError:
    """The 400 for a model without FIM tokens (Ollama's "does not support insert"); its
    code, FIM_UNSUPPORTED, makes it llama-server's 501 on /infill."""
    return RequestError(f'"{model.name}" does not support insert: filling in the middle '
                        "('suffix') needs a code model's FIM tokens in the vocabulary, such as "
                        "Qwen2.5-Coder's <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>.",
                        param="suffix", code=FIM_UNSUPPORTED)


def infill_ids(model: Model, prefix: str, infill: Infill, *, limit: int) -> list[int]:
    """The prompt's token ids (`limit`: the tokens prompt and output may take). The user's
    text is read as text (an added token's spelling in a file is not that token), but
    llama-server's `middle`, which it reads with special tokens, as it does.

    llama-server's layout fits the context whatever the request's own limit is (the files'
    cut must not move between requests, or their cached prompt would not be reused): the
    gap's text in a batch of min(2,048, context less a reserve of min(256, context / 8)
    tokens for the middle), the extra files in the rest.

    Raises:
        RequestError: the model has no FIM tokens (400, `suffix`).
    """
    fim = model.fim
    if fim is None:
        raise fim_refusal(model)
    tok = model.tokenizer
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    before, after = tok.encode_text(prefix), tok.encode_text(infill.suffix)
    middle = tok.encode(infill.middle)
    extra: list[int] = []
    if infill.repository:
        if fim.repo is not None:
            extra += [fim.repo] + tok.encode(REPOSITORY)
        for name, text in infill.extra:
            extra += ([fim.file] + tok.encode_text(name + "\n") if fim.file is not None
                      else tok.encode(SNIPPET))
            extra += tok.encode_text(text)
        if fim.file is not None:
            extra += [fim.file] + tok.encode(OWN_FILE)
        # the prompt stays under the limit with the reserve free: BOS, the three FIM tokens,
        # the gap's text in `batch` (3/4 before, 1/4 after: llama-server's shares), the rest
        # for the files
        usable = max(0, limit - 1 - min(RESERVE, limit // 8) - len(bos) - 3)
        batch = min(BATCH, usable)
        before = before[max(0, len(before) - 3 * batch // 4):]
        after = after[:max(0, batch - 3 * batch // 4 - len(middle))]
        room = usable - batch
        extra = extra[max(0, len(extra) - room):]
    return (bos + extra + [fim.prefix] + before + middle + [fim.suffix] + after
            + [fim.middle])
