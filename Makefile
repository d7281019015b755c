# dike-slurm: `make demo` replays the bundled trace, `make test` runs every test against a
# real Slurm lab cluster (scripts/slurm-lab). Both create .venv themselves.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB := scripts/slurm-lab
SAMPLE := examples/sample

.PHONY: demo test unit bench lab-up lab-down clean

$(STAMP): setup.cfg pyproject.toml scripts/bootstrap-venv
	VENV=$(VENV) scripts/bootstrap-venv
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dike-slurm replay $(SAMPLE)/sacct.txt --slurm-conf $(SAMPLE)/slurm.conf \
	    --topology $(SAMPLE)/topology.conf --policy fifo --policy tiresias --policy dike \
	    --penalty-sweep 0,0.5 --out out/demo

# The whole suite, integration tests included, against a lab cluster that is started before
# and stopped after (also when tests fail). DIKE_SKIP_SLURM=1 skips the cluster explicitly.
test: $(STAMP)
	@if [ "$${DIKE_SKIP_SLURM:-0}" = 1 ]; then \
	    echo "DIKE_SKIP_SLURM=1: integration tests against real Slurm are SKIPPED" >&2; \
	    $(BIN)/pytest; \
	else \
	    $(LAB) up || exit 1; \
	    status=0; $(BIN)/pytest || status=$$?; \
	    $(LAB) down; exit $$status; \
	fi

unit: $(STAMP)
	$(BIN)/pytest tests/unit

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# Every case of examples/corpus plus the sample under every policy (about 30 min on 2 cores):
# tables, out/eval/eval.json and report.html, and the generated section of docs/results.md.
.PHONY: eval
eval: $(STAMP)
	$(BIN)/dike-slurm eval examples/corpus $(SAMPLE) --out out/eval --workers 2 --results docs/results.md

lab-up:
	$(LAB) up

lab-down:
	$(LAB) down

clean:
	rm -rf $(VENV) out build *.egg-info
