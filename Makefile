# Souq: `make dev` runs a local cluster, `make test` runs every check, `make bench` measures.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
BSTAMP := $(VENV)/.installed-bench

.PHONY: dev test test-packages bench build bwrap oci-tools netns-tools go-toolchain wrk nginx dnsperf isolation-tools lint typecheck \
	unit clean browser-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The `native` extra is mypyc (with mypy) and setuptools: `make build` compiles the hot modules.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[native]'
	touch $@

$(TSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,native]'
	touch $(STAMP) $@

# The benchmarks also need supervisord and circus (the `bench` extra), to compare against.
$(BSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,native,bench]'
	touch $(STAMP) $(TSTAMP) $@

# The proxy's relay (and the other modules souq.compiled names) compiled in place with mypyc;
# a no-op when no source changed, and plain Python where there is no C compiler. Then every
# source to bytecode, once: where the environment sets PYTHONDONTWRITEBYTECODE, Python writes
# none and each process compiles what it imports again (a third of a daemon's start, measured in
# docs/benchmarks.md, "Test suite").
build: $(STAMP)
	$(BIN)/python -m souq.compiled
	@$(BIN)/python -m compileall -q -j 0 src tests bench >/dev/null

# The sandbox driver needs bubblewrap; without it (or without root) workers offer exec only.
bwrap:
	@command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap) \
		>/dev/null 2>&1 || echo "bubblewrap not installed: the sandbox driver is off" >&2

# The image tests check that standard tools read and write Souq's OCI images (skopeo, umoci),
# pull from a real OCI registry (docker-registry), and run a Debian root file system that
# mmdebstrap builds from the host's apt sources (once, cached in /var/tmp/souq-test-images):
# Debian's packages (without them, as non-root, those tests skip).
oci-tools:
	@command -v skopeo >/dev/null && command -v umoci >/dev/null && command -v docker-registry >/dev/null \
	  && command -v mmdebstrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq skopeo umoci docker-registry mmdebstrap >/dev/null; \
	  else echo "oci-tools: skopeo, umoci, docker-registry or mmdebstrap is missing and this is not root: the image tests skip"; fi; }

# The tests of several hosts (tests/multihost) build network namespaces with ip and cut them off
# with iptables: Debian's iproute2 and iptables (without them, or as non-root, those tests skip).
# WireGuard between workers (docs/network.md): wg from wireguard-tools, and wireguard-go where the
# kernel has no WireGuard (without recommends: they would pull a kernel image). The probes of a
# path straight over an IPv4 link (--underlay-link auto) are iputils' ping.
netns-tools:
	@command -v ip >/dev/null && command -v iptables >/dev/null && command -v wg >/dev/null \
	  && command -v wireguard-go >/dev/null && command -v ping >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends iproute2 iptables wireguard-tools \
	      wireguard-go iputils-ping >/dev/null; \
	  else echo "netns-tools: ip, iptables, wg, wireguard-go or ping is missing and this is not root: the multihost tests skip"; fi; }

# The Fly conformance suite (tests/fly) decodes Souq's answers with Go's encoding/json into the
# types of Fly's Machines API: Debian's golang-go (without it, as non-root, that decode step skips;
# the JSON type checks still run).
go-toolchain:
	@command -v go >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq golang-go >/dev/null; \
	  else echo "go-toolchain: go is missing and this is not root: the Go decode step skips"; fi; }

# The creates benchmark (bench/creates.py) drives the broker with wrk, Debian's package.
wrk:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk) \
		>/dev/null 2>&1 || echo "wrk not installed: the creates benchmark cannot run" >&2

# The proxy benchmark (bench/proxy.py) compares the relay with nginx, Debian's package, which
# also serves as the backend.
nginx:
	@command -v nginx >/dev/null || (apt-get update -qq && apt-get install -y -qq nginx) \
		>/dev/null 2>&1 || echo "nginx not installed: the proxy benchmark cannot run" >&2

