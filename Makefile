# Two front doors: `make lab` and `make test`. Both set up .venv once.
# Python 3.11 is required (the pins, and the CPU build of torch, are for 3.11).
PYTHON ?= $(shell command -v python3.11 || command -v python3 || echo python3.11)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.installed-browser
# pip installs without compiling, and each module is compiled the first time it is imported: that
# is Python's default, so make unexports PYTHONDONTWRITEBYTECODE (where it is set, every process
# would recompile torch: importing torch._dynamo took 40 s without .pyc, 16 s with, under load).
# Compiling only what is imported (7 s for torch, labkit, matplotlib, nbval, the kernel) beats
# compiling the whole 1.4 GB venv up front (40 s on 2 busy cores).
unexport PYTHONDONTWRITEBYTECODE
PIP    := $(BIN)/python -m pip install --disable-pip-version-check --no-compile
# uv installs the same requirements.txt pins several times faster than pip (parallel downloads,
# no per-package subprocess); pip stays the fallback. torch goes in first, with pip: pip finds
# the CPU wheel that pip's configuration points to (uv does not read it and would fetch a
# multi-GB CUDA build); with torch==2.13.0 installed, uv keeps it and installs the rest.
UV_PIN := uv==0.13.8
UV     := $(BIN)/uv pip install --python $(BIN)/python --no-progress
TORCH_PIN := $(shell grep -m1 '^torch==' requirements.txt)
NB     ?= $(sort $(wildcard notebooks/[0-9]*.ipynb))
PORT   ?= 8888
# `make test` runs test files and notebooks in parallel, one process per core, each torch on one
# thread: faster than one process with many threads, and steady when the machine is busy.
JOBS   ?= auto
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PYTEST_NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=900 --ignore=notebooks/exercises

# The learner's own copies of the exercise notebooks (git-ignored; filled once, never overwritten).
WORK   ?= my-work
# JupyterLab settings for the project's Lab (no "Jupyter news" question): installed into the venv.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

.PHONY: setup check-python lab test test-slow test-browser test-portability notebooks exercises handout keys models bench ddp-demo lint clean
.PHONY: grade nbgrader test-teacher

check-python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "make: no Python found (looked for python3.11 and python3)."; \
	  echo "  This project needs Python 3.11: https://www.python.org/downloads/ , or"; \
	  echo "  Debian/Ubuntu: sudo apt install python3.11 python3.11-venv; macOS: brew install python@3.11"; \
	  echo "  Then run make again, or point to it: make lab PYTHON=/path/to/python3.11"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
	  echo "make: $(PYTHON) is $$($(PYTHON) --version 2>&1), but this project needs Python 3.11"; \
	  echo "  (its pinned packages, torch included, are for 3.11). Install it (see the README,"; \
	  echo "  'Set-up and troubleshooting') and run: make lab PYTHON=/path/to/python3.11"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "make: $(PYTHON) cannot create virtual environments (no venv/ensurepip module)."; \
	  echo "  Debian/Ubuntu: sudo apt install python3.11-venv"; exit 1; }

$(STAMP): requirements.txt pyproject.toml
	@$(MAKE) --no-print-directory check-python
	@echo "First set-up: a virtual environment in $(VENV)/ with the pinned packages"
	@echo "(about 1.5 GB once installed; about 2 minutes on a fresh 2-core machine, seconds after that)."
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --progress-bar on "$(TORCH_PIN)"
	$(PIP) -q $(UV_PIN) && $(UV) -r requirements.txt \
	  || { echo "make: uv failed; installing with pip instead"; $(PIP) --progress-bar on -r requirements.txt; }
	$(PIP) -q --no-deps --no-build-isolation -e . 2>/dev/null || $(PIP) -q --no-deps -e .
	touch $(STAMP)

$(LAB_OVERRIDES): tools/jupyterlab/overrides.json $(STAMP)
	mkdir -p $(dir $@)
	cp tools/jupyterlab/overrides.json $@

setup: $(STAMP) $(LAB_OVERRIDES)

# Copies the exercise notebooks that $(WORK)/ lacks (never overwrites one), then opens
# JupyterLab on the repository with the file browser in $(WORK)/.
lab: setup
	$(BIN)/python -m labkit.course.exercises --fill $(WORK)
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$(PORT) --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/$(WORK) $(if $(filter 0,$(shell id -u)),--allow-root)

# The notebooks go first: each is one long unit (its cells share a kernel), and longest-first
# leaves the two workers finishing together on the short test files.
test: setup
	$(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) --dist loadscope $(PYTEST_NBVAL) -m "not slow" notebooks tests

