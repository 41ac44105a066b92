"""Argument dialects: incremental readers that turn model-written values into value events."""

from chat.dialects.reader import Dialect, Status, ValueReader

__all__ = ["Dialect", "Status", "ValueReader"]
