"""Decode constraints: what the decode loop calls each step to mask and advance.

`make_constraint` returns a `GrammarConstraint` (an xgrammar matcher over the request's
structural tag), a `TokenBanConstraint` (tool_choice "none": the tool opener is banned),
or None: nothing to constrain, and the loop pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import numpy as np

from chat.errors import ConstraintError
from chat.grammar import (
    has_lengths,
    python_unenforced,
    schema_fault,
    structural_tag,
    text_markers,
    tool_schema_tag,
)
from chat.request import ConstraintRequest
from chat.spec import FormatKind, FormatSpec

log = logging.getLogger(__name__)


class Grammars(Protocol):
    """What a constraint needs from a model's grammar engine (`chat.engine.GrammarEngine`
    is the one implementation; it imports this module, never the other way round)."""

    vocab: list[bytes]
    vocab_size: int
    stop_token_ids: list[int]

    def token_id(self, text: str) -> int | None: ...

    def compile(self, tag: dict, *, param: str | None = None) -> Any: ...

    def matcher(self, compiled: Any, stop_token_ids: list[int]) -> Any: ...


def mask_words(vocab_size: int) -> int:
    """uint32 words in a mask over `vocab_size` tokens (bit i of word i // 32)."""
    return (vocab_size + 31) // 32


class DecodeConstraint(Protocol):
    active: bool
    # the output is complete and nothing may follow (a grammar whose only stops it spells as
    # text, such as harmony's <|call|>, written out in ordinary tokens): end the choice
    ended: bool
    # the output left the grammar and masking stopped (the rest is unconstrained)
    gave_up: bool

    def start(self, prefill: str) -> None: ...

    def fill_mask(self, buf: np.ndarray) -> bool: ...

    def accept(self, token: int) -> None: ...

    def accept_forced(self, token: int) -> None: ...

    def rollback(self, n: int) -> None: ...

    def admits(self, tokens: list[int]) -> int: ...


class TokenBanConstraint:
    """Bans one token (the tool opener under tool_choice "none")."""

    def __init__(self, token_id: int, vocab_size: int) -> None:
        self.active = True
        self.ended = False
        self.gave_up = False  # a ban never gives up
        self.token_id = token_id
        self._mask = np.full(mask_words(vocab_size), 0xFFFFFFFF, dtype=np.uint32)
        self._mask[token_id // 32] &= np.uint32(~(1 << (token_id % 32)) & 0xFFFFFFFF)

    def start(self, prefill: str) -> None:
        pass

    def fill_mask(self, buf: np.ndarray) -> bool:
        buf[:] = self._mask
        return True

    def accept(self, token: int) -> None:
        pass

    def accept_forced(self, token: int) -> None:
        pass

    def rollback(self, n: int) -> None:
        pass

    def admits(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order, may come next: those before the banned one."""
        return tokens.index(self.token_id) if self.token_id in tokens else len(tokens)


class GrammarConstraint:
    """An xgrammar matcher for one request.

    If the prefill or a forced token opens reasoning that the grammar left out, it switches
    to the precompiled with-reasoning grammar and replays what it had accepted; if the
    matcher still rejects a token it logs once and stops masking for this request.
    """

    def __init__(
        self,
        engine: Grammars,
        compiled: Any,
        *,
        with_reasoning: Any = None,
        stop_token_ids: list[int],
        skip_prefix: str = "",
        request_id: str = "",
    ) -> None:
        self.engine = engine
        self.active = True
        self.ended = False
        self.gave_up = False  # the matcher rejected the output: masking stopped
        self.request_id = request_id
        self._stop = stop_token_ids
        self._with_reasoning = with_reasoning
        self._skip = skip_prefix
        self._prefill = ""
        self._history: list[int] = []
        self.matcher = engine.matcher(compiled, stop_token_ids)

    @property
    def tokens(self) -> list[int]:
        """The tokens accepted so far (not counting the prefill)."""
        return list(self._history)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, prefill: str) -> None:
        if self._skip and prefill.startswith(self._skip):
            prefill = prefill[len(self._skip) :]
        self._prefill = prefill
        if not prefill or self.matcher.accept_string(prefill):
            return
        if not self._use_reasoning_grammar():
            self.give_up(f"the prefill {prefill!r} is rejected")

    def fill_mask(self, buf: np.ndarray) -> bool:
        if not self.active:
            return False
        return bool(self.matcher.fill_next_token_bitmask(buf.view(np.int32).reshape(1, -1)))

    def accept(self, token: int) -> None:
        if not self.active:
            return
        if self.matcher.accept_token(int(token)):
            self._history.append(int(token))
            if not self._stop and self.matcher.is_completed():
                self.ended = self._nothing_may_follow()
        else:
            self.give_up(f"token {token} is rejected")

    def _nothing_may_follow(self) -> bool:
        buf = np.zeros(mask_words(self.engine.vocab_size), dtype=np.uint32)
        self.matcher.fill_next_token_bitmask(buf.view(np.int32).reshape(1, -1))
        return not buf.any()

    def accept_forced(self, token: int) -> None:
        if not self.active:
            return
        if self.matcher.accept_token(int(token)):
            self._history.append(int(token))
            return
        if self._use_reasoning_grammar() and self.matcher.accept_token(int(token)):
            self._history.append(int(token))
            return
        self.give_up(f"forced token {token} is rejected")

    def rollback(self, n: int) -> None:
        if self.active and n > 0:
            self.matcher.rollback(n)
            del self._history[-n:]

    def admits(self, tokens: list[int]) -> int:
        """How many of `tokens` (drafted ones), in order, the grammar takes next; the matcher
        is left as it was (all of them when masking has stopped)."""
        if not self.active:
            return len(tokens)
        n = 0
        for t in tokens:  # nothing after a stop token (the matcher would log each one)
            if self.matcher.is_terminated() or not self.matcher.accept_token(int(t)):
                break
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def give_up(self, why: str) -> None:
        if self.active:
            self.gave_up = True
            log.warning("Constrained decoding disabled for request %s: %s",
                        self.request_id or "-", why)
        self.active = False

    def _use_reasoning_grammar(self) -> bool:
        """Switch to the with-reasoning grammar and replay; False when there is none or the
        replay fails."""
        if self._with_reasoning is None:
            return False
        matcher = self.engine.matcher(self._with_reasoning, self._stop)
        self._with_reasoning = None
        if self._prefill and not matcher.accept_string(self._prefill):
            return False
        for t in self._history:
            if not matcher.accept_token(t):
                return False
        self.matcher = matcher
        return True

    # -- checking whole outputs -----------------------------------------------------------
    def check_text(self, text: str) -> tuple[bool, str]:
        """Accept `text` as the rest of the output; (ok, why not)."""
        m = self.matcher
        if not m.accept_string(text):
            return False, self._locate(text)
        if not m.is_completed():
            return False, f"the output is incomplete at its end (byte {len(text.encode())})"
        return True, ""

    def _locate(self, text: str) -> str:
        m = self.matcher
        # the failed accept_string left the matcher unchanged: feed one character at a time
        offset = 0
        for ch in text:
            if not m.accept_string(ch):
                at = len(text.encode("utf-8")[:offset].decode("utf-8", "ignore"))
                return f"rejected at byte {offset}: {text[max(0, at - 20) : at + 20]!r}"
            offset += len(ch.encode("utf-8"))
        return f"rejected at byte {offset}"


def make_constraint(
    spec: FormatSpec,
    request: ConstraintRequest,
    engine: Grammars | Callable[[], Grammars] | None,
    *,
    request_id: str = "",
    tools_enabled: bool = True,
    thinking_enabled: bool = True,
) -> DecodeConstraint | None:
    """The decode constraint for a request, or None when nothing is constrained.

    Args:
        spec: the model's format.
        request: the normalised request options.
        engine: the model's grammar engine, or a function that makes it (called only when
            the request needs one: a lazily built engine costs nothing otherwise).
        request_id: for the log line if the constraint has to give up.
        tools_enabled: False for a model whose template leaves the tools out of the prompt:
            `required` and a named function are refused, `auto` drops the tool grammar.
            (A content_only format, one whose calls this server cannot read, refuses
            `required` and a named function too.)
        thinking_enabled: False when the model renders with thinking off: reasoning is
            then not allowed in the grammar.

    Raises:
        ConstraintError: the request cannot be served on this model (HTTP 400).
    """
    request = effective_request(request, tools_enabled=tools_enabled,
                                thinking_enabled=thinking_enabled)
    if spec.kind is FormatKind.CONTENT_ONLY and request.tools and \
            request.tool_choice == "required":
        raise ConstraintError(
            "This model's chat format has no tool-call syntax that this server reads (its "
            "replies are plain content), so it cannot be made to call a tool; use "
            "tool_choice 'auto' (a call the model writes comes back as its text) or 'none'.",
            param="tool_choice")
    if request.tool_choice == "none" and request.all_tools and request.response_format == "text":
        if engine is None or not spec.tool_start:
            return None
        engine = _made(engine)
        # a bare call's opening is also a JSON answer's: only the marker is kept out
        openers = (spec.tool_start,) if spec.bare_call else spec.tool_openers
        token = engine.token_id(spec.tool_start)
        if token is not None and len(openers) <= 1:
            return TokenBanConstraint(token, engine.vocab_size)
        if spec.kind is FormatKind.HARMONY:  # its calls are named in headers it writes
            return None
        # an opener of several tokens (SmolLM2's "<tool_call>"): text that never spells it,
        # or a history full of calls is copied as markup in the content
        tag = {"type": "structural_tag",
               "format": {"type": "any_text", "excludes": list(openers)}}
        return GrammarConstraint(engine, engine.compile(tag, param="tool_choice"),
                                 stop_token_ids=list(engine.stop_token_ids),
                                 request_id=request_id)
    declared = [x.name for x in request.all_tools]
    for t in request.tools:
        found = _left_out(spec, t.parameters) if t.strict else None
        if found:
            i = declared.index(t.name) if t.name in declared else 0
            raise ConstraintError(f"Tool {t.name!r} is strict, but this model's calls cannot "
                                  f"be held to {found}: remove it, or send the tool without "
                                  "`strict`.", param=f"tools[{i}].function.parameters")
    tag = structural_tag(spec, request)
    if tag is None:
        return None
    if engine is None:
        raise ValueError("this request needs a grammar engine")
    engine = _made(engine)
    param = "response_format.json_schema.schema" if request.json_schema else "tools"
    try:
        compiled = engine.compile(tag, param=param)
    except ConstraintError:
        loose = _loosened(spec, request, engine, request_id)
        if loose is None:  # the response format's schema: the request asked for it
            raise
        request = loose
        compiled = engine.compile(structural_tag(spec, request), param=param)
    with_reasoning = None
    if spec.reasoning and not request.allow_reasoning:
        alt = structural_tag(spec, msgspec.structs.replace(request, allow_reasoning=True))
        if alt is not None:
            with_reasoning = engine.compile(alt, param=param)
    markers = set(text_markers(spec))
    stops = [t for t in engine.stop_token_ids
             if engine.vocab[t].decode("utf-8", "replace") not in markers]
    return GrammarConstraint(
        engine, compiled, with_reasoning=with_reasoning, stop_token_ids=stops,
        skip_prefix="assistant" if spec.kind is FormatKind.HARMONY else "",
        request_id=request_id,
    )


def _left_out(spec: FormatSpec, parameters: Any) -> str | None:
    """What a format's own call syntax leaves out of a tool's schema (beside what every
    format's does, chat.unenforced): LFM2's Python calls (`python_unenforced`); Gemma 4's
    strings, whose delimiters the compiler keeps out of them and then drops their lengths
    (xgrammar 0.2.9 warns "not applied together with JSONSchemaFormat.excludes")."""
    if spec.kind is FormatKind.LFM2_PYTHONIC:
        return python_unenforced(parameters, "parameters")
    if spec.kind is FormatKind.GEMMA4 and has_lengths(parameters):
        return "a string's `minLength` / `maxLength` (in Gemma 4's call syntax)"
    return None


def _loosened(spec: FormatSpec, request: ConstraintRequest, engine: Grammars,
              request_id: str) -> ConstraintRequest | None:
    """The request with each tool whose argument schema does not compile (a keyword or a
    pattern the grammar compiler does not take) taking any JSON object for its arguments,
    as OpenAI's and Anthropic's non-strict tools are taken: one odd tool among an agent's
    many does not refuse the request. None when every tool's schema compiles.

    Raises:
        ConstraintError: a tool's parameters are no schema, or a strict tool's schema does
            not compile."""
    bad = set()
    declared = [x.name for x in request.all_tools]
    for t in request.tools:
        i = declared.index(t.name) if t.name in declared else 0
        try:
            engine.compile(tool_schema_tag(spec, t.parameters))
        except ConstraintError as exc:
            fault = schema_fault(t.parameters, "parameters")
            if fault:  # no schema at all: the client's mistake, said as such
                raise ConstraintError(f"Tool {t.name!r}: {fault}.",
                                      param=f"tools[{i}].function.parameters") from None
            if t.strict:  # the client asked for its schema exactly: said, not loosened
                raise ConstraintError(f"Tool {t.name!r} is strict: {exc.message}",
                                      param=f"tools[{i}].function.parameters") from None
            bad.add(t.name)
            log.warning("Request %s: the arguments of tool %r are not constrained (its "
                        "schema does not compile: %s)", request_id, t.name, exc)
    if not bad:
        return None
    tools = tuple(msgspec.structs.replace(t, parameters={"type": "object"}) if t.name in bad
                  else t for t in request.tools)
    return msgspec.structs.replace(request, tools=tools)


def _made(engine: Grammars | Callable[[], Grammars]) -> Grammars:
    """The engine itself, made first when `make_constraint` was given its maker."""
    return engine if hasattr(engine, "compile") else engine()


def effective_request(
    request: ConstraintRequest, *, tools_enabled: bool = True, thinking_enabled: bool = True
) -> ConstraintRequest:
    """Apply what the model can do to a request (see `make_constraint`)."""
    if not tools_enabled and request.tools:
        if request.tool_choice == "required":
            raise ConstraintError(
                "This model's chat template does not show tools to the model, so it cannot be "
                "made to call one; use tool_choice 'auto' or 'none'.", param="tool_choice")
        request = request.without_tools()
    if not thinking_enabled and request.allow_reasoning:
        request = msgspec.structs.replace(request, allow_reasoning=False)
    return request


def needs_grammar(spec: FormatSpec, request: ConstraintRequest) -> bool:
    """Whether `make_constraint` will need the model's grammar engine."""
    return structural_tag(spec, request) is not None or (
        request.tool_choice == "none" and bool(request.all_tools) and bool(spec.tool_start))
