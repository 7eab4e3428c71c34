# Two entry points a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo

.PHONY: setup demo test clean

$(BIN)/bagpipe: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/bagpipe

setup: $(BIN)/bagpipe

# Generate a small skewed data set and train DLRM on it with the reference trainer
# and with the lookahead cache, then show that both end with the same parameters.
demo: setup
	$(BIN)/bagpipe synth --profile tiny --samples 60000 --seed 1 --out $(DEMO_DIR)/data --overwrite
	$(BIN)/bagpipe train --data $(DEMO_DIR)/data --model dlrm --steps 400 --batch-size 128 \
		--optimizer adagrad --lr 0.05 --seed 1 --mode full \
		--out $(DEMO_DIR)/full --summary-json $(DEMO_DIR)/full/summary.json

test: setup
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) runs
