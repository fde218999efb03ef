# `make help` lists the targets. Every target that runs Python first creates .venv and installs the
# pinned dependencies and the package (once; again only when a requirements file changes).

SHELL := /bin/bash
VENV ?= .venv
PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# apolo-flow 26 (neuro-flow's successor) in an environment of its own: both ship `apolo_flow`.
FLOW26_VENV ?= .venv-apolo-flow26
FLOW26 := $(FLOW26_VENV)/.installed
# The MLflow tracking server of the tracking tests, in an environment of its own (its dependencies are heavy).
MLFLOW_VENV ?= .venv-mlflow
MLFLOW_SERVER := $(MLFLOW_VENV)/.installed
# transformers 4 in an environment of its own: the question-answering pipeline that serves an export (v5 removed it).
TRANSFORMERS4_VENV ?= .venv-transformers4
TRANSFORMERS4 := $(TRANSFORMERS4_VENV)/.installed
# The Docker tier: builds the images (--build-only), then trains with two containers.
DOCKER_TIER ?= tests/docker/run.sh
# SkyPilot in an environment of its own (it pins click below the project's): its task loader checks
# deploy/skypilot/task.yaml in the tests, and it is the `sky` client that launches it.
SKYPILOT_VENV ?= .venv-skypilot
SKYPILOT := $(SKYPILOT_VENV)/.installed
ARGS ?=
# pytest workers of make test and make test-fast (pytest-xdist); TEST_WORKERS=0 runs the tests in one process.
TEST_WORKERS ?= 2
# The benchmarks `make bench` runs, in this order; add yours here. Each prints its table and PASS/MISS
# lines for its targets, and accepts --quick (BENCH_ARGS=--quick: a smoke run in about a minute); one that
# cannot run here (bench/comm_hook.py without root) prints a SKIP line instead.
BENCH_SCRIPTS := bench/step_overhead.py bench/hf_trainer.py bench/optimizations.py bench/ddp_overhead.py \
	bench/comm_hook.py bench/loader_vs_step.py bench/nq_pipeline.py bench/tracking_overhead.py \
	bench/checkpoint_io.py bench/squad_pipeline.py bench/sharding.py
BENCH_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup run train doctor prepare synthetic-nq sweep-demo bench test test-fast test-docker lint tiny-model nq-sample download-nq env-example tensorboard clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: $(INSTALLED) $(FLOW26) $(MLFLOW_SERVER) $(TRANSFORMERS4) $(SKYPILOT) ## Create .venv (pinned runtime + dev deps, the package), .venv-apolo-flow26, .venv-mlflow, .venv-transformers4, .venv-skypilot

$(MLFLOW_SERVER): requirements-mlflow-server.txt
	python3 -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install --quiet -r requirements-mlflow-server.txt
	touch $@

$(TRANSFORMERS4): requirements-transformers4.txt
	python3 -m venv $(TRANSFORMERS4_VENV)
	$(TRANSFORMERS4_VENV)/bin/python -m pip install --quiet -r requirements-transformers4.txt
	touch $@

$(SKYPILOT): requirements-skypilot.txt
	python3 -m venv $(SKYPILOT_VENV)
	$(SKYPILOT_VENV)/bin/python -m pip install --quiet -r requirements-skypilot.txt
	touch $@

$(FLOW26): requirements-apolo-flow.txt
	python3 -m venv $(FLOW26_VENV)
	$(FLOW26_VENV)/bin/python -m pip install --quiet -r requirements-apolo-flow.txt
	touch $@

$(INSTALLED): requirements.txt requirements-dev.txt pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 (>= 3.11) is required" >&2; exit 1; }
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "python3 >= 3.11 is required" >&2; exit 1; }
	python3 -m venv $(VENV) || { apt-get update && apt-get install -y python3-venv && python3 -m venv $(VENV); }
	$(PYTHON) -m pip install --quiet -r requirements-dev.txt
	$(PYTHON) -m pip install --quiet --no-deps -e .
	touch $@

run: $(INSTALLED) ## The main job: 2 emulated nodes × 1 process, tiny model, DummyDataset (ARGS="--max-steps 20")
	PYTHON=$(PYTHON) scripts/run_distributed_locally.sh $(ARGS)

train: $(INSTALLED) ## One process, no launcher (ARGS="--preset none --max-steps 20")
	$(PYTHON) -m distqa.train $(ARGS)

doctor: $(INSTALLED) ## Preflight checks of this machine with the run's flags (ARGS="--preset bert-base-nq")
	$(PYTHON) -m distqa.doctor $(ARGS)

prepare: $(INSTALLED) ## Build the NQ feature cache (default: the sample; ARGS="--preset bert-base-nq --num-proc 16")
	$(PYTHON) -m distqa.prepare --task nq $(ARGS)

synthetic-nq: $(INSTALLED) ## Learnable synthetic NQ end to end: generate, train 2 nodes, predict, score (~4 min)
	PYTHON=$(PYTHON) scripts/train_synthetic_nq.sh $(ARGS)

