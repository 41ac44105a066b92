"""`truncation: "auto"`: a conversation whose prompt would not fit the model's context loses
its oldest items, never the instructions; exactly the requests that "disabled" would refuse
for their length are cut. Whole user turns go first; then, in an agent loop (one user
message and many tool rounds), the oldest whole tool rounds after the last user message.
No tool output ever loses its call."""

from __future__ import annotations

import msgspec

from actors.events import ChatGenerate
from deployments.ingress import Ingress


async def _context(ingress: Ingress, model: str, greq: ChatGenerate) -> int | None:
    length = (await ingress.info(model)).get("context_length")
    if not isinstance(length, int):
        return None
    return min(length, greq.context_limit or length)


def _round_starts(msgs: list[dict], user: int) -> list[int]:
    """The indexes after the user message at `user` where a tool round begins (an assistant
    message with tool calls) and a cut leaves no tool output without its call; the first
    round is left out (a cut there drops nothing of the loop)."""
    called: dict[str, int] = {}  # call id -> the index of the message that makes it
    for at in range(user + 1, len(msgs)):
        for call in msgs[at].get("tool_calls") or []:
            called[call.get("id")] = at
    starts, oldest = [], len(msgs)  # oldest: the earliest call an output from `at` on answers
    for at in range(len(msgs) - 1, user + 1, -1):
        m = msgs[at]
        if m.get("role") == "tool":
            oldest = min(oldest, called.get(m.get("tool_call_id"), oldest))
        if m.get("role") == "assistant" and m.get("tool_calls") and oldest >= at:
            starts.append(at)
    return starts[::-1]


def _cuts(msgs: list[dict], keep: int) -> list[tuple[int, int]]:
    """The cuts `truncation: "auto"` may make, each dropping more than the one before, as
    (user, start): the instructions (the first `keep` messages), the user message at `user`
    and all from `start` on are kept. First each user message after the first, with all that
    follows it; then the last user message with the tool rounds after it, the oldest round
    dropped first (the newest round is never dropped)."""
    users = [i for i in range(keep, len(msgs)) if msgs[i].get("role") == "user"]
    out = [(at, at + 1) for at in users if at > keep]
    if users:
        out += [(users[-1], at) for at in _round_starts(msgs, users[-1])]
    return out


async def fit_context(ingress: Ingress, model: str, greq: ChatGenerate,
                      keep: int) -> ChatGenerate:
    """`greq` with the fewest old conversation items dropped that lets its prompt fit the
    model's context (the worker refuses a prompt of the context's length or more).

    Args:
        ingress: counts the prompt on one of the model's workers (its template and
            tokenizer), one count for a prompt that fits, a binary search over the cuts else.
        keep: the leading messages never dropped (the system message of `instructions`).

    Returns:
        `greq` as it is when it fits (or the model does not state its context); else cut
        before the earliest user message that makes it fit; else (an agent loop) with the
        fewest oldest tool rounds after the last user message dropped that make it fit; when
        none does, the least of these: the instructions, the last user message and its
        newest tool round (the worker then refuses it, naming its length).

    Raises:
        ApiError: the counting worker's refusal or unavailability.
    """
    limit = await _context(ingress, model, greq)
    if limit is None or await ingress.count_tokens(model, greq) < limit:
        return greq
    msgs = greq.messages
    cuts = _cuts(msgs, keep)
    if not cuts:
        return greq

    def cut(at: int) -> ChatGenerate:
        user, start = cuts[at]
        return msgspec.structs.replace(
            greq, messages=msgs[:keep] + msgs[user:user + 1] + msgs[start:])

    lo, hi = 0, len(cuts) - 1  # the first cut that fits (fewer messages, fewer tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if await ingress.count_tokens(model, cut(mid)) < limit:
            hi = mid
        else:
            lo = mid + 1
    return cut(lo)
