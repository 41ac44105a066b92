"""chat: detect a model's chat format, parse its output, stream deltas, constrain decoding."""

from chat.decode import DecodeConstraint, make_constraint
from chat.detect import detect_format, format_prefill
from chat.engine import GrammarEngine
from chat.errors import ConstraintError
from chat.grammar import structural_tag
from chat.message import ChatMsg, Delta, ToolCall, compute_deltas
from chat.parser import parse
from chat.request import ConstraintRequest, ToolSpec, constraint_request_from_openai
from chat.spec import FormatKind, FormatSpec, spec_for_kind
from chat.stream import ChatStream

__all__ = [
    "ChatMsg",
    "ChatStream",
    "ConstraintError",
    "ConstraintRequest",
    "DecodeConstraint",
    "GrammarEngine",
    "Delta",
    "FormatKind",
    "FormatSpec",
    "ToolCall",
    "ToolSpec",
    "compute_deltas",
    "constraint_request_from_openai",
    "detect_format",
    "format_prefill",
    "make_constraint",
    "parse",
    "spec_for_kind",
    "structural_tag",
]
