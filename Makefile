# `make help` lists the targets. Every target that runs Python first creates .venv and installs the
# pinned dependencies and the package (once; again only when a requirements file changes).
# This file is the template's (template.toml): a project's own settings are in project.toml, which it reads, and
# the targets of a part a fork may leave out are in that part's make/<part>.mk, included when the checkout has it.

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
# pytest workers of make test, make test-dev and make test-fast (pytest-xdist); TEST_WORKERS=0 runs the tests in one process.
TEST_WORKERS ?= 2
# project.toml's settings (src/distqa/upkeep/project.py), read in a recipe's shell: `$(call project,run.args)` sets
# the array PROJECT to the words of [run] args (a wrong project.toml: its one-line error, exit 2).
PROJECT_TOML := project.toml
project = words=$$($(PYTHON) src/distqa/upkeep/project.py --split $(1)) || exit 2; PROJECT=(); \
	[ -z "$$words" ] || mapfile -t PROJECT <<< "$$words"
# The side environments of the parts this checkout has (a fork that left a part out has not its requirements).
SIDE_VENVS := $(if $(wildcard requirements-apolo-flow.txt),$(FLOW26)) $(MLFLOW_SERVER) \
	$(if $(wildcard requirements-transformers4.txt),$(TRANSFORMERS4)) \
	$(if $(wildcard requirements-skypilot.txt),$(SKYPILOT))
# tests/launchers/test_sweep_dashboard.py looks at optuna-dashboard through Debian's headless Chromium: the
# distribution's package (nothing downloads a browser build of its own at install time).
CHROMIUM := /usr/bin/chromium-headless-shell
# What make lint checks: the folders and scripts this checkout has.
PYTHON_DIRS := $(wildcard src tests bench notebooks examples)
SHELL_SCRIPTS := $(wildcard scripts/*.sh scripts/*.sbatch bench/*.sh tests/docker/*.sh) .ci/run
# A package's own import contracts beside it (the QA tasks', a fork's task's), besides pyproject.toml's layers.
CONTRACTS := $(wildcard src/*/contracts.toml src/*/*/contracts.toml src/*/*/*/contracts.toml)

.DEFAULT_GOAL := help
.PHONY: help setup run train doctor test test-dev test-fast test-docker lint tiny-model env-example tensorboard clean \
	new-fork update-template

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup: $(INSTALLED) $(SIDE_VENVS) $(CHROMIUM) ## Create .venv (pinned runtime + dev deps, the package), .venv-apolo-flow26, .venv-mlflow, .venv-transformers4, .venv-skypilot (those of the parts here), headless Chromium (apt)

$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null

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

# project.toml's [image] python as a requirements file, rewritten only when that list changes (another setting of
# project.toml changing reinstalls nothing).
PROJECT_REQUIREMENTS := $(VENV)/project-requirements.txt
$(PROJECT_REQUIREMENTS): $(PROJECT_TOML)
	@mkdir -p $(@D) && python3 src/distqa/upkeep/project.py image.python > $@.new
	@cmp -s $@.new $@ || mv $@.new $@; rm -f $@.new

$(INSTALLED): requirements.txt requirements-dev.txt pyproject.toml $(PROJECT_REQUIREMENTS)
	@command -v python3 >/dev/null || { echo "python3 (>= 3.11) is required" >&2; exit 1; }
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "python3 >= 3.11 is required" >&2; exit 1; }
	python3 -m venv $(VENV) || { apt-get update && apt-get install -y python3-venv && python3 -m venv $(VENV); }
	$(PYTHON) -m pip install --quiet -r requirements-dev.txt -r $(PROJECT_REQUIREMENTS)
	$(PYTHON) -m pip install --quiet --no-deps -e .
	touch $@

run: $(INSTALLED) ## The main job: 2 emulated nodes × 1 process, project.toml's [run] flags (ARGS="--max-steps 20")
	@$(call project,run.args); set -x; PYTHON=$(PYTHON) scripts/run_distributed_locally.sh "$${PROJECT[@]}" $(ARGS)

