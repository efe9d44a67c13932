# The README's two commands: `sudo make run` and `sudo make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run demo test lint bench clean
setup:
	IBEMU_VENV=$(VENV) scripts/setup.sh

run: setup
	$(VENV)/bin/ibemu run

demo: setup
	$(VENV)/bin/ibemu demo

test: setup
	$(PY) -m pytest -q

lint: setup
	$(PY) -m pip install -q -e '.[lint]' 2>/dev/null
	$(PY) -m ruff check ibemu tests benchmarks
	$(PY) -m mypy ibemu
	$(VENV)/bin/lint-imports

bench: setup
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	-$(VENV)/bin/ibemu clean
