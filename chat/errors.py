"""ConstraintError: a request's constraint options are invalid (HTTP 400)."""

from __future__ import annotations


class ConstraintError(ValueError):
    """An OpenAI request option that cannot be turned into a constraint.

    Attributes:
        param: the offending parameter, as OpenAI names it (`tool_choice.function.name`).
        message: what is wrong and what to send instead.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
