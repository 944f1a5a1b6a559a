# One entry point for people, hooks and CI.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)
# Extras of pyproject.toml the tests, lint and benchmarks need.
EXTRAS := embedded,edge,egress,http,bucketstore,blobstore,opcua,onvif,recorder,test,lint,bench

.PHONY: help demo test test-unit lint fmt bench bench-check bench-baseline soak chaos fuzz system-deps build-deps venv build wheel clean

help:
	@echo "make demo   build, then run the edge demo (broker, PLC, cameras, egress) until Ctrl-C"
	@echo "make test   install what tests need, build, lint, cargo test, pytest"
	@echo "make test-unit  the unit tier alone (no network, no processes): the edit-test loop"
	@echo "make wheel  the abi3 wheel and the sdist users install, in dist/"
	@echo "make bench  benchmarks, ours beside each anchor (writes benches/results.json)"
	@echo "make bench-check  the regression gate: a CPU-bound subset, 3 runs, ratios vs benches/baseline.json"
	@echo "make soak   the demo stack for SOAK_SECS (600) with a leak check (a results.json row)"
	@echo "make chaos  the demo stack under real faults for CHAOS_SECS (600), CHAOS_SEED (random)"
	@echo "make lint   ruff, mypy --strict, stubtest, cargo fmt --check, clippy"
	@echo "make fmt    format Python and Rust"
	@echo "make fuzz   bounded cargo-fuzz runs of the CIP parsers (nightly, cargo-fuzz)"

# Until Ctrl-C; e.g. `make demo DEMO_ARGS="--duration 60"` (see `unskit demo --help`).
DEMO_ARGS ?=
demo: build
	unskit demo $(DEMO_ARGS)

# pytest runs on TEST_WORKERS processes (pytest-xdist), a test file per worker at a time:
# module fixtures (a broker per file) start once, and files never share a process.
TEST_WORKERS ?= 2
test: system-deps build lint wheel
	cargo test -p unskit-core --release
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile

# The unit tier (tests/conftest.py marks it and fails a unit test that reaches the network).
test-unit: build
	$(PY) -m pytest tests -m unit -q

bench: system-deps build
	$(PY) -m pytest benches --benchmark-only -p no:randomly -q
	$(PY) benches/report.py

# The regression gate (CI runs it after `make test`): the subset in benches/check.py, run
# BENCH_RUNS times; fails when a row's median ours/anchor ratio is more than its tolerance
# below benches/baseline.json, or when the baseline is missing or malformed.
BENCH_RUNS ?= 3
bench-check: build
	$(PY) benches/check.py --runs $(BENCH_RUNS)

# Rewrites the baseline's ratios from BENCH_RUNS runs (tolerances kept); review and commit it.
bench-baseline: build
	$(PY) benches/check.py --runs $(BENCH_RUNS) --record

# The demo stack for SOAK_SECS while RSS, fds, threads and SQLite sizes are sampled.
SOAK_SECS ?= 600
soak: system-deps build
	$(PY) benches/soak.py --seconds $(SOAK_SECS)

# Rounds of the chaos suite's faults (tests/chaos) for CHAOS_SECS; the seed is printed so a
# failing schedule can be run again with CHAOS_SEED=N.
CHAOS_SECS ?= 600
ifndef CHAOS_SEED
CHAOS_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
chaos: system-deps build
	@echo "chaos: seed $(CHAOS_SEED) for $(CHAOS_SECS) s (again: make chaos CHAOS_SEED=$(CHAOS_SEED))"
	UNSKIT_CHAOS_SEED=$(CHAOS_SEED) UNSKIT_CHAOS_SECONDS=$(CHAOS_SECS) \
		$(PY) -m pytest tests/chaos -p no:randomly -q

lint: build
	ruff check python tests benches
	ruff format --check python tests benches
	mypy
	$(PY) -m mypy.stubtest unskit._core --allowlist .stubtest-allowlist
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --release -- -D warnings

fmt: venv
	ruff format python tests benches
	ruff check --fix python tests benches
	cargo fmt --all

# FUZZ_SECS per target; needs `rustup toolchain install nightly` and `cargo install cargo-fuzz`.
FUZZ_SECS ?= 60
fuzz:
	cd rust/unskit-core && for t in class1_datagram plan_decode forward_open_reply envelope_decode json_value; do \
		cargo +nightly fuzz run --release $$t -- -max_total_time=$(FUZZ_SECS) -max_len=4096; done

# The Debian packages the build links (libjpeg-turbo), for `make build` and `make demo` alone.
build-deps:
	scripts/install-system-deps --build

system-deps:
	scripts/install-system-deps
	scripts/install-node-peers
	scripts/install-go-peers

venv: $(VENV)/bin/maturin

$(VENV)/bin/maturin:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q 'maturin>=1.9,<2'

# Builds the Rust extension in release mode and installs the package editable with its extras.
# pip's install listing goes to a log, shown only when the build fails.
build: build-deps venv
	@echo "building unskit (Rust extension, release) and installing its dependencies..."
	@# The extension is abi3 (_core.abi3.so): an older per-version build would be imported first.
	@rm -f python/unskit/_core.cpython-*.so
	@maturin develop --release --quiet --extras $(EXTRAS) > $(VENV)/build.log 2>&1 \
		|| { cat $(VENV)/build.log; exit 1; }
	@echo "unskit built and installed in $(VENV)"

# The abi3 wheel (CPython >= 3.11, manylinux x86_64) and the sdist, in DIST; tests/test_wheel.py
# installs the wheel into a fresh virtual environment. Same target directory, profile and
# features as `make build`, so after it nothing is compiled again.
# maturin's repair (bundling libturbojpeg) rewrites cargo's own cdylib in place (maturin
# 1.16): a later build would reuse it, naming a library only the wheel has, so the patched
# output is removed and the next build links it afresh.
DIST ?= dist
CARGO_OUT := $(or $(CARGO_TARGET_DIR),target)/release
wheel: venv
	rm -rf $(DIST)
	maturin sdist --out $(DIST)
	status=0; maturin build --release --out $(DIST) || status=$$?; \
		rm -f $(CARGO_OUT)/lib_core.so $(CARGO_OUT)/deps/lib_core.so; exit $$status

clean:
	cargo clean
	rm -rf $(VENV) $(DIST) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks
