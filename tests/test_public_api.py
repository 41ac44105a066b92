"""The public names of each package (ARCHITECTURE.md): tools outside the package use them."""

from __future__ import annotations

import chat


def test_chat_exports() -> None:
    assert sorted(chat.__all__) == sorted([
        "ChatMsg", "ChatStream", "ConstraintError", "ConstraintRequest", "DecodeConstraint",
        "Delta", "FormatKind", "FormatSpec", "GrammarEngine", "ToolCall", "ToolSpec",
        "compute_deltas", "constraint_request_from_openai", "detect_format", "format_prefill",
        "make_constraint", "parse", "spec_for_kind", "structural_tag",
    ])
    for name in chat.__all__:
        assert getattr(chat, name) is not None


def test_importing_chat_loads_neither_ray_nor_xgrammar() -> None:
    import subprocess
    import sys

    code = ("import sys, chat; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'ray', 'xgrammar', 'torch', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_npu_exports() -> None:
    import npu

    assert {"load_model", "Model", "NumpyEngine", "Sampler", "SamplingParams", "Tokenizer",
            "ChatTemplate", "ModelError", "ContextLengthError"} <= set(npu.__all__)


def test_importing_npu_loads_neither_pyxrt_nor_ray() -> None:
    import subprocess
    import sys

    code = ("import sys, npu; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'ray', 'pyxrt', 'xgrammar', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
