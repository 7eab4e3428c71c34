# Two entry points a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo
DEMO_TRAIN = $(BIN)/bagpipe train --data $(DEMO_DIR)/data --model dlrm --steps 400 --batch-size 128 \
	--optimizer adagrad --lr 0.05 --seed 1 --eval-every 100
DEMO_DIST = $(BIN)/bagpipe train --data $(DEMO_DIR)/data --model dlrm --steps 400 --batch-size 128 \
	--optimizer sgd --lr 0.05 --seed 1 --no-progress

.PHONY: setup demo test test-slow lint bench bench-quick clean gpu-check

$(BIN)/bagpipe: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/bagpipe

setup: $(BIN)/bagpipe

# Generate a small skewed data set, train DLRM with every table in memory (the
# reference), then again with the lookahead cache holding 5% of the rows, and show
# that both runs end with the same parameters, bit for bit; then with 2 data-parallel
# trainers and 2 embedding-server processes, which ends within float tolerance of
# the one-process reference (SGD here: Adagrad's g / (sqrt(G) + eps) amplifies the
# last-bit differences of averaged near-zero gradients over hundreds of steps, see
# docs/distributed.md).
demo: setup
	rm -rf $(DEMO_DIR)
	$(BIN)/bagpipe synth --profile tiny --samples 60000 --seed 1 --out $(DEMO_DIR)/data
	$(DEMO_TRAIN) --mode full --out $(DEMO_DIR)/full
	$(DEMO_TRAIN) --mode lookahead --cache-rows 1400 --lookahead 8 --out $(DEMO_DIR)/lookahead
	$(BIN)/bagpipe eval --run $(DEMO_DIR)/lookahead --data $(DEMO_DIR)/data
	@$(BIN)/python -c "import json,sys; a=json.load(open('$(DEMO_DIR)/full/summary.json')); b=json.load(open('$(DEMO_DIR)/lookahead/summary.json')); same=a['params_sha256']==b['params_sha256']; print('full and lookahead parameters identical:', same); sys.exit(0 if same else 1)"
	$(DEMO_DIST) --mode full --threads 1 --out $(DEMO_DIR)/full-sgd
	$(DEMO_DIST) --mode lookahead --cache-rows 1400 --lookahead 8 --trainers 2 --servers 2 --out $(DEMO_DIR)/distributed
	$(BIN)/python tools/compare_runs.py $(DEMO_DIR)/distributed $(DEMO_DIR)/full-sgd --tolerance 1e-5

# Everything that runs on a CPU machine, in under 10 minutes on 2 cores (tests/README.md); the 15
# slowest tests are listed at the end, to keep it so.
test: setup
	$(BIN)/python -m pytest -q -m "not slow" --durations=15 tests

# The checks the test suite also runs (tests/unit/test_codebase.py): ruff's lint and format and
# mypy (check_untyped_defs; its files in pyproject.toml), all on the package, the tests, the
# benchmarks and the tools.
lint: setup
	$(BIN)/ruff check bagpipe tests benchmarks tools
	$(BIN)/ruff format --check bagpipe tests benchmarks tools
	$(BIN)/mypy

# The long variants (fault injection at many moments, bigger runs); not part of CI.
test-slow: setup
	$(BIN)/python -m pytest -q -m slow tests

# Every scenario at its default size (about 35 minutes on 2 cores), then docs/benchmarks.md.
bench: peers
	$(BIN)/python benchmarks/make_docs.py --scenarios modes,oracle,sweep,convergence,distributed,peers --out bench-out

# Every scenario at --quick size, into bench-out/quick (docs untouched).
bench-quick: setup
	for s in modes oracle sweep convergence distributed; do $(BIN)/bagpipe bench $$s --quick --out bench-out/quick/$$s || exit 1; done

clean:
	rm -rf $(VENV) runs bench-out

# The GPU path proven in one command (docs/gpu.md#the-gpu-check), for a bare GPU machine
# whose Python already has a CUDA build of torch: installs nothing and needs no .venv
# (the package runs from this tree by path); at most 8 minutes on one H100, each step
# stopped at its own limit; writes OUT/results.json, results.md, gpu-check.log. Without
# a GPU it prints one line and exits 0 (CI runs that path).
GPU_PY ?= $(PY)
OUT ?= gpu-check-out
gpu-check:
	@PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m bagpipe.gpucheck --out "$(OUT)"

# TorchRec + FBGEMM (CPU build) for `bagpipe bench peers`, into the same .venv. With
# torch 2.13.0 only fbgemm-gpu-cpu 1.8.0 + torchrec 1.8.0 load (1.7.0 and 1.9.0 fail
# with undefined symbols). torchrec goes in with --no-deps: its plain dependency
# fbgemm-gpu is a ~500 MB CUDA wheel for another torch that would replace the CPU
# fbgemm_gpu module. The constraint keeps every step from touching torch; the other
# versions are the ones verified to work. Not a pyproject extra, since an extra
# cannot say --no-deps. See docs/peers.md.
PEERS_CONSTRAINTS := $(VENV)/peers-constraints.txt
.PHONY: peers
peers: setup
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(PEERS_CONSTRAINTS)
	$(BIN)/pip install -q -c $(PEERS_CONSTRAINTS) fbgemm-gpu-cpu==1.8.0
	$(BIN)/pip install -q --no-deps torchrec==1.8.0
	$(BIN)/pip install -q -c $(PEERS_CONSTRAINTS) tensordict==0.15.3 torchmetrics==1.0.3 tqdm pyre-extensions==0.0.32
	$(BIN)/python -c "import torch, fbgemm_gpu, torchrec; from torchrec.models.dlrm import DLRM; import importlib.metadata as m; print('torch', torch.__version__, '| torchrec', m.version('torchrec'), '| fbgemm-gpu-cpu', m.version('fbgemm-gpu-cpu'))"
