# Developer tasks; CI runs the README's test command (python -m pytest) via .ci/run.
PYTHON ?= python

.PHONY: test lint check bench

test:
	$(PYTHON) -m pytest

lint:
	$(PYTHON) -m ruff check budget tests benchmarks
	$(PYTHON) -m ruff format --check budget tests benchmarks
	$(PYTHON) -m mypy --strict budget

check:
	budget check plans/*.yaml

bench:
	$(PYTHON) benchmarks/run.py
