"""Where flm-serve keeps what it generates: flm-tiny, compiled CPU kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$FLM_CACHE, else $XDG_CACHE_HOME/flm-serve, else ~/.cache/flm-serve."""
    if os.environ.get("FLM_CACHE"):
        return Path(os.environ["FLM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flm-serve"
