# dike-slurm: `make demo` replays the bundled trace, `make test` runs every test against a
# real Slurm lab cluster (scripts/slurm-lab). Both create .venv themselves.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB := scripts/slurm-lab
SAMPLE := examples/sample

.PHONY: demo test unit bench lab-up lab-down clean chromium systemd-analyze prometheus

$(STAMP): setup.cfg pyproject.toml scripts/bootstrap-venv
	VENV=$(VENV) scripts/bootstrap-venv
	touch $(STAMP)

# Two figures: day one (the sample's configuration: live preemption is opt-in and the sample tags
# no job, so none may be preempted), and every job preemptible (a site whose jobs all checkpoint).
DEMO_REPLAY = $(BIN)/dike-slurm replay $(SAMPLE)/sacct.txt --slurm-conf $(SAMPLE)/slurm.conf \
	    --topology $(SAMPLE)/topology.conf -p fifo -p multifactor -p tiresias -p dike
demo: $(STAMP)
	@echo "== day one: the sample's configuration, no job opted in to preemption =="
	$(DEMO_REPLAY) --out out/demo/day-one
	@echo
	@echo "== every job preemptible =="
	$(DEMO_REPLAY) --preemptible all --penalty-sweep 0,0.5 --out out/demo/every-job

# The whole suite, tested by what varies (scripts/test-matrix; docs/slurm-lab.md "Which test runs
# where"): the unit and browser tests on both cores while the newer Slurm chroots build (cached in
# /var/cache/dike-slurm-lab); every integration test on the host's Slurm (the first of
# SLURM_VERSIONS, 22.05) and its two-type lab; the tests marked `adapter` (what differs between
# versions) on the other versions, side by side. A version in SLURM_VERSIONS_IF_BUILDS runs when its
# chroot builds and is skipped with the reason when it does not (25.11 without DIKE_SLURM_SRC,
# SchedMD's source: see docs/slurm-lab.md). A version in SLURM_VERSIONS_INSIDE runs every test inside
# its chroot (`slurm-lab run`: pyslurm needs that Slurm's library and glibc), with the engine on the
# pyslurm backend, and its two-type lab. Each lab is started before and stopped after, also when
# tests fail. The closing lines give the minutes of each part. DIKE_SKIP_SLURM=1 skips the clusters
# explicitly.
SLURM_VERSIONS ?= 22.05 24.11
SLURM_VERSIONS_IF_BUILDS ?= 26.05 25.11
SLURM_VERSIONS_INSIDE = 25.11
test: $(STAMP) chromium systemd-analyze prometheus
	@if [ "$${DIKE_SKIP_SLURM:-0}" = 1 ]; then \
	    echo "DIKE_SKIP_SLURM=1: integration tests against real Slurm are SKIPPED" >&2; \
	    TMPDIR=$$(scripts/unit-tmpdir) $(BIN)/pytest -n 2 --dist worksteal; \
	else \
	    BIN=$(BIN) SLURM_VERSIONS="$(SLURM_VERSIONS)" SLURM_VERSIONS_IF_BUILDS="$(SLURM_VERSIONS_IF_BUILDS)" \
	        SLURM_VERSIONS_INSIDE="$(SLURM_VERSIONS_INSIDE)" scripts/test-matrix; \
	fi

# Headless Chromium (Debian's package) for tests/browser, which renders report.html: installed
# when missing and make runs as root with apt-get, as the lab installs Slurm; otherwise the
# browser test skips and says why.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "==== installing chromium (Debian package) for the browser test"; \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
	        || echo "==== chromium did not install: the browser test will be SKIPPED" >&2; \
	else \
	    echo "==== chromium not found and not root with apt-get: the browser test will be SKIPPED" >&2; \
	fi

# systemd-analyze (Debian's systemd package) for tests/unit/test_render.py, which verifies the rendered
# units and scores their hardening: installed when missing and make runs as root with apt-get;
# otherwise those tests skip and say why.
systemd-analyze:
	@if command -v systemd-analyze >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "==== installing systemd (Debian package) for systemd-analyze"; \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd >/dev/null; } \
	        || echo "==== systemd did not install: the unit hardening tests will be SKIPPED" >&2; \
	else \
	    echo "==== systemd-analyze not found and not root with apt-get: the unit hardening tests will be SKIPPED" >&2; \
	fi

