"""OpenAI reply rendering (deployments.openai.reply): the usage object."""

from __future__ import annotations

from actors.events import Usage
from deployments.openai.reply import usage_body


def test_usage_counts_speculative_drafts_only_when_there_were_some() -> None:
    plain = usage_body(Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4))
    assert plain == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                     "prompt_tokens_details": {"cached_tokens": 4}}
    spec = usage_body(Usage(prompt_tokens=10, completion_tokens=5, accepted_prediction_tokens=3,
                            rejected_prediction_tokens=2))
    assert spec["completion_tokens_details"] == {"accepted_prediction_tokens": 3,
                                                 "rejected_prediction_tokens": 2}
    assert spec["total_tokens"] == 15  # rejected drafts are not output
