"""Speculative decoding from the prompt (prompt lookup, n-gram drafting): the per-model
option, `Speculation`, and the drafter, `NgramDrafter`.

A choice's next tokens are drafted by finding the last few tokens of its prompt and output
so far earlier in them (the most recent match of the longest n-gram tried) and copying what
followed; the scheduler verifies the draft in one forward with the choice's next token and
keeps, by the standard acceptance rule (npu.Sampler.verify), the drafted tokens the model
would have produced, so output is the same as without it (greedy, and seeded sampling: token
for token; sampling: in distribution). Agents and code assistants repeat their input (a file rewritten with one
line changed, JSON echoed back), where several tokens a step are kept.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# the kernels multiply up to 8 rows straight from the weights' blocks (npu.engine.linear's
# KERNEL_ROWS) at about 1.3x the cost of one: the next token and 7 drafted ones
DEFAULT_TOKENS = 7


class Speculation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Speculative decoding for one model (vLLM's `speculative_config` for "ngram").

    Attributes:
        method: "ngram" (draft from the prompt and the output so far) or "off".
            default: "ngram".
        tokens: the most tokens drafted a step (vLLM's num_speculative_tokens, llama.cpp's
            --draft-max). default: 7 (with the next token, the 8 rows the kernels multiply
            for little more than one).
        lookup_max: the longest n-gram matched (vLLM's prompt_lookup_max). default: 4.
        lookup_min: the shortest n-gram matched (vLLM's prompt_lookup_min); shorter matches
            draft more often and are wrong more often. default: 2.
        row_cost: what one more row adds to a forward, as a share of a one-row forward,
            when deciding how many drafted tokens to verify; None: measured as the worker
            runs (`StepCost`). default: None.
    """

    method: Literal["ngram", "off"] = "ngram"
    tokens: int = msgspec.field(default=DEFAULT_TOKENS)
    lookup_max: int = 4
    lookup_min: int = 2
    row_cost: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.tokens <= 64:
            raise ValueError(f"speculative.tokens must be 1..64, not {self.tokens}")
        if self.row_cost is not None and not 0.0 <= self.row_cost <= 10.0:
            raise ValueError(f"speculative.row_cost must be 0..10, not {self.row_cost}")
        if not 1 <= self.lookup_min <= self.lookup_max <= 16:
            raise ValueError("speculative needs 1 <= lookup_min <= lookup_max <= 16, not "
                             f"{self.lookup_min} and {self.lookup_max}")

    @property
    def on(self) -> bool:
        return self.method != "off"


class NgramDrafter:
    """Drafts one choice's next tokens from its prompt and its output so far.

    Args:
        prompt: the prompt's tokens.
        lookup_max, lookup_min: the n-gram lengths tried, longest first.
    """

    def __init__(self, prompt: list[int], *, lookup_max: int = 4, lookup_min: int = 2) -> None:
        self.sizes = range(lookup_max, lookup_min - 1, -1)
        self.history = list(prompt)
        self.fed = 0  # the output's tokens taken into `history`
        # n -> n-gram -> where the tokens after its latest occurrence start; n-grams that
        # end before the history's last token only (the last one is the query)
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._indexed = 0  # n-grams ending before this position are indexed
        self.matched = 0  # the length of the n-gram the last draft came from

    def propose(self, output: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens to follow `output` (the choice's tokens so far, of which
        the drafter has seen an earlier prefix): what followed the latest earlier
        occurrence of the longest of its last n-grams found; [] when none is found."""
        if len(output) > self.fed:
            self.history.extend(output[self.fed :])
            self.fed = len(output)
        h = self.history
        end = len(h) - 1
        for stop in range(self._indexed, end):  # n-grams ending at stop - 1 .. end - 1
            for n, index in self._index.items():
                if stop + 1 >= n:
                    index[tuple(h[stop + 1 - n : stop + 1])] = stop + 1
        self._indexed = max(self._indexed, end)
        if limit <= 0:
            return []
        for n in self.sizes:
            if len(h) < n:
                continue
            at = self._index[n].get(tuple(h[len(h) - n :]))
            if at is not None:
                self.matched = n
                return h[at : at + limit]
        self.matched = 0
        return []


# a row more in a step's forward, as a share of the step, before it is measured: low, so
# drafts are tried (and their cost measured) from the start
ASSUMED_ROW_COST = 0.05


class StepCost:
    """What a forward costs by the rows it computes (seconds, a moving average of those
    measured): how much drafts add to a step on this machine, with these kernels."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def record(self, rows: int, seconds: float) -> None:
        prev = self.seconds.get(rows)
        self.seconds[rows] = seconds if prev is None else 0.8 * prev + 0.2 * seconds

    def ratio(self, rows: int, more: int) -> float:
        """A forward of rows + more rows over one of `rows` rows. A forward costs no more
        than one of more rows: the least measured for rows + more or more rows counts (the
        kernels work in tiles of rows, and a busy host makes some measures high)."""
        base = self.seconds.get(rows)
        bigger = [t for r, t in self.seconds.items() if r >= rows + more]
        if base and bigger:
            return max(1.0, min(bigger) / base)
        return 1.0 + ASSUMED_ROW_COST * more


def draft_length(accept: float, limit: int, cost) -> int:
    """How many drafted tokens to verify: the m <= limit that maximizes the tokens a step is
    expected to give (1 + accept + accept^2 + ... + accept^m: each drafted token kept with
    probability `accept` once the ones before it were) per its cost, cost(m) (1 for a plain
    step); 0 when no draft pays for itself."""
    best, best_m, gain, p = 1.0, 0, 1.0, 1.0
    for m in range(1, limit + 1):
        p *= accept
        gain += p
        value = gain / cost(m)
        if value > best:
            best, best_m = value, m
    return best_m