# Debian's prometheus (promtool) and prometheus-node-exporter for tests/unit/test_alert_rules.py and
# tests/integration/test_prometheus_scrape.py, which start their own instances on free ports of
# 127.0.0.1 (never the packages' services; on a host booted with systemd, Debian's packaging
# starts those): installed when missing and make runs as root with apt-get; otherwise those
# tests skip and say why.
prometheus:
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus-node-exporter >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "==== installing prometheus and prometheus-node-exporter (Debian packages) for the metrics tests"; \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus prometheus-node-exporter >/dev/null; } \
	        || echo "==== prometheus did not install: the alert rule and scrape tests will be SKIPPED" >&2; \
	else \
	    echo "==== promtool or prometheus-node-exporter not found and not root with apt-get: the alert rule and scrape tests will be SKIPPED" >&2; \
	fi

# A release installed into a prefix of its own, as the systemd unit runs it (docs/deployment.md): a wheel
# of this checkout in dist/, installed with its dependencies into a venv at PREFIX made with the system's
# Python (/usr/bin/python3). Needs no .venv; as root for /opt. Then PREFIX/bin/dike-slurm render systemd.
PREFIX ?= /opt/dike-slurm
.PHONY: install
install:
	scripts/install-prefix $(PREFIX)

# TMPDIR: a tmpfs where there is one with room (scripts/unit-tmpdir says why). --dist worksteal:
# each worker starts on one half of the suite in order (a module's fixtures built once) and takes
# from the other's queue when its own runs out, so neither waits on the other at the end.
unit: $(STAMP)
	TMPDIR=$$(scripts/unit-tmpdir) $(BIN)/pytest -n 2 --dist worksteal tests/unit

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# 90 simulated days of a corpus trace through the live engine with --apply (under 15 min on 2
# cores): RSS, state file size, rows per table and cycle CPU time per day, their growth per day;
# bench/results/soak.{json,png}, the table in docs/reliability.md.
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python bench/soak.py

# Every case of examples/corpus plus the sample under every policy (about 37 min on 2 cores; the cases
# that mix GPU types in their own tables):
# tables, out/eval/eval.json and report.html, and the generated section of docs/results.md.
.PHONY: eval
eval: $(STAMP)
	$(BIN)/dike-slurm eval examples/corpus $(SAMPLE) --out out/eval --workers 2 --results docs/results.md

# The replay against the real cluster (docs/replay.md "Fidelity"; 25-30 min, root):
# bench/fidelity.py runs one workload on the 22.05 lab under the live engine (fifo twice, dike
# twice, dike with every job preemptible twice) and replays each run's sacct through the simulator. It holds the lab lock (flock
# /tmp/dike-lab.lock, shared with everyone using the lab) throughout; each run brings the lab up
# before and down after, also on failure. Run by hand, bench/fidelity.py takes the lock per run
# instead. Not part of `make test`. Results: out/fidelity/ (fidelity.json, table.md, fidelity.png, fidelity.html).
.PHONY: fidelity
fidelity: $(STAMP)
	flock /tmp/dike-lab.lock $(BIN)/python bench/fidelity.py --no-lock --out out/fidelity

# The engine's writes at scale on the real lab (about 20 minutes, root): 5,000 pending
# jobs on the lab of $(SLURM), each way of writing timed, the engine converging from an empty
# state, a service watched against the idle controller, the audit checked against Slurm. The lab
# comes up before and goes down after. Not part of `make test`. Results: out/lab-writes/lab_writes.json.
.PHONY: lab-writes
lab-writes: $(STAMP)
	$(LAB) --slurm $(SLURM) up
	$(BIN)/python bench/lab_writes.py --slurm $(SLURM) --pending 5000; status=$$?; \
	    $(LAB) --slurm $(SLURM) down; exit $$status

# make lab-up SLURM=24.11: the lab of that version (22.05, 24.11, 26.05)
SLURM ?= 22.05
lab-up:
	$(LAB) --slurm $(SLURM) up

lab-down:
	$(LAB) --slurm $(SLURM) down

clean:
	rm -rf $(VENV) out build *.egg-info