# The long integration tests that make test leaves out, each also covered by a fast test or a
# notebook (the real 2-process DDP run, the full grade CLI, a model rebuilt from its recipe):
# CI runs them after make test.
test-slow: setup
	$(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) -p no:nbval -m slow tests

# The notebooks' stored outputs at 1, 2 and 4 torch threads and with generic CPU kernels (a
# stand-in for another CPU): a learner's machine must print what the repository stores.
test-portability: setup
	$(BIN)/python tools/portability.py

# Every solved notebook run in JupyterLab in headless Chromium (Debian's chromium).
$(BROWSER_STAMP): $(STAMP) requirements-browser.txt
	$(PIP) -q -r requirements-browser.txt
	touch $(BROWSER_STAMP)

test-browser: $(BROWSER_STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:nbval tests_browser -v --durations=0

# Student copies of the notebooks (notebooks/exercises/) and the lab table of docs/teaching.md,
# generated from the solved notebooks. Never touches $(WORK)/; a copy edited by hand is kept in
# $(WORK)/rescued/ before it is regenerated.
exercises: setup
	$(BIN)/python -m labkit.course.exercises

# What a student gets: dist/transformer-labs/ and dist/transformer-labs.zip (exercise copies,
# tx_helpers, requirements, a README; no solved notebook, no teacher key).
# LABS="05 09": only those labs; GRADED=1: nbgrader's student version, Hint 1 only, no proofs.
handout: setup
	$(BIN)/python -m labkit.course.handout $(if $(LABS),--labs $(LABS)) $(if $(filter 1 yes true,$(GRADED)),--graded)

# One teacher key per lab in teacher/keys/ (git-ignored): solutions, answers, predictions,
# each check's mistakes. For the teacher only.
keys: setup
	$(BIN)/python -m labkit.course.keys

# Re-execute notebooks in place (all of them, or NB=notebooks/03_x.ipynb), then merge each
# cell's stream outputs so a saved progress bar keeps only its last state, store widget cells
# without output, and regenerate the exercises.
notebooks: setup
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False $(NB)
	$(BIN)/jupyter nbconvert --coalesce-streams --inplace --log-level=WARN $(NB)  # a progress bar's last state only
	$(BIN)/python tools/clear_widget_outputs.py $(NB)  # no raw widget text before a cell runs
	$(BIN)/python -m labkit.course.exercises  # the student copies follow their solved notebooks

# The trained models that ship in tx_helpers/models/ (recipes in tx_helpers/pretrained.py):
# retrains every one on one thread and rewrites MANIFEST.json: about 3 min of CPU time for the
# dates models and about an hour for g2p. An interrupted run resumes from build/checkpoints/.
# One model: make models NAMES=g2p
models: setup
	$(BIN)/python tools/make_models.py $(NAMES)

# Benchmarks: prints a table, writes benchmarks/latest.md and latest.json (< 10 min on 2 cores).
bench: setup
	$(BIN)/python tools/bench.py $(BENCH_ARGS)

# The training loop on 2 CPU processes with DistributedDataParallel (gloo), dates recipe:
# per-rank throughput, exact match, all-reduce vs compute (about 2.5 min on 2 cores).
ddp-demo: setup
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=2 tools/train_ddp.py $(DDP_ARGS)

# Teachers: grade submitted notebooks (marks per exercise, a CSV, a summary, one feedback file
# per student): make grade SUBMISSIONS="submissions/*.ipynb" [GRADES=grades.csv]
SUBMISSIONS ?= submissions/*.ipynb
GRADES ?= grades.csv
grade: setup
	$(BIN)/python -m labkit.course.grade $(SUBMISSIONS) --out $(GRADES) $(GRADE_ARGS)

# Teachers with nbgrader: requirements-teacher.txt (nbgrader, pinned) goes into the same venv,
# then every lab is exported into an nbgrader course folder: make nbgrader [COURSE=course]
TEACHER_STAMP := $(VENV)/.teacher-installed
COURSE ?= course
$(TEACHER_STAMP): requirements-teacher.txt $(STAMP)
	$(PIP) -q -r requirements-teacher.txt
	touch $(TEACHER_STAMP)

nbgrader: $(TEACHER_STAMP)
	$(BIN)/python -m labkit.course.nbgrader_export --out $(COURSE)

# The nbgrader round trip (generate, autograde three submissions, feedback) and every command
# docs/teaching.md and docs/nbgrader.md show.
test-teacher: $(TEACHER_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" TX_TEACHER_TESTS=1 $(TEST_ENV) $(BIN)/python -m pytest -p no:nbval -p no:cacheprovider -q \
	  tests/test_nbgrader.py tests/test_teaching_commands.py

lint: setup
	$(BIN)/ruff check tx_helpers tests tests_browser tools

clean:
	rm -rf $(VENV) .cache