# The demo sweep's data: the learnable synthetic SQuAD set, small (generated in a second, the same every time).
SWEEP_DEMO_DATA = results/sweep-demo-data
sweep-demo: $(INSTALLED) ## A 6-trial lr sweep on 2 emulated nodes each, pruned by the median rule; its table and picture (~2 min)
	for split in train:0:300 dev:1:40; do \
		$(PYTHON) -m distqa.qa.squad.synthetic --output $(SWEEP_DEMO_DATA)/$${split%%:*}.json --seed $$(echo $$split | cut -d: -f2) \
			--articles $${split##*:} --facts 1 --plausible 0 --filler-words 10 || exit 1; \
	done
	PYTHON=$(PYTHON) scripts/sweep.sh demo --sweep-dir results/sweeps/demo $(ARGS) -- \
		--squad-train-file $(SWEEP_DEMO_DATA)/train.json --squad-validation-file $(SWEEP_DEMO_DATA)/dev.json \
		--squad-cache-dir $(SWEEP_DEMO_DATA)/cache

bench: $(INSTALLED) ## Every benchmark in BENCH_SCRIPTS, one report with all targets at the end (~13 min; BENCH_ARGS=--quick)
	@report=$$(mktemp); trap 'rm -f "$$report"' EXIT; failed=0; \
	for script in $(BENCH_SCRIPTS); do \
		echo "=== $$script $(BENCH_ARGS)"; \
		$(PYTHON) "$$script" $(BENCH_ARGS) 2>&1 | tee -a "$$report"; \
		[ "$${PIPESTATUS[0]}" -eq 0 ] || { echo "$$script failed" | tee -a "$$report"; failed=1; }; \
		echo; \
	done; \
	echo "=== targets ($$(date -u '+%F %H:%M UTC'), $$(nproc) cores, commit $$(git rev-parse --short HEAD 2>/dev/null || echo unknown))"; \
	grep -E '^(PASS|MISS|SKIP)  |failed$$' "$$report"; \
	exit $$failed

# The Docker tier's images build in the background from the start (minutes on a fresh machine, mostly
# downloads), so that the linters, the side venvs (installed side by side) and the suite run meanwhile; its 2-container run comes last.
test: $(INSTALLED) ## Linters, the whole test suite (CPU only, no network), then test-docker (its images built meanwhile)
	@mkdir -p build/docker; \
	echo "building the Docker tier's images beside the tests (log: build/docker/build-beside-tests.log)"; \
	PYTHON=$(PYTHON) $(DOCKER_TIER) --build-only >build/docker/build-beside-tests.log 2>&1 & build=$$!; \
	$(MAKE) --no-print-directory --jobs 5 lint $(FLOW26) $(MLFLOW_SERVER) $(TRANSFORMERS4) $(SKYPILOT) \
		&& $(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal $(ARGS); status=$$?; \
	wait $$build || echo "the Docker tier's build beside the tests failed (build/docker/build-beside-tests.log);" \
		"make test-docker builds again and says why"; \
	[ $$status -eq 0 ] && $(MAKE) --no-print-directory test-docker

test-docker: $(INSTALLED) ## Build the Dockerfile (on a local stand-in base) and run a 2-container DDP training
	PYTHON=$(PYTHON) $(DOCKER_TIER)

test-fast: $(INSTALLED) $(FLOW26) $(MLFLOW_SERVER) $(TRANSFORMERS4) $(SKYPILOT) ## The tests that start no multi-process runs
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not distributed" $(ARGS)

lint: $(INSTALLED) ## ruff on Python, the import contracts (pyproject.toml), shellcheck on the scripts, hadolint on the Dockerfiles
	$(VENV)/bin/ruff check src tests bench notebooks examples
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/shellcheck scripts/*.sh scripts/*.sbatch bench/*.sh tests/docker/*.sh .ci/run
	$(VENV)/bin/hadolint Dockerfile tests/docker/*.Dockerfile

tiny-model: $(INSTALLED) ## Rebuild data/tiny-bert (tokenizer trained on data/tokenizer-corpus.txt + config)
	$(PYTHON) -m distqa.encoders.tiny --corpus data/tokenizer-corpus.txt --output data/tiny-bert

nq-sample: $(INSTALLED) ## Regenerate the committed synthetic NQ sample in data/nq-sample (byte-identical)
	PYTHON=$(PYTHON) scripts/make_nq_sample.sh data/nq-sample

download-nq: ## Download the real NQ data (Kaggle CLI, ~17 GB unzipped) into data/nq (ARGS="--dir DIR")
	scripts/download_nq.sh $(ARGS)

env-example: $(INSTALLED) ## Regenerate .env.example from the Config fields
	$(PYTHON) -m distqa.config.sources > .env.example

tensorboard: $(INSTALLED) ## TensorBoard over every run in results/
	$(VENV)/bin/tensorboard --logdir results --bind_all

clean: ## Remove the run directories in results/, build/ and caches (keeps .venv and the Docker images)
	find results -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} + 2>/dev/null || true
	rm -rf build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +
