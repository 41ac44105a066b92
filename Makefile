PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
XGRAMMAR := xgrammar==0.2.9

.PHONY: setup test test-unit serve bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU torch first (a plain `torch` pulls a multi-GB CUDA build)
	$(BIN)/pip install --quiet $(TORCH)
	# xgrammar without triton; its other dependencies are in requirements.txt
	$(BIN)/pip install --quiet --no-deps $(XGRAMMAR)
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	@du -sh $(VENV) | sed 's/^/venv size: /'
	touch $@

test: setup
	$(BIN)/python -m pytest -q

test-unit: setup
	$(BIN)/python -m pytest -q --ignore=tests/integration

# configs/serve.env: the Ray settings serving runs with (HAProxy ingress), read when Ray
# starts; `make serve CONFIG=configs/model_dir.yaml` serves another config
CONFIG ?= configs/flm.yaml
serve: setup
	env $$(grep -v '^#' configs/serve.env | xargs) $(BIN)/serve run $(CONFIG)

bench: setup
	$(BIN)/python bench/bench_stream.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
