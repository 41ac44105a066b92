"""ModelError, ContextLengthError and KVCacheFull: what the model runtime raises."""

from __future__ import annotations


class ModelError(Exception):
    """A model directory that cannot be loaded or rendered: the message names the file,
    key or architecture and what to do."""


class ContextLengthError(ModelError):
    """A sequence would exceed the model's context length."""

    def __init__(self, message: str, *, limit: int, requested: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.requested = requested


class KVCacheFull(ModelError):
    """Every block of the KV cache's budget is held by a running sequence."""
