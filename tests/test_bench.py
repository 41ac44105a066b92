"""The benchmarks run in their quick mode (CI checks they work; figures are in
BENCHMARKS.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.shared import ROOT


@pytest.mark.parametrize("script", ["bench_stream.py", "bench_constraint.py", "bench_engine.py",
                                    "bench_xrt.py", "bench_smollm2.py", "bench_load.py",
                                    "bench_peer.py", "bench_kernels.py"])
def test_benchmark_runs_in_quick_mode(script: str) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ratio" in out.stdout or "target" in out.stdout, out.stdout
