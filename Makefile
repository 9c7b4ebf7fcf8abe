# Two front doors: `make lab` and `make test`. Both set up .venv once.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     ?= $(sort $(wildcard notebooks/[0-9]*.ipynb))
PYTEST_NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=1800 --ignore=notebooks/exercises

.PHONY: setup lab test test-browser notebooks exercises bench lint clean models ddp-demo

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

lab: setup
	$(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup
	$(BIN)/python -m pytest $(PYTEST_NBVAL) tests notebooks

# Every solved notebook run in JupyterLab in headless Chromium (Debian's chromium).
test-browser: setup
	$(BIN)/python -m pytest -p no:nbval tests_browser -v --durations=0

# Student copies of the notebooks, generated from the solution regions.
exercises: setup
	$(BIN)/python tools/make_exercises.py

# Re-execute notebooks in place (all of them, or NB=notebooks/03_x.ipynb), then merge each
# cell's stream outputs so a saved progress bar keeps only its last state, and regenerate
# the exercises.
notebooks: setup
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False $(NB)
	$(BIN)/jupyter nbconvert --coalesce-streams --inplace --log-level=WARN $(NB)  # a progress bar's last state only
	$(BIN)/python tools/make_exercises.py  # the student copies follow their solved notebooks

# The trained models that ship in tx_helpers/models/ (recipes in tx_helpers/pretrained.py):
# retrains every one (about 1.5 min on 2 cores) and rewrites MANIFEST.json with their checksums.
models: setup
	$(BIN)/python tools/make_models.py

# Benchmarks: prints a table, writes benchmarks/latest.md and latest.json (< 10 min on 2 cores).
bench: setup
	$(BIN)/python tools/bench.py $(BENCH_ARGS)

# The training loop on 2 CPU processes with DistributedDataParallel (gloo), dates recipe:
# per-rank throughput, exact match, all-reduce vs compute (about 2.5 min on 2 cores).
ddp-demo: setup
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=2 tools/train_ddp.py $(DDP_ARGS)

lint: setup
	$(BIN)/ruff check tx_helpers tests tests_browser tools

clean:
	rm -rf $(VENV) .cache
