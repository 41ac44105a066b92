"""The public names of each package (ARCHITECTURE.md): tools outside the package use them."""

from __future__ import annotations

import chat


def test_chat_exports() -> None:
    assert sorted(chat.__all__) == sorted([
        "ChatMsg", "ChatStream", "ConstraintError", "Delta", "FormatKind", "FormatSpec",
        "ToolCall", "compute_deltas", "detect_format", "format_prefill", "parse",
        "spec_for_kind",
    ])
    for name in chat.__all__:
        assert getattr(chat, name) is not None


def test_chat_imports_no_ray() -> None:
    import subprocess
    import sys

    code = "import sys, chat; print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
