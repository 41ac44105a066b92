"""Where the shared test data lives (`../shared` beside the repository, or $FLM_SHARED),
and loaders for it. Tests that need it skip with a clear reason when it is absent."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FLM_SHARED", ROOT.parent / "shared"))
FORMATS = SHARED / "formats"
MISSING = f"shared test data not found at {SHARED} (set FLM_SHARED to its folder)"

needs_shared = pytest.mark.skipif(not (FORMATS / "outputs.jsonl").exists(), reason=MISSING)


@cache
def outputs() -> list[dict]:
    if not (FORMATS / "outputs.jsonl").exists():
        return []
    with open(FORMATS / "outputs.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@cache
def special_tokens() -> dict:
    path = FORMATS / "special_tokens.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def template_names() -> list[str]:
    folder = FORMATS / "templates"
    return sorted(p.stem for p in folder.glob("*.jinja")) if folder.exists() else []


def template(name: str) -> str:
    return (FORMATS / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def is_token_for(name: str):
    ids = special_tokens().get(name, {}).get("special", {})
    return lambda s: ids.get(s) is not None
