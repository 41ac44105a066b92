"""chat: detect a model's chat format, parse its output, stream deltas, constrain decoding."""

from chat.detect import detect_format, format_prefill
from chat.errors import ConstraintError
from chat.message import ChatMsg, Delta, ToolCall, compute_deltas
from chat.parser import parse
from chat.spec import FormatKind, FormatSpec, spec_for_kind
from chat.stream import ChatStream

__all__ = [
    "ChatMsg",
    "ChatStream",
    "ConstraintError",
    "Delta",
    "FormatKind",
    "FormatSpec",
    "ToolCall",
    "compute_deltas",
    "detect_format",
    "format_prefill",
    "parse",
    "spec_for_kind",
]
