# A thin list of cargo calls. `make help` lists the targets.
CARGO ?= cargo

.DEFAULT_GOAL := help
.PHONY: help deps check build install dist fault-build mutant-build kit kit-dist containers-inside release test unit integration integration-containers upgrade-drill demo bench bench-proxy bench-prune bench-migrate bench-instructions soak nemesis failover

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## Install what a fresh machine lacks (Debian's mariadb-server, galera-4; Prometheus unpacked into target/tools)
	@scripts/install-deps

check: ## Format, lint (warnings denied; the fault build too), build, check the docs against the code, and check the container backend feature
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --exclude receiver-test-builds --all-targets -- -D warnings
	$(CARGO) clippy -p result-inbox -p receiver -p orbit-sdk -p receiver-test-builds --features receiver/seams --all-targets -- -D warnings
	$(CARGO) build --workspace --exclude receiver-test-builds
	scripts/check-docs
	scripts/import-graph
	$(CARGO) clippy -p testdb -p conformance -p conformance-kit --features conformance/container --all-targets -- -D warnings
	@$(CARGO) tree -p testdb --features container -e normal --prefix none | grep -qx 'bollard v0.21.1' || { echo "testdb's container backend was proven with bollard 0.21.1 (unversioned API paths, which Debian's engine 20.10 accepts): run make integration-containers before changing it, then update this check"; exit 1; }
	@! $(CARGO) tree -p orbit-sdk -e normal --prefix none | grep -Ei '^(sqlx|mysql)' || { echo "orbit-sdk must not depend on a database driver"; exit 1; }
	@! $(CARGO) tree -p orbit-dev -e normal --prefix none | grep -Ei '^(reqwest|orbit-sdk) ' || { echo "orbit-dev (the server) must reach the protocol through orbit-wire, not the SDK's client stack"; exit 1; }
	@! $(CARGO) tree -p result-inbox -e normal --features seams --prefix none | grep -Ei '^(orbit-sdk|reqwest|hyper|h2|http|tungstenite|tokio-tungstenite|axum) ' || { echo "result-inbox (the core) must not depend on the SDK, an HTTP or a WebSocket crate"; exit 1; }

# The test builds are built apart (fault-build, mutant-build): built together with the
# workspace, their crate's feature would reach target/debug/receiver, which the fault suite
# checks is free of every seam.
build: ## Build every crate and binary (but the test builds)
	$(CARGO) build --workspace --exclude receiver-test-builds --bins --examples

release: ## The release receiver binary (target/release/receiver); the fault suite checks it has no barrier
	$(CARGO) build --release -p receiver --bin receiver

# Only `-p receiver-test-builds`: the seams' feature must never be built into the receiver binary.
fault-build: ## The test-only receiver-faults binary (the receiver with fault barriers)
	$(CARGO) build -p receiver-test-builds --bin receiver-faults

mutant-build: ## The test-only receiver-mutant binary (the receiver with one rule broken per RECEIVER_MUTANT)
	$(CARGO) build -p receiver-test-builds --bin receiver-mutant

# KIT_RECEIVER: the receiver under test (a command line); KIT_ARGS, e.g. "--only schema";
# KIT_JOBS: cases (and mutants) at once, 3 by default (each case's timings hold with three at
# once on two cores; 1 on a machine busy with other work).
KIT_RECEIVER ?= target/debug/receiver
KIT_JOBS ?= 3
kit: deps build mutant-build ## The conformance kit against our receiver (every case), then each mutant against the case aimed at it
	$(CARGO) run -q -p conformance-kit --bin conformance -- run --receiver '$(KIT_RECEIVER)' --jobs $(KIT_JOBS) --junit target/kit/report.xml --json target/kit/report.json $(KIT_ARGS)
	$(CARGO) run -q -p conformance-kit --bin conformance -- mutants --receiver-mutant target/debug/receiver-mutant --jobs $(KIT_JOBS) --matrix target/debug/mutant-matrix.json

# PREFIX and DESTDIR as usual: DESTDIR=/tmp/stage puts everything below a staging directory.
PREFIX ?= /usr/local
DESTDIR ?=
install: release ## Install receiver, the schema, the systemd units, the alert rules, the dashboard and the docs below $(DESTDIR)$(PREFIX) (default /usr/local)
	@scripts/dist stage target/install-stage
	PREFIX='$(PREFIX)' DESTDIR='$(DESTDIR)' target/install-stage/install.sh

dist: release ## The release package: target/dist/result-inbox-<version>-x86_64-linux.tar.gz (receiver, units, schema, alerts, dashboard, docs, install.sh) and target/dist/SHA256SUMS
	@scripts/dist package

kit-dist: deps mutant-build ## The kit as a tarball for teams without this repository or Rust: target/dist/result-inbox-kit-<version>-x86_64-linux.tar.gz (the kit, orbit-dev, commit-proxy, the contract, a quick start, the kit build's mutant matrix)
	@scripts/kit-dist

test: deps build fault-build mutant-build release ## Every test: unit tests, every real-server suite (as make integration), then the conformance kit (as make kit)
	$(CARGO) test --workspace --exclude conformance --exclude conformance-kit --exclude fixtures --exclude receiver-test-builds
	$(CARGO) test -p receiver-test-builds
	$(CARGO) test -p testdb --features container --lib
	$(CARGO) test -p conformance-kit -p fixtures --lib --bins
	$(CARGO) test -p conformance --bins
	$(CARGO) test -p conformance-kit -p fixtures --doc
	$(CARGO) run -q -p conformance --bin integration
	@$(MAKE) --no-print-directory kit

