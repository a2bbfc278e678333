# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PROTOS := $(wildcard protos/zerobubble/v1/*.proto)

.PHONY: install test lint demo protos clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/pytest

demo: install
	$(VENV)/bin/zerobubble demo

# Regenerate the committed stubs after editing protos/ (tests fail while they are stale).
protos: install
	$(PY) -m grpc_tools.protoc -I protos --python_out=protos --pyi_out=protos --grpc_python_out=protos $(PROTOS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
