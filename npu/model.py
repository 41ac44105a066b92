"""Model: a loaded model, what the layers above use of it: its tokenizer, chat template,
engine, generation defaults and embedding facts (made by npu.load.load_model)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from npu.config import ENCODERS, ModelConfig
from npu.engine.pooling import RANK, Pooling
from npu.engine.protocol import Engine
from npu.errors import ModelError
from npu.sampler import SamplingParams

if TYPE_CHECKING:  # for annotations only: load/ builds these and imports this module
    from npu.load.fim import FimTokens
    from npu.load.template import ChatTemplate
    from npu.load.tokenizer import Tokenizer


class Model:
    """A loaded model: tokenizer, chat template, engine, generation defaults and pooling (the
    engine's: it pools in `embed`)."""

    def __init__(self, *, name: str, path: Path, config: ModelConfig, tokenizer: Tokenizer,
                 template: ChatTemplate | None, engine: Engine,
                 eos_token_ids: tuple[int, ...],
                 defaults: SamplingParams, pooling: Pooling | None = None,
                 tool_template: ChatTemplate | None = None) -> None:
        self.name = name
        self.path = path
        self.config = config
        self.tokenizer = tokenizer
        self.template = template
        # the template for a conversation with tools, where the model has one of its own
        # (named "tool_use": Hermes', Command-R's); None: `template` serves both
        self.tool_template = tool_template
        self.engine = engine
        self.eos_token_ids = eos_token_ids
        self.defaults = defaults
        self._pooling = pooling or Pooling()  # the engine's own (it pools in `embed`)

    @property
    def token_table(self) -> list[bytes]:
        """The bytes each token decodes to, one entry per logit (built once)."""
        table = getattr(self, "_token_table", None)
        if table is None:
            table = self._token_table = self.tokenizer.token_bytes(self.config.vocab_size)
        return table

    @property
    def chat_template_source(self) -> str:
        return self.template.source if self.template else ""

    @property
    def context_length(self) -> int:
        return self.config.max_position

    def render(self, messages: list[dict], tools: list[dict] | None = None, *,
               enable_thinking: bool | None = None, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """The prompt text for a conversation (with the template's BOS, if it writes one)."""
        if not self.generates:
            raise ModelError(f"model {self.name} is {self.role} ({self.kind}): it does not chat")
        if self.template is None:
            raise ModelError(f"model {self.name} has no chat template: use /v1/completions")
        return self.template.render(messages, tools, enable_thinking=enable_thinking,
                                    add_generation_prompt=add_generation_prompt, **kwargs)

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a prompt; BOS is added when the tokenizer wants it and the text does
        not already start with it."""
        tok = self.tokenizer
        ids = tok.encode(text)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        return ids

    @property
    def kind(self) -> str:
        """"decoder" (generates and embeds) or "encoder" (a BERT-family model: embeds
        only), for listings and for the error a generation request on an encoder gets."""
        return "encoder" if self.config.arch in ENCODERS else "decoder"

    @property
    def role(self) -> str:
        """What the model serves, as a refusal names it: "a reranker", "a generation model"
        or "an embedding model"."""
        if self._pooling.mode == RANK:
            return "a reranker"
        return "a generation model" if self.generates else "an embedding model"

    @property
    def generates(self) -> bool:
        """Whether chat and completions can run on the model (an encoder or a reranker
        cannot)."""
        return self.kind == "decoder" and self._pooling.mode != RANK

    @property
    def fim(self) -> FimTokens | None:
        """The fill-in-the-middle tokens of a generation model whose vocabulary has them
        (a code model's: Qwen2.5-Coder, StarCoder2, CodeLlama ...); None otherwise."""
        return self.tokenizer.fim if self.generates else None

    @property
    def pooling(self) -> str:
        """How `engine.embed` pools a token list: "mean", "cls", "last", "max" or "rank" (a
        reranker's classification head: one score per query-document pair)."""
        return self._pooling.mode

    @property
    def rerank_prompt(self) -> str | None:
        """A decoder reranker's prompt, its slots {query}, {document} and maybe {instruction}
        (npu.engine.pooling.Pooling.prompt); None for any other model."""
        return self._pooling.prompt

    @property
    def embedding_dims(self) -> int:
        """The width of `engine.embed`'s vectors (the hidden size, or the last
        sentence-transformers Dense layer's output)."""
        return self._pooling.dims(self.config.hidden_size)

    def embedding_ids(self, text: str, *, limit: int | None = None) -> list[int]:
        """Token ids of one input to embed, with the special tokens the model's tokenizer
        adds around a text: its post-processor's ([CLS] ... [SEP] for BERT, BOS for Llama 3),
        BOS when the tokenizer adds it and the text does not start with it, EOS appended when
        the tokenizer says add_eos (Qwen3-Embedding's `<|endoftext|>`, which last-token
        pooling reads).

        Args:
            limit: the most ids (the context, for Ollama's `truncate`): the text's tokens are
                cut at the end, the special tokens kept around what is left.
        """
        tok = self.tokenizer

        def around(ids: list[int]) -> list[int]:
            if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
                ids = [tok.bos_id] + ids
            if tok.add_eos and tok.eos_id is not None and (not ids or ids[-1] != tok.eos_id):
                ids = ids + [tok.eos_id]
            return ids

        processed = tok.encode_for_embedding(text)
        ids = around(processed)
        if limit is not None and len(ids) > limit:  # again, with room for what `around` adds
            added = len(ids) - len(processed)
            ids = around(tok.encode_for_embedding(text, room=max(0, limit - added)))[:limit]
        return ids

    def thinking_enabled(self, enable_thinking: bool | None = None) -> bool:
        return self.template.thinking_enabled(enable_thinking) if self.template else True

    def tools_enabled(self) -> bool:
        """Whether a conversation with tools shows them to the model (rendered with the
        tool_use template where the model has one)."""
        template = self.tool_template or self.template
        return template.tools_enabled() if template else False
