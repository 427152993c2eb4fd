# chaoskit — every target sets itself up first (see scripts/setup.sh).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-unit demo lint bench clean

setup:
	@./scripts/setup.sh

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

demo: setup
	@./scripts/demo.sh

lint: setup
	$(PY) -m ruff check chaoskit tests bench

bench: setup
	$(PY) bench/rollback_bench.py
	$(PY) bench/proxy_bench.py
	$(PY) bench/reference_bench.py
	$(PY) bench/load_bench.py
	$(PY) bench/ebpf_overhead.py

clean:
	rm -rf .venv build *.egg-info chaoskit-runs .pytest_cache
