"""coalesce: joining a message's events per choice changes nothing a client folds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.events import Deltas, Finished, TokenLogprob, Usage, coalesce
from chat import Delta
from deployments.openai.reply import ChoiceFold, chat_delta

TEXT = st.text(alphabet="ab {}\"", max_size=4)
DELTA = st.one_of(
    st.builds(lambda t: Delta(field="content", text=t), TEXT),
    st.builds(lambda t: Delta(field="reasoning_content", text=t), TEXT),
    st.builds(lambda i, t: Delta(field="tool_call", text=t, index=i), st.integers(0, 1), TEXT),
)
LOGPROB = st.builds(lambda t: TokenLogprob(token=t, logprob=-0.5, bytes=[], top=[]), TEXT)
LOGPROBS = st.none() | st.lists(LOGPROB, min_size=1, max_size=2)
CHAT = st.builds(lambda i, ds, lp: Deltas(index=i, deltas=ds, logprobs=lp),
                 st.integers(0, 1), st.lists(DELTA, max_size=3), LOGPROBS)
COMPLETION = st.builds(lambda i, t, lp: Deltas(index=i, text=t, logprobs=lp),
                       st.integers(0, 1), TEXT, LOGPROBS)


def _with_call_starts(events: list) -> list:
    """Give each tool call its first delta (id and name), as ChatStream does."""
    started: set[tuple[int, int]] = set()
    out = []
    for ev in events:
        ds = []
        for d in ev.deltas:
            key = (ev.index, d.index)
            if d.field == "tool_call" and key not in started:
                started.add(key)
                d = Delta(field="tool_call", text=d.text, index=d.index, id=f"call_{d.index}",
                          name="f")
            ds.append(d)
        out.append(Deltas(index=ev.index, deltas=ds, text=ev.text, logprobs=ev.logprobs))
    return out


def _fold(events: list) -> dict:
    folds: dict[int, ChoiceFold] = {}
    for ev in events:
        if isinstance(ev, Deltas):
            folds.setdefault(ev.index, ChoiceFold()).add(ev)
    return {i: (f.chat_message(), f.logprobs) for i, f in folds.items()}


@settings(max_examples=300, deadline=None)
@given(st.lists(CHAT, max_size=8) | st.lists(COMPLETION, max_size=8))
def test_coalesced_events_fold_to_the_same_reply(events: list) -> None:
    events = _with_call_starts(events)
    joined = coalesce(events)
    assert _fold(joined) == _fold(events)
    assert len([e for e in joined if isinstance(e, Deltas)]) <= 2  # one per choice


def test_a_choice_finished_is_not_joined_past_its_end() -> None:
    a = Deltas(index=0, text="x")
    events = [a, Finished(index=0, finish_reason="stop", completion_tokens=1),
              Deltas(index=1, text="y"), Deltas(index=1, text="z"), Usage(prompt_tokens=1,
                                                                          completion_tokens=2)]
    out = coalesce(events)
    assert [type(e).__name__ for e in out] == ["Deltas", "Finished", "Deltas", "Usage"]
    assert out[2].text == "yz"


def test_joined_pieces_carry_the_tokens_written_by_the_last() -> None:
    (joined,) = coalesce([Deltas(index=0, text="a", tokens=3), Deltas(index=0, text="b",
                                                                      tokens=5)])
    assert (joined.text, joined.tokens) == ("ab", 5)


def test_joined_tool_call_pieces_make_one_chunk_entry() -> None:
    events = [Deltas(index=0, deltas=[Delta(field="tool_call", text='{"a"', id="call_1",
                                            name="f")]),
              Deltas(index=0, deltas=[Delta(field="tool_call", text=": 1}")])]
    (joined,) = coalesce(events)
    assert chat_delta(joined, first=False) == {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": '{"a": 1}'}}]}
