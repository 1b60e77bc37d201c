# The two commands of the README: `make demo` and `make test`. Both set everything up.
SHELL := /bin/bash
ENV := source scripts/env.sh &&

.PHONY: setup spark-classes demo test test-quick test-unit test-integration test-e2e test-deployment bench lint docs docs-screenshots services-stop clean

setup:
	@scripts/setup.sh

demo: setup
	@$(ENV) python -m tools.demo

# the archive of Spark's classes the test suite's JVMs map (tools/spark_jvm.py; tests/conftest.py sets
# the JVMs' options), made once per Spark and Java version (~30 s)
spark-classes: setup
	@$(ENV) python -m tools.spark_jvm $${CDC_LOCAL_DIR:-.cdc-local}/spark-classes

# two pytest sessions side by side (scripts/run_tests.py says why and how they are kept apart), then
# the 30 slowest tests, where the suite's time goes (the quick tier's budget per test is in
# tests/conftest.py: one over it is named at the end); CDC_TEST_STREAMS=1: one session
test: spark-classes
	@$(ENV) python scripts/run_tests.py $(PYTEST_ARGS)

# what to run on every change: everything but the slow tests, the deployment and consumer tiers
# (benchmarks are slow too): a few minutes on 2 cores; `make test` runs them all
QUICK := not slow and not deployment and not consumer
test-quick: spark-classes
	@$(ENV) python -m pytest tests -m "$(QUICK)" --durations=30 $(PYTEST_ARGS)

test-unit: spark-classes
	@$(ENV) python -m pytest tests -m unit $(PYTEST_ARGS)

test-integration: spark-classes
	@$(ENV) python -m pytest tests -m integration $(PYTEST_ARGS)

test-e2e: spark-classes
	@$(ENV) python -m pytest tests -m e2e $(PYTEST_ARGS)

test-deployment: spark-classes
	@$(ENV) python -m pytest tests -m deployment $(PYTEST_ARGS)

test-consumer: spark-classes
	@$(ENV) python -m pytest tests -m consumer $(PYTEST_ARGS)

# BENCH names the benchmarks (bench/bench_<name>.py); the default is the end-to-end table and
# the Spark engine's rounds on a standalone cluster, the capture's memory against transaction and value size,
# and 200 changelog rounds back to back (what grows with the pipeline's age)
BENCH ?= e2e merge capture_memory soak
bench: setup
	@$(ENV) python -m bench $(BENCH) $(BENCH_ARGS)

# the documentation site in docs/_build/html (warnings are errors, as in CI)
docs: setup
	@$(ENV) sphinx-build -W -q -b html docs docs/_build/html && echo "docs: docs/_build/html/index.html"

# the front page and one how-to page as headless Chromium renders them (docs/screenshots/)
docs-screenshots: docs
	@for p in index howto; do chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
	  --window-size=1280,1400 --screenshot=docs/screenshots/$$p.png file://$(CURDIR)/docs/_build/html/$$p.html \
	  2>/dev/null; done; ls docs/screenshots

lint: setup
	@$(ENV) ruff check airflow_provider_cdc dags tests bench

services-stop:
	@scripts/services.sh stop

clean: services-stop
	@if [ -L .cdc-local/pg ]; then rm -rf "$$(readlink -f .cdc-local/pg)"; fi
	rm -rf .cdc-local