unit: ## Only the tests that need no server
	$(CARGO) test --workspace --exclude conformance --exclude conformance-kit --exclude fixtures --exclude receiver-test-builds
	$(CARGO) test -p receiver-test-builds
	$(CARGO) test -p testdb --features container --lib

# Each suite (a module of test-suite/conformance/tests/it) in its own process with its own
# temporary MySQL server, three at a time; a summary table; fails if anything is left behind.
# INTEGRATION_ARGS passes options, e.g. INTEGRATION_ARGS="--only faults,storage".
integration: deps build fault-build mutant-build release ## Every real-server suite in parallel, a summary table, a cleanup check
	$(CARGO) run -q -p conformance --bin integration -- $(INTEGRATION_ARGS)

# The last release's receiver is built from its tag into target/ (only its own crates build).
upgrade-drill: deps build fault-build ## The rolling upgrade from the last release, rehearsed under load, lost COMMIT answers and a killed migrate: on one server and on a Galera cluster (a ledger with 0 violations)
	$(CARGO) run -q -p conformance --bin integration -- --only upgrade

# Under scripts/containers run: Debian's docker.io installed if missing, an isolated engine of
# our own, the local MariaDB image (cached in target/containers), and after the run a proof
# that no process, mount or bridge of the engine is left.
integration-containers: deps build fault-build mutant-build release kit-dist dist ## The suites and the kit again on the container backend (an engine of our own, a local MariaDB image), then the kit's tarball on a clean Debian container, the kit's image and the kit's CI recipe against a service database container, each against our release receiver, then docs/operations.md's walkthrough from the release package on a clean Debian container
	scripts/containers run -- $(MAKE) --no-print-directory containers-inside

# Inside scripts/containers run (DOCKER_HOST, TESTDB_BACKEND=container): the suites, then the
# kit against our receiver on a container server. One feature set for both, so nothing is
# rebuilt between them.
containers-inside:
	$(CARGO) run -q -p conformance --features container --bin integration -- --containers $(INTEGRATION_ARGS)
	$(CARGO) run -q -p conformance-kit --features container --bin conformance -- run --receiver target/debug/receiver --jobs $(KIT_JOBS) --junit target/kit/report-containers.xml
	$(CARGO) test -q -p conformance --features container --test it -- --ignored --exact deploy::the_receiver_image_runs_the_demo_end_to_end --nocapture
	$(CARGO) test -q -p conformance --features container --test it -- --ignored --exact deploy::the_kit_tarball_passes_on_a_clean_debian_with_only_mariadb deploy::the_kit_image_passes_against_a_mounted_receiver deploy::the_ci_recipes_run_against_a_service_database release::the_walkthrough_runs_from_the_release_package_on_a_clean_debian --nocapture --test-threads 1

# SEED replays a schedule (each run prints its own); MINUTES runs random faults for that long
# instead of each kind once. The same checks and summary table as in make integration.
SEED ?=
MINUTES ?=
nemesis: deps build fault-build ## The nemesis on a Galera cluster in network namespaces: SEED=N replays, MINUTES=M runs faults that long (as root)
	NEMESIS_SEED='$(SEED)' NEMESIS_MINUTES='$(MINUTES)' $(CARGO) test -q -p conformance --test it -- --exact nemesis::a_seeded_schedule_of_partitions_pauses_and_kills_leaves_the_ledger_clean_on_every_node --nocapture

demo: deps build ## The whole demo: temporary MySQL, orbit-dev, receiver init and demo
	$(CARGO) run -q -p conformance --bin demo

bench: deps ## All benchmarks, quick mode (about five minutes): canonicalise, apply, backlog drain, proxy relay
	$(CARGO) bench -p result-inbox --bench canonical
	$(CARGO) bench -p conformance --bench apply
	$(CARGO) bench -p conformance --bench group
	$(CARGO) build --release -p orbit-dev -p receiver --bins
	$(CARGO) bench -p conformance --bench drain
	$(CARGO) bench -p commit-proxy --bench relay

soak: deps ## On demand, not in make test: 100,000 deliveries through receiver consume; RSS and FD slopes of both processes, the ledger (about 10 minutes)
	$(CARGO) build --release -p orbit-dev -p receiver --bins
	$(CARGO) bench -p conformance --bench soak

bench-prune: deps ## receiver prune beside a full-speed receiver consume: a million old inbox rows, drains with and without it (about 5 minutes)
	$(CARGO) build --release -p orbit-dev -p receiver --bins
	$(CARGO) bench -p conformance --bench prune

bench-migrate: deps ## receiver migrate's index step on a million-row inbox, alone and beside a full-speed receiver consume (about 5 minutes)
	$(CARGO) build --release -p orbit-dev -p receiver --bins
	$(CARGO) bench -p conformance --bench migrate

bench-instructions: ## Instructions per byte of the canonical form under valgrind's callgrind (repeatable; about a minute)
	@scripts/bench-instructions

bench-proxy: deps ## commit-proxy relay overhead: direct vs TCP forwarder vs proxy, one run
	$(CARGO) bench -p commit-proxy --bench relay

# FAILOVER_SEED replays a schedule (each run prints its own); MINUTES runs random faults for
# that long instead of each kind once.
failover: deps build ## The failover suite's schedule on a primary and two replicas (lossless semi-sync, the gate): SEED=N replays, MINUTES=M runs faults that long
	FAILOVER_SEED='$(SEED)' FAILOVER_MINUTES='$(MINUTES)' $(CARGO) test -q -p conformance --test it -- --exact failover::failovers_under_lossless_semi_sync_with_the_gate_lose_no_acked_event --nocapture
