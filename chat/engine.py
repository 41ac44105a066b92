"""GrammarEngine: xgrammar's tokenizer info and compiler for one model, with a compile cache.

Built once per model (lazily, by whoever first needs a grammar) from the decoded bytes of
every token: xgrammar's RAW vocabulary type works for byte-level BPE and SentencePiece alike.
Compiling is CPU work that can take 100 ms: call it from a worker thread, never on an event
loop. xgrammar (and the torch it imports) is loaded only here and in `chat.decode`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from chat.decode import GrammarConstraint, TokenBanConstraint, make_constraint
from chat.errors import ConstraintError
from chat.spec import HARMONY_CALL, HARMONY_END, HARMONY_RETURN

# xgrammar's messages begin with a time and its source file's path: not the user's
_SOURCE = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ")


class GrammarEngine:
    """Compiles structural tags against one vocabulary.

    Args:
        vocab: vocab[i] is the bytes token i decodes to; the length is the model's logits
            width (padding entries are b"").
        stop_token_ids: the model's stop tokens.
        cache_size: compiled grammars kept, least recently used dropped first. default: 64.
        max_threads: xgrammar compile threads. default: 2 (the machines here have 2 cores).
        on_compile: called for every grammar a request needs, with whether it came from the
            cache and the seconds a cold compile took (for the caller's metrics).
    """

    def __init__(
        self,
        vocab: Sequence[bytes],
        stop_token_ids: Sequence[int],
        *,
        cache_size: int = 64,
        max_threads: int = 2,
        on_compile: Callable[[bool, float], None] | None = None,
    ) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab = [bytes(v) for v in vocab]
        self.vocab_size = len(self.vocab)
        self.stop_token_ids = [int(t) for t in stop_token_ids if 0 <= int(t) < self.vocab_size]
        # Harmony's grammars spell <|call|>, <|return|> and <|end|> as text; as xgrammar stop
        # tokens they would be allowed anywhere by the mask and then rejected.
        text_stops = {m.encode() for m in (HARMONY_CALL, HARMONY_RETURN, HARMONY_END)}
        self.info = xgr.TokenizerInfo(
            self.vocab,
            vocab_type=xgr.VocabType.RAW,
            vocab_size=self.vocab_size,
            stop_token_ids=[t for t in self.stop_token_ids if self.vocab[t] not in text_stops],
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads,
                                            cache_enabled=False)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._on_compile = on_compile
        self._ids: dict[bytes, int] | None = None

    def token_id(self, text: str) -> int | None:
        """The id of the token that decodes to exactly `text`, if there is one."""
        if self._ids is None:
            ids: dict[bytes, int] = {}
            for i, b in enumerate(self.vocab):
                if b:
                    ids.setdefault(b, i)
            self._ids = ids
        return self._ids.get(text.encode("utf-8"))

    def compile(self, tag: dict, *, param: str | None = None) -> Any:
        """The compiled grammar of a structural tag (cached by its canonical JSON).

        Raises:
            ConstraintError: xgrammar cannot build the grammar (an unsupported schema);
                `param` names the request option it came from.
        """
        key = json.dumps(tag, sort_keys=True, separators=(",", ":"))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is not None:
            if self._on_compile is not None:
                self._on_compile(True, 0.0)
            return hit
        xgr = self._xgr
        t0 = time.perf_counter()
        try:
            compiled = self.compiler.compile_structural_tag(xgr.StructuralTag.from_json(tag))
        except Exception as exc:  # xgrammar raises several types for a bad schema
            raise ConstraintError("The schema cannot be used for constrained decoding: "
                                  f"{_SOURCE.sub('', str(exc)).strip()}", param=param) from exc
        if self._on_compile is not None:
            self._on_compile(False, time.perf_counter() - t0)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any, stop_token_ids: Sequence[int]) -> Any:
        """A matcher for `compiled` that ends on `stop_token_ids` (none: a model, such as a
        gpt-oss one, whose only stop tokens the grammar spells as text)."""
        return self._xgr.GrammarMatcher(compiled,
                                        override_stop_tokens=list(stop_token_ids) or None)

    def accepts(self, spec, request, prefill: str, text: str) -> tuple[bool, str]:
        """Feed a whole output through the grammar for `request`.

        Returns:
            (True, "") when the grammar accepts `prefill + text` as a complete output, else
            (False, why) naming the byte of `text` where it failed.
        """
        constraint = make_constraint(spec, request, self)
        if constraint is None:
            return True, ""
        if isinstance(constraint, TokenBanConstraint):
            if spec.tool_start and spec.tool_start in text:
                at = len(text[: text.index(spec.tool_start)].encode("utf-8"))
                return False, f"banned tool opener at byte {at}"
            return True, ""
        assert isinstance(constraint, GrammarConstraint)
        constraint.start(prefill)
        if not constraint.active:
            return False, "the prefill is rejected"
        return constraint.check_text(text)
