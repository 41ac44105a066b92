"""`truncation: "auto"`: a conversation whose prompt would not fit the model's context loses
its oldest items, never the instructions; exactly the requests that "disabled" would refuse
for their length are cut, and each cut starts a user turn (no tool output loses its call)."""

from __future__ import annotations

import msgspec

from actors.events import ChatGenerate
from deployments.ingress import Ingress


async def _context(ingress: Ingress, model: str, greq: ChatGenerate) -> int | None:
    length = (await ingress.info(model)).get("context_length")
    if not isinstance(length, int):
        return None
    return min(length, greq.context_limit or length)


async def fit_context(ingress: Ingress, model: str, greq: ChatGenerate,
                      keep: int) -> ChatGenerate:
    """`greq` with the fewest leading conversation messages dropped that lets its prompt fit
    the model's context (the worker refuses a prompt of the context's length or more).

    Args:
        ingress: counts the prompt on one of the model's workers (its template and
            tokenizer), one count for a prompt that fits, a binary search over the cuts else.
        keep: the leading messages never dropped (the system message of `instructions`).

    Returns:
        `greq` as it is when it fits (or the model does not state its context); else cut
        before the earliest user message that makes it fit, or before the last user message
        when none does (the worker then refuses it, naming its length).

    Raises:
        ApiError: the counting worker's refusal or unavailability.
    """
    limit = await _context(ingress, model, greq)
    if limit is None or await ingress.count_tokens(model, greq) < limit:
        return greq
    msgs = greq.messages
    cuts = [i for i in range(keep + 1, len(msgs)) if msgs[i].get("role") == "user"]
    if not cuts:
        return greq

    def cut(at: int) -> ChatGenerate:
        return msgspec.structs.replace(greq, messages=msgs[:keep] + msgs[at:])

    lo, hi = 0, len(cuts) - 1  # the first cut that fits (fewer messages, fewer tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if await ingress.count_tokens(model, cut(cuts[mid])) < limit:
            hi = mid
        else:
            lo = mid + 1
    return cut(cuts[lo])
