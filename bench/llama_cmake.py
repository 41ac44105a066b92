"""The CMake options to build llama-cpp-python with on this CPU (`make bench-peer`).

llama.cpp's default native build compiles its AMX kernels wherever the CPU lists AMX, and
on an Intel Xeon with AMX here (session 34) its first product crashed in
`ggml_backend_amx_mul_mat` (SIGSEGV), whatever the GGML_AMX_* options say (they only
matter without a native build). On such a CPU the build is not native: each instruction
set the CPU lists is named instead, AMX left out, so the peer runs the AVX-512 / VNNI
kernels our own kernels are measured against. Elsewhere the build stays native.
"""

from __future__ import annotations

from pathlib import Path

# /proc/cpuinfo flag -> llama.cpp's CMake option
FLAGS = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
         "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512",
         "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16",
         "avx512vbmi": "GGML_AVX512_VBMI"}
NO_AMX = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def cmake_args(cpuinfo: str) -> list[str]:
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if "amx_tile" not in flags:
        return NO_AMX
    return ["-DGGML_NATIVE=OFF", *(f"-D{opt}={'ON' if flag in flags else 'OFF'}"
                                   for flag, opt in FLAGS.items()), *NO_AMX]


if __name__ == "__main__":
    info = Path("/proc/cpuinfo")
    print(" ".join(cmake_args(info.read_text() if info.exists() else "")))
