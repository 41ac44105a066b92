"""The README's examples, run as written against the test server: each code block after a
`<!-- example -->` line, in the README's order (its Python blocks share one namespace, as
one reader's session would), with only the address changed to the test server's.

The claims are the README's comments: after a `print(...)`, the comment is what it prints
(`...` stands for any text; a comment in parentheses, and what follows `: ` or two spaces
and a parenthesis, only explain); after a curl command, a comment that reads as JSON members
(`"key": value, ...`) names members some object of the answer has.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import tokenize
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
MARK = "<!-- example -->"
ADDRESSES = ("http://127.0.0.1:8000", "localhost:8000")
pytestmark = pytest.mark.timeout(600)  # the session fixture's start counts when it runs first


class Block:
    def __init__(self, lang: str, line: int, text: str) -> None:
        self.lang, self.line, self.text = lang, line, text  # line: the first code line's


def blocks(text: str) -> list[tuple[bool, Block]]:
    """Every fenced block of `text`, and whether a MARK line comes right before it."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"```(\w*)$", lines[i])
        if m:
            end = lines.index("```", i + 1)
            marked = i > 0 and lines[i - 1].strip() == MARK
            out.append((marked, Block(m.group(1), i + 2, "\n".join(lines[i + 1:end]))))
            i = end
        i += 1
    return out


def claim_pattern(comment: str) -> re.Pattern | None:
    """A print's comment as a pattern of its output (None: the comment only explains)."""
    text = comment.lstrip("#").strip()
    if not text or text.startswith("("):
        return None
    text = re.split(r"  \(|: ", text)[0]
    return re.compile(".*".join(re.escape(p) for p in text.split("...")), re.S)


def json_claims(comment: str) -> dict[str, Any] | None:
    try:
        members = json.loads("{" + comment.lstrip("#").strip() + "}")
    except json.JSONDecodeError:
        return None
    return members if isinstance(members, dict) and members else None


def holds(answer: Any, key: str, value: Any) -> bool:
    if isinstance(answer, dict):
        if answer.get(key, object()) == value:
            return True
        return any(holds(v, key, value) for v in answer.values())
    if isinstance(answer, list):
        return any(holds(v, key, value) for v in answer)
    return False


def here(text: str, url: str) -> str:
    for address in ADDRESSES:
        text = text.replace(address, url)
    return text


def run_shell(block: Block, url: str) -> int:
    """Each curl command of the block, its answer checked against the comments after it."""
    checked, command, claims = 0, [], []

    def flush() -> None:
        nonlocal checked
        if not command:
            return
        done = subprocess.run(["bash", "-c", here("\n".join(command), url)],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        for members in claims:
            for key, value in members.items():
                assert holds(answer, key, value), (
                    f"README line {block.line}: no {key!r}: {value!r} in {done.stdout[:2000]}")
                checked += 1
        command.clear()
        claims.clear()

    for line in block.text.split("\n"):
        if line.startswith("#"):
            members = json_claims(line)
            if members:
                claims.append(members)
        elif line.strip():
            if claims:
                flush()
            command.append(line)
        else:
            flush()
    flush()
    return checked


def run_python(block: Block, url: str, namespace: dict) -> int:
    """The block in `namespace`, each claimed print's output checked."""
    source = here(block.text, url)
    tree = ast.parse(source)
    ast.increment_lineno(tree, block.line - 1)
    comments = {tok.start[0] + block.line - 1: tok.string
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    printed: dict[int, list[str]] = {}

    def record(*args: Any, sep: str = " ", end: str = "\n", **_: Any) -> None:
        import sys

        frame = sys._getframe(1)
        while frame.f_code.co_filename != str(README):
            frame = frame.f_back
        printed.setdefault(frame.f_lineno, []).append(sep.join(map(str, args)) + end)

    namespace["print"] = record
    exec(compile(tree, str(README), "exec"), namespace)
    checked = 0
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") == "print"):
            continue
        comment = comments.get(node.end_lineno) or comments.get(node.lineno)
        pattern = claim_pattern(comment) if comment else None
        if pattern is None:
            continue
        out = "".join(printed.get(node.lineno, [])).rstrip("\n")
        assert pattern.fullmatch(out), (
            f"README line {node.lineno}: printed {out!r}, the README says {comment!r}")
        checked += 1
    return checked


def test_every_python_and_curl_block_is_a_checked_example() -> None:
    found = blocks(README.read_text())
    runnable = [b for _, b in found if b.lang == "python" or (b.lang == "sh" and "curl " in b.text)]
    unmarked = [b.line for marked, b in found if not marked and b in runnable]
    assert runnable and not unmarked, f"README blocks without {MARK}: lines {unmarked}"


def test_claims_read_as_the_readme_means_them() -> None:
    assert claim_pattern("# True").fullmatch("True")
    assert claim_pattern("# name='...' country='...'").fullmatch("name='Paris' country='FR'")
    assert not claim_pattern("# True: the first turn is in the prompt").fullmatch("False")
    assert claim_pattern("# (the reply)") is None
    assert json_claims('# "done": true, "done_reason": "stop"') == {"done": True,
                                                                  "done_reason": "stop"}
    assert json_claims("# (the sentence is the model's)") is None
    assert holds({"choices": [{"finish_reason": "stop"}]}, "finish_reason", "stop")


@pytest.mark.integration
def test_the_readme_examples_hold_against_the_server(serve_url) -> None:
    namespace: dict = {"__name__": "readme"}
    checked = 0
    for marked, block in blocks(README.read_text()):
        if not marked:
            continue
        if block.lang == "python":
            checked += run_python(block, serve_url, namespace)
        else:
            checked += run_shell(block, serve_url)
    assert checked >= 20, f"only {checked} claims checked"
