"""An 8B-shaped Q4_0 GGUF (Llama-3.1-8B's shapes, random weights, 4.2 GB: the size of the
files people run) loads on this 24 GB host within the memory bounds of issue 13 and decodes.

The file is written by bench/gguf_shapes.py into a temporary cache and loaded in a fresh
process by bench/bench_load.py (its peak and after-load RSS are that process's own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu.engine.cpu_kernels import seed_cache
from tests.shared import ROOT

FILE_BYTES = 4.2e9


def test_8b_shaped_q4_0_loads_within_its_memory_bounds_and_decodes(tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < 2 * FILE_BYTES:
        pytest.skip("needs 8.4 GB of free disk for the 4.2 GB file")
    seed_cache(tmp_path)  # the children load this process's kernel build
    env = {**os.environ, "FLM_CACHE": str(tmp_path)}
    try:
        subprocess.run([sys.executable, str(ROOT / "bench" / "gguf_shapes.py"), "llama-8b",
                        "Q4_0"], env=env, cwd=ROOT, check=True, capture_output=True,
                       timeout=900)
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_load.py"), "--child",
                               "llama-8b:Q4_0", "2"], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp_path / "bench-gguf", ignore_errors=True)
    assert got["held_mb"] > 4000  # the blocks as they are, not a float copy
    assert got["peak_mb"] <= got["peak_bound_mb"], got
    assert got["after_mb"] <= got["after_bound_mb"], got
    assert got["tok_s"] > 0
