# The QA tasks' targets (template.toml's part qa: a fork that leaves the QA tasks out has not this file). The
# Makefile includes it; its variables and .venv are the Makefile's.

.PHONY: prepare synthetic-nq sweep-demo bench nq-sample download-nq

# The benchmarks `make bench` runs (they time the QA model), in this order. Each prints its table and PASS/MISS
# lines for its targets, and accepts --quick (BENCH_ARGS=--quick: a smoke run in about a minute); one that
# cannot run here (bench/comm_hook.py without root) prints a SKIP line instead.
BENCH_SCRIPTS := bench/step_overhead.py bench/hf_trainer.py bench/optimizations.py bench/ddp_overhead.py \
	bench/comm_hook.py bench/loader_vs_step.py bench/nq_pipeline.py bench/tracking_overhead.py \
	bench/checkpoint_io.py bench/squad_pipeline.py bench/sharding.py
BENCH_ARGS ?=

prepare: $(INSTALLED) ## Build the NQ feature cache (default: the sample; ARGS="--preset bert-base-nq --num-proc 16")
	$(PYTHON) -m distqa.prepare --task nq $(ARGS)

synthetic-nq: $(INSTALLED) ## Learnable synthetic NQ end to end: generate, train 2 nodes, predict, score (~4 min)
	PYTHON=$(PYTHON) scripts/train_synthetic_nq.sh $(ARGS)

# The demo sweep's data: the learnable synthetic SQuAD set, small (generated in a second, the same every time).
SWEEP_DEMO_DATA = results/sweep-demo-data
sweep-demo: $(INSTALLED) ## A 6-trial lr sweep on 2 emulated nodes each, pruned by the median rule; its table and picture (~1 min)
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

nq-sample: $(INSTALLED) ## Regenerate the committed synthetic NQ sample in data/nq-sample (byte-identical)
	PYTHON=$(PYTHON) scripts/make_nq_sample.sh data/nq-sample

download-nq: ## Download the real NQ data (Kaggle CLI, ~17 GB unzipped) into data/nq (ARGS="--dir DIR")
	scripts/download_nq.sh $(ARGS)
