"""EncoderEngine: the CPU engine for BERT-family encoders (BERT, nomic-bert; XLM-RoBERTa
read as a BERT, npu.load.pooling), which serve embeddings, or a reranker's scores (a
classification head as the pooling: npu.engine.pooling's "rank").

A layer is BERT's post-norm block: x = LN(x + Attn(x)); x = LN(x + MLP(x)), with biases,
bidirectional attention over each input's own tokens (npu.engine.attention, no KV cache),
learned absolute positions (BERT) or rotary ones (nomic-bert), and a GELU MLP (BERT) or a
SwiGLU one (nomic-bert). The embeddings are word + position + token type (0 for every token
unless `types` are given: a query-document pair's second segment is type 1), then a
LayerNorm. Linear layers are `Linear`s of the engine's backend (npu.engine.linear), so the
integer block formats multiply on the compiled kernels as the decoders' do; LayerNorm and
GELU are numpy.

It has the Engine Protocol's members so a worker can hold it like any engine; those of
generation raise ModelError naming the model an embedding model (or a reranker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from npu.config import ModelConfig
from npu.engine import ops as ops_mod
from npu.engine import rope as rope_mod
from npu.engine.attention import PackedAttention, embed_inputs, row_spans
from npu.engine.cores import default_threads
from npu.engine.linear import Linear, LinearFactory, Threads
from npu.engine.numpy_engine import EMBED_TILE, Tensors
from npu.engine.pooling import RANK, Pooling, pool
from npu.engine.quant import INTEGER, QMatrix
from npu.engine.steps import Steps, run_steps
from npu.errors import ModelError


class EncoderRoles(msgspec.Struct, frozen=True, kw_only=True):
    """Hugging Face tensor names of an encoder architecture (layer names within `layer`,
    formatted with the layer's index; None: the architecture has no such tensor)."""

    word: str = "embeddings.word_embeddings.weight"
    position: str | None = "embeddings.position_embeddings.weight"
    token_type: str = "embeddings.token_type_embeddings.weight"
    embed_norm: str = "embeddings.LayerNorm"
    layer: str = "encoder.layer.{i}."
    q: str | None = "attention.self.query"
    k: str | None = "attention.self.key"
    v: str | None = "attention.self.value"
    qkv: str | None = None
    out: str = "attention.output.dense"
    norm_attn: str = "attention.output.LayerNorm"
    up: str = "intermediate.dense"
    gate: str | None = None
    down: str = "output.dense"
    norm_ff: str = "output.LayerNorm"


BERT = EncoderRoles()
NOMIC_BERT = EncoderRoles(position=None, embed_norm="emb_ln", layer="encoder.layers.{i}.",
                          q=None, k=None, v=None, qkv="attn.Wqkv", out="attn.out_proj",
                          norm_attn="norm1", up="mlp.fc11", gate="mlp.fc12", down="mlp.fc2",
                          norm_ff="norm2")
ROLES = {"bert": BERT, "nomic_bert": NOMIC_BERT}
# checkpoints saved from a model that wraps the encoder (a sequence classifier's included)
PREFIXES = ("bert.", "model.", "roberta.")


class EncoderLayer:
    __slots__ = ("wqkv", "bqkv", "wo", "bo", "norm_attn", "w_up", "b_up", "w_down", "b_down",
                 "norm_ff")


class _Tensors(Tensors):
    """An encoder's tensors (under their names without a wrapping model's prefix)."""

    def __init__(self, weights: dict[str, np.ndarray | QMatrix], linears: LinearFactory,
                 arch: str) -> None:
        super().__init__(weights, linears, arch)
        for name in list(weights):
            for prefix in PREFIXES:
                if name.startswith(prefix) and name[len(prefix):] not in weights:
                    weights[name[len(prefix):]] = weights.pop(name)
                    break

    def maybe(self, name: str) -> np.ndarray | None:
        return self.take(name) if name in self.weights else None

    def norm(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.take(name + ".weight"), self.take(name + ".bias")


def _bias(t: _Tensors, *names: str) -> np.ndarray | None:
    """The biases of a (fused) projection, or None when it has none."""
    parts = [t.maybe(n + ".bias") for n in names]
    if all(p is None for p in parts):
        return None
    if any(p is None for p in parts):
        raise ModelError(f"only some of {', '.join(names)} have a bias")
    return np.concatenate(parts)


class EncoderEngine:
    """Embeddings from a BERT-family encoder: `embed(items)` -> float32 [len(items), dims].

    Args:
        config: the model's config (arch "bert" or "nomic_bert").
        weights: name -> float32 array or `QMatrix`, Hugging Face names; consumed.
        backend: the linear layers' backend ("cpu": the compiled kernels, "reference").
        threads: the kernels' thread count (default: one per physical core, npu.engine.cores).
        pooling: how hidden states become one vector (default: mean).
    """

    kv_max_blocks = 0

    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray | QMatrix], *,
                 backend: str = "cpu", threads: int | None = None,
                 pooling: Pooling | None = None) -> None:
        if config.arch not in ROLES:
            raise ModelError(f"architecture {config.arch!r} is not an encoder (encoders: "
                             f"{', '.join(ROLES)})")
        self.config = c = config
        self.vocab_size, self.max_context = c.vocab_size, c.max_position
        self.pooling = pooling or Pooling()
        self.embedding_dims = self.pooling.dims(c.hidden_size)
        self.linears = LinearFactory(backend, threads or default_threads())
        self.ops = self.linears.ops()
        R = ROLES[c.arch]
        t = _Tensors(weights, self.linears, c.arch)
        word = t.pop(R.word)
        self.embed_tokens = self.linears.embedding(
            word if isinstance(word, QMatrix) else QMatrix.from_float(word))
        self.positions = t.take(R.position) if c.absolute_positions else None
        if self.positions is not None and len(self.positions) < self.max_context:
            raise ModelError(f"{R.position} has {len(self.positions)} rows for a context of "
                             f"{self.max_context}")
        self.token_types = t.maybe(R.token_type)  # [type vocabulary, hidden]; None: none
        self.embed_norm = t.norm(R.embed_norm)
        self.layers = [self._layer(t, R, i) for i in range(c.num_layers)]
        self.inv_freq = None if c.absolute_positions else rope_mod.inv_freq(c.rope["default"],
                                                                            c.head_dim)
        self.scale = np.float32(c.head_dim ** -0.5)
        if not self._integer_weights():
            self.ops.threads = Threads(1)  # BLAS's threads do the products (NumpyEngine's why)

    def _layer(self, t: _Tensors, R: EncoderRoles, i: int) -> EncoderLayer:
        p = R.layer.format(i=i)
        L = EncoderLayer()
        qkv = [p + R.qkv] if R.qkv else [p + R.q, p + R.k, p + R.v]
        L.wqkv = t.linear(*(n + ".weight" for n in qkv))
        L.bqkv = _bias(t, *qkv)
        L.wo, L.bo = t.linear(p + R.out + ".weight"), _bias(t, p + R.out)
        L.norm_attn = t.norm(p + R.norm_attn)
        mlp = [p + R.gate, p + R.up] if R.gate else [p + R.up]  # SwiGLU: [gate | up]
        L.w_up = t.linear(*(n + ".weight" for n in mlp))
        L.b_up = _bias(t, *mlp)
        L.w_down, L.b_down = t.linear(p + R.down + ".weight"), _bias(t, p + R.down)
        L.norm_ff = t.norm(p + R.norm_ff)
        return L

    def _linears(self) -> list[Linear]:
        return [w for L in self.layers for w in (L.wqkv, L.wo, L.w_up, L.w_down)]

    def _integer_weights(self) -> bool:
        parts = [p for lin in self._linears() for p in getattr(lin, "parts", [lin])]
        return any(p.matrix.qtype in INTEGER for p in parts)

    # -- the Engine Protocol ------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as held."""
        vectors = [a for a in (self.positions, self.token_types, *self.embed_norm)
                   if a is not None]
        for L in self.layers:
            vectors += [a for a in (L.bqkv, L.bo, L.b_up, L.b_down, *L.norm_attn, *L.norm_ff)
                        if a is not None]
        return (self.embed_tokens.matrix.nbytes + sum(w.nbytes for w in self._linears())
                + sum(a.nbytes for a in vectors))

    def weight_summary(self) -> dict[str, Any]:
        """`parameters` (the matrices' and embeddings' values) and `quantization` (the
        format holding most of the layers' matrices)."""
        count, by_format = int(np.prod(self.embed_tokens.matrix.shape)), {}
        for lin in self._linears():
            for p in getattr(lin, "parts", [lin]):
                size = int(np.prod(p.shape))
                count += size
                name = p.matrix.qtype.name
                by_format[name] = by_format.get(name, 0) + size
        if self.positions is not None:
            count += self.positions.size
        return {"parameters": count,
                "quantization": max(by_format, key=by_format.get) if by_format else "F32"}

    def set_threads(self, n: int) -> None:
        self.linears.threads.n = max(1, int(n))

    def check_device(self) -> None:
        """The CPU is always there."""

    def _no_generation(self, *_: object) -> Any:
        kind = "a reranker" if self.pooling.mode == RANK else "an embedding model"
        raise ModelError(f"{self.config.arch} is {kind} (an encoder): it does not generate "
                         "text")

    prefill = prefill_many = decode = reuse_prefix = blocks_needed = fork = _no_generation
    verify = rewind = _no_generation
    can_rewind = False

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """Nothing is ever cached."""
        return 0

    def blocks_available(self) -> int:
        return 0

    def release(self, seq_id: object) -> None:
        """No sequence is ever held."""

    def length(self, seq_id: object) -> int:
        return 0

    def kv_usage(self) -> dict[str, int]:
        return {"sequences": 0, "kv_blocks": 0, "cached_blocks": 0, "kv_bytes": 0}

    # -- embeddings ---------------------------------------------------------------------------
    def embed(self, items: Sequence[Sequence[int]], *,
              types: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """Pooled vectors of token lists (with their [CLS] / [SEP] already), all in one
        forward: float32 [len(items), dims], not normalized (a reranker's: [len(items), 1],
        each pair's score). Bidirectional attention over each list's own tokens; a row is the
        same whatever else is in the batch. `embed_steps`, run to its end.

        Args:
            items: token ids, one list per input (a reranker's: a query-document pair each).
            types: each token's type (segment), one list per item of its length (a pair's
                second segment is 1 in BERT); None: 0 for every token.

        Raises:
            ValueError: a list is empty, has an id outside the vocabulary, or its types do
                not match it or the model's token types.
            ContextLengthError: a list is longer than the model's context.
        """
        return run_steps(self.embed_steps(items, types=types))

    def embed_steps(self, items: Sequence[Sequence[int]], *,
                    types: Sequence[Sequence[int]] | None = None) -> Steps[np.ndarray]:
        """`embed` in steps (the vectors are the generator's value): a step is one layer's
        work before or after its attention for a span of at most EMBED_TILE packed rows
        (`row_spans`); the numbers do not depend on the steps."""
        if not items:
            return np.zeros((0, self.embedding_dims), dtype=np.float32)
        lengths, ids = embed_inputs(items, self.max_context, self.vocab_size)
        segments = None if types is None else self._types(types, lengths)
        positions = np.concatenate([np.arange(n) for n in lengths])
        x = yield from self._hidden(ids, positions, lengths, segments)
        return pool(x, lengths, self.pooling)

    def _types(self, types: Sequence[Sequence[int]], lengths: list[int]) -> np.ndarray:
        """`types` packed as the ids are (int64), checked against the items and the model."""
        if len(types) != len(lengths) or any(len(t) != n for t, n in zip(types, lengths)):
            raise ValueError("types must hold one type per token of each item")
        packed = np.asarray([t for row in types for t in row], dtype=np.int64)
        rows = 0 if self.token_types is None else len(self.token_types)
        if packed.size and (packed.min() < 0 or packed.max() >= max(rows, 1)):
            raise ValueError(f"token types must be in 0..{max(rows, 1) - 1} for this model")
        return packed

    def _hidden(self, ids: np.ndarray, positions: np.ndarray, lengths: list[int],
                types: np.ndarray | None = None) -> Steps[np.ndarray]:
        c, eps = self.config, self.config.rms_eps
        x = self.embed_tokens(ids)
        if self.positions is not None:
            x = x + self.positions[positions]
        if self.token_types is not None:  # type 0 everywhere unless types are given
            x = x + (self.token_types[0] if types is None else self.token_types[types])
        x = np.ascontiguousarray(ops_mod.layer_norm(x, *self.embed_norm, eps), dtype=np.float32)
        cos_sin = None if self.inv_freq is None else rope_mod.cos_sin(self.inv_freq, positions,
                                                                      1.0)
        spans = row_spans(lengths, EMBED_TILE)
        qkv = np.empty((len(x), 3 * c.num_heads * c.head_dim), dtype=np.float32)
        for L in self.layers:
            for a, b in spans:  # the rows' queries, keys and values
                rows = _plus(L.wqkv(x[a:b]), L.bqkv)
                if cos_sin is not None:
                    rows = self.ops.qk_rope(rows, c.num_heads, c.num_heads, None, None, eps,
                                            cos_sin[0][a:b], cos_sin[1][a:b])
                qkv[a:b] = rows
                yield
            att = PackedAttention(self.ops, qkv, c.num_heads, c.num_heads, c.head_dim, lengths,
                                  causal=False, scale=self.scale)
            for a, b in spans:  # once every key is there: the rest of the layer
                h = ops_mod.layer_norm(x[a:b] + _plus(L.wo(att.rows(a, b)), L.bo),
                                       *L.norm_attn, eps)
                up = _plus(L.w_up(h), L.b_up)
                up = self.ops.gated(up, "silu") if c.activation == "silu" else self.ops.gelu(up)
                x[a:b] = ops_mod.layer_norm(h + _plus(L.w_down(up), L.b_down), *L.norm_ff, eps)
                yield
        return x


def _plus(y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    return y if bias is None else y + bias
