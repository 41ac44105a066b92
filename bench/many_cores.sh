#!/usr/bin/env bash
# bench/bench_peer.py at many threads (issue 31: 4, 8 and 16 against llama.cpp) on the device
# tool's machine: 16 cores, no network, a Python 3.12 with numpy, tokenizers, jinja2 and
# threadpoolctl but without msgspec, gguf or llama-cpp-python, and without the default model.
#
# Here, once (fills .device/, which this adds to .git/info/exclude; about 30 MB):
#     bench/many_cores.sh prepare
#   It downloads the wheels the device lacks, writes SmolLM2's tokenizer alone into
#   .device/tokenizer.gguf (the random-weight shapes take it: bench/gguf_shapes.py), and
#   builds llama-cpp-python 0.3.36 for any AVX-512 VNNI CPU (not -march=native: the device's
#   CPU is not this one; AMX off, as GCC 12 needs) unless .device/whl has it (15 minutes on 2
#   cores). PY=3.11 prepares for a Python 3.11 instead (to try `run` here).
#
# There, in one `run` of the device tool (carry [".device"], timeout_s about 580):
#     bench/many_cores.sh run                                # 0.6B Q4_0 and Q4_K_M; 4 8 16
#     THREADS="16" ARGS="--prefill 32 --steps 8 --rounds 1" bench/many_cores.sh run llama-8b-Q4_0
#   Output, also under $OUT: machine.txt (lscpu, compilers) and peer.txt (each count's report).
#   llama-cpp-python built here crashes there at vocabulary load (std::regex) unless the
#   system's libstdc++ is preloaded: `run` does.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.device
PY=${PY:-3.12}

prepare() {
    mkdir -p "$DIR/whl"
    grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
    local tag=${PY/./}
    rm -f "$DIR"/whl/msgspec-*.whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" \
        --implementation cp --abi "cp$tag" --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$DIR/whl" msgspec==0.23.0
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$DIR/whl" \
        gguf==0.19.0 diskcache==5.6.3
    if ! ls "$DIR"/whl/llama_cpp_python-*.whl >/dev/null 2>&1; then
        CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
            .venv/bin/pip wheel -q --no-deps --no-cache-dir -w "$DIR/whl" llama-cpp-python==0.3.36
    fi
    .venv/bin/python bench/gguf_shapes.py --tokenizer-only "$DIR/tokenizer.gguf"
    du -sh "$DIR"
}

run() {
    local out=${OUT:-$DIR/out}
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$DIR"/whl/*.whl
    export PYTHONPATH=/tmp/site FLM_SHAPES_TOKENIZER=$PWD/$DIR/tokenizer.gguf
    export FLM_CACHE=${FLM_CACHE:-/tmp/flm-cache} PYTHONUNBUFFERED=1
    local stdcxx
    stdcxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
    { lscpu; nproc; gcc --version | head -1; python3 --version; echo "LD_PRELOAD=$stdcxx"; } \
        > "$out/machine.txt" 2>&1 || true
    cat "$out/machine.txt"
    local files=("$@")
    [ ${#files[@]} -gt 0 ] || files=(qwen3-0.6b-Q4_0 qwen3-0.6b-Q4_K_M)
    for t in ${THREADS:-4 8 16}; do
        # shellcheck disable=SC2086  # ARGS is words
        LD_PRELOAD=$stdcxx python3 bench/bench_peer.py "${files[@]}" --threads "$t" \
            ${ARGS:---rounds 2 --steps 16 --prefill 512} 2>&1 | tee -a "$out/peer.txt"
    done
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare | run [files...]   (see the top of this file)" >&2; exit 2 ;;
esac
