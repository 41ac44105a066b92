"""The benchmarks run in their quick mode (CI checks they work; figures are in
BENCHMARKS.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.shared import ROOT


@pytest.mark.parametrize("script", ["bench_stream.py", "bench_constraint.py", "bench_engine.py",
                                    "bench_xrt.py", "bench_smollm2.py", "bench_load.py",
                                    "bench_peer.py", "bench_kernels.py", "bench_soak.py",
                                    "bench_prefix.py", "bench_embed.py",
                                    "bench_library.py", "bench_spec.py", "bench_tokenizer.py",
                                    "bench_kv.py", "bench_threads.py", "bench_scoring.py"])
def test_benchmark_runs_in_quick_mode(script: str) -> None:
    # a bench that starts Ray gets none of the settings the test session's own Serve
    # instance put in os.environ (its HAProxy's ports among them)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick"],
                         capture_output=True, text=True, timeout=300, env=env)
    # stdout carries the bench's own checks (which one failed); stderr the traceback, if any
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n--- stderr ---\n{out.stderr[-4000:]}"
    assert "ratio" in out.stdout or "target" in out.stdout, out.stdout


def test_the_peer_is_built_without_its_amx_kernels_on_a_cpu_with_amx() -> None:
    """llama.cpp's native build compiles its AMX kernels where the CPU lists AMX, and they
    crashed its first product on an AMX Xeon (session 34): there the build names the CPU's
    instruction sets instead; elsewhere it stays native."""
    sys.path.insert(0, str(ROOT / "bench"))
    from llama_cmake import cmake_args

    amx = "flags\t\t: fpu avx avx2 fma f16c avx512f avx512_vnni amx_tile amx_int8\n"
    args = cmake_args(amx)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX512_VNNI=ON" in args
    assert "-DGGML_AVX512_BF16=OFF" in args and not any("AMX" in a and "ON" in a for a in args)
    assert "-DGGML_NATIVE=OFF" not in cmake_args("flags\t\t: fpu avx avx2 fma\n")