# The names benchmark as a DNS operator runs it (bench/dnsperf.py) asks with dnsperf, Debian's
# package, from inside a machine's network namespace.
dnsperf:
	@command -v dnsperf >/dev/null || (apt-get update -qq && apt-get install -y -qq dnsperf) \
		>/dev/null 2>&1 || echo "dnsperf not installed: the dnsperf benchmark cannot run" >&2

# The isolation benchmark (bench/isolation.py) builds its image from busybox-static and compares
# the sandbox with runc, Debian's packages.
isolation-tools:
	@command -v busybox >/dev/null && command -v runc >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq busybox-static runc) >/dev/null 2>&1 || \
		echo "busybox-static or runc not installed: the isolation benchmark cannot run" >&2

# `make dev` says what each step does before it does it: the first run creates the venv and
# installs Souq (a minute or two, pip being quiet), and as root it may install a system package.
dev:
	@$(MAKE) --no-print-directory -q $(STAMP) 2>/dev/null || echo "make dev: installing Souq \
	into $(VENV) (python -m venv, then pip install -e '.[native]': the first time takes a minute \
	or two)..."
	@$(MAKE) -s --no-print-directory $(STAMP)
	@echo "make dev: compiling Souq's hot modules with mypyc where a C compiler is at hand \
	(make build; quick when nothing changed)..."
	@$(MAKE) --no-print-directory build
	@command -v bwrap >/dev/null || echo "make dev: bubblewrap (the sandbox driver's) is \
	missing: installing Debian's package with apt-get as root (else workers offer exec only)..."
	@$(MAKE) --no-print-directory bwrap
	@echo "make dev: starting the cluster: $(BIN)/souq dev $(ARGS)"
	$(BIN)/souq dev $(ARGS)

lint: $(TSTAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(TSTAMP)
	$(BIN)/mypy

# The dashboard's browser test (tests/browser) drives Debian's chromium with playwright-core from
# npm; no browser is downloaded. Installed here when missing; as non-root without them, the test
# skips (as root, which CI is, it never skips).
BROWSER := tests/browser
PLAYWRIGHT := $(BROWSER)/node_modules/.package-lock.json

browser-deps: $(PLAYWRIGHT)
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "browser-deps: chromium is missing and this is not root: the browser test will skip"; fi; }

$(PLAYWRIGHT): $(BROWSER)/package-lock.json
	@if command -v npm >/dev/null; then cd $(BROWSER) && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "browser-deps: npm is missing: the browser test will skip or fail"; fi

# Every Debian package the tests need, as command:package; `test-packages` installs the missing
# ones as root with one apt-get update and one apt-get install (each target above alone would
# update the package lists again), so on a fresh machine the targets after it find them all.
TEST_PACKAGES := chromium:chromium skopeo:skopeo umoci:umoci docker-registry:docker-registry \
	mmdebstrap:mmdebstrap ip:iproute2 iptables:iptables go:golang-go bwrap:bubblewrap \
	busybox:busybox-static runc:runc ping:iputils-ping

test-packages:
	@missing=""; for pair in $(TEST_PACKAGES); do \
	  command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "test-packages: installing$$missing (Debian's packages)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The suite runs in 3 worker processes (pytest-xdist; tests/conftest.py gives each worker whole
# test files, the Fly suite whole, so that a module's fixtures are made once), as measured on a
# 2-core machine in docs/benchmarks.md ("Test suite"). PYTEST_ARGS="-n 0" runs it in one process.
# It ends by naming its 30 slowest tests (setup, call and teardown apart), what to make cheaper.
PYTEST_ARGS ?= -n 3

# The compiled build (one C compiler on one core, about a minute on a fresh clone), ruff and mypy
# run side by side, after the installs (apt takes one at a time).
test: $(TSTAMP) test-packages browser-deps oci-tools netns-tools go-toolchain bwrap isolation-tools
	@$(MAKE) --no-print-directory --output-sync=target -j3 build lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS) --durations=30

unit: $(TSTAMP) build
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

bench: $(BSTAMP) build wrk nginx dnsperf bwrap isolation-tools
	$(BIN)/python -m bench $(ARGS)

clean:
	-$(BIN)/python -m souq.compiled --clean
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
