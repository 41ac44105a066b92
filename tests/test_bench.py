"""The benchmarks run in their quick mode (CI checks they work; figures are in
BENCHMARKS.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.shared import ROOT

QUICK_S = 300  # a bench's quick mode, at most


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
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / script), "--quick"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=QUICK_S)
    except subprocess.TimeoutExpired:
        # Ctrl-C, as a person would: the bench's own cleanup ends the Ray clusters and servers
        # it started (killed at once, they stayed up for the rest of the run)
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"{script} --quick ran past {QUICK_S} s\n{stdout[-4000:]}\n"
                    f"--- stderr ---\n{stderr[-4000:]}")
    # stdout carries the bench's own checks (which one failed); stderr the traceback, if any
    assert proc.returncode == 0, f"{stdout[-4000:]}\n--- stderr ---\n{stderr[-4000:]}"
    assert "ratio" in stdout or "target" in stdout, stdout


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
