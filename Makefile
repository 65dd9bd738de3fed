# The README's two commands are `make demo` and `make test`; both set up what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Quix Streams pins an older confluent-kafka than epochline's, so the bench runs it from a venv of its own.
QUIX_VENV := .venv-quix

.PHONY: setup kafka demo lint test bench clean

$(BIN)/epochline: pyproject.toml connectors/_native_io.c schemas/_native_json.c schemas/_native_avro.c schemas/_native_arrow.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/epochline

kafka: setup  ## fetch the Kafka jars from Maven Central (cached)
	$(BIN)/python -c "from engine.testing.local_broker import fetch_kafka_jars; print(fetch_kafka_jars())"

demo: setup  ## start the local broker and run the exactly-once example pipeline on it
	bash examples/quickstart.sh

lint: setup  ## ruff (lint + import order) over the tree, mypy --strict over the library packages
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup  ## the whole default suite against a real local broker
	$(BIN)/pytest

$(QUIX_VENV)/bin/python:
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/pip install -q "quixstreams>=3.0"

bench: setup $(QUIX_VENV)/bin/python  ## epochline vs Quix Streams, Kafka Streams and the raw client (1M records, 3 runs each)
	$(BIN)/pip install -q -e ".[dev,bench]"
	$(BIN)/python bench/run.py --repeat 3 $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(QUIX_VENV) .epochline