train: $(INSTALLED) ## One process, no launcher, project.toml's [run] flags (ARGS="--max-steps 20")
	@$(call project,run.args); set -x; $(PYTHON) -m distqa.train "$${PROJECT[@]}" $(ARGS)

doctor: $(INSTALLED) ## Preflight checks of this machine with the run's flags (ARGS="--preset NAME")
	$(PYTHON) -m distqa.doctor $(ARGS)

# The Docker tier's images build in the background from the start (minutes on a fresh machine, mostly
# downloads), so that the linters, the side venvs (installed side by side) and the suite run meanwhile; its 2-container run comes last.
test: $(INSTALLED) ## Linters, the whole test suite (CPU only, no network), then test-docker (its images built meanwhile)
	@mkdir -p build/docker; \
	echo "building the Docker tier's images beside the tests (log: build/docker/build-beside-tests.log)"; \
	PYTHON=$(PYTHON) $(DOCKER_TIER) --build-only >build/docker/build-beside-tests.log 2>&1 & build=$$!; \
	$(MAKE) --no-print-directory --jobs 5 lint $(SIDE_VENVS) $(CHROMIUM) \
		&& $(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal $(ARGS); status=$$?; \
	wait $$build || echo "the Docker tier's build beside the tests failed (build/docker/build-beside-tests.log);" \
		"make test-docker builds again and says why"; \
	[ $$status -eq 0 ] && $(MAKE) --no-print-directory test-docker

test-docker: $(INSTALLED) ## Build the Dockerfile (on a local stand-in base) and run a 2-container DDP training
	PYTHON=$(PYTHON) $(DOCKER_TIER)

test-dev: $(INSTALLED) $(SIDE_VENVS) $(CHROMIUM) ## The whole suite but the recipe runs and benchmarks (marked slow), no lint
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not slow" $(ARGS)

test-fast: $(INSTALLED) $(SIDE_VENVS) $(CHROMIUM) ## The tests that start no multi-process runs, nor the slow ones
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not distributed and not slow" $(ARGS)

lint: $(INSTALLED) ## ruff on Python, the import contracts (pyproject.toml), shellcheck on the scripts, hadolint on the Dockerfiles
	$(VENV)/bin/ruff check $(PYTHON_DIRS)
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(foreach contracts,$(CONTRACTS),$(VENV)/bin/lint-imports --no-cache --no-logo --config $(contracts) &&) true
	$(VENV)/bin/shellcheck $(SHELL_SCRIPTS)
	$(VENV)/bin/hadolint Dockerfile tests/docker/*.Dockerfile

tiny-model: $(INSTALLED) ## Rebuild data/tiny-bert (tokenizer trained on data/tokenizer-corpus.txt + config)
	$(PYTHON) -m distqa.encoders.tiny --corpus data/tokenizer-corpus.txt --output data/tiny-bert

env-example: $(INSTALLED) ## Regenerate .env.example from the Config fields
	$(PYTHON) -m distqa.config.sources > .env.example

tensorboard: $(INSTALLED) ## TensorBoard over every run in results/
	$(VENV)/bin/tensorboard --logdir results --bind_all

clean: ## Remove the run directories in results/, build/ and caches (keeps .venv and the Docker images)
	find results -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} + 2>/dev/null || true
	rm -rf build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +

new-fork: ## Start a fork of this commit: NAME=mytask DIR=../mytask [WITHOUT="qa slurm"] (docs/FORKING.md)
	@PYTHONPATH=src python3 -m distqa.upkeep new-fork --name "$(NAME)" --dir "$(DIR)" --without "$(WITHOUT)" \
		$(if $(UPSTREAM),--upstream "$(UPSTREAM)")

update-template: ## Take the template's fixes since fork.toml's commit, with no conflict ([REF=tag] [UPSTREAM=url])
	@PYTHONPATH=src python3 -m distqa.upkeep update --ref "$(or $(REF),main)" $(if $(UPSTREAM),--upstream "$(UPSTREAM)") \
		$(if $(BASE),--base "$(BASE)") $(if $(LEFT_OUT),--left-out "$(LEFT_OUT)")

# The targets of the parts a fork may leave out (template.toml): make/<part>.mk, when the checkout has it.
-include $(wildcard make/*.mk)
