# Gatehouse: `make run` starts it on the example config; `make test` runs
# every test. Both install what they need first.

BIN := target/release/gatehouse
CONFIG ?= examples/gatehouse.yaml

.PHONY: all deps build run test lint unit e2e bench fuzz soak clean

all: build

deps:
	@./scripts/install-deps.sh
	@./scripts/quiche-src.sh
	@./scripts/boringssl-src.sh

build: deps
	cargo build --release --workspace
	cd tools/h3get && go build -o ../../target/h3get . && go build -o ../../target/h3load ./h3load && go build -o ../../target/pathsim ./pathsim

run: build
	$(BIN) run -c $(CONFIG)

# The house rules (format, lints), unit tests beside the code, then
# end-to-end tests with real processes. Everything is built in release mode
# once (BoringSSL is slow to build).
test: build lint
	cargo test --release --workspace
	cd tools/h3get && go vet ./... && go test ./...
	python3 -m pytest -v -p no:cacheprovider tests/house
	python3 -m pytest -v -p no:cacheprovider tests/e2e

lint: deps
	cargo fmt --all --check
	python3 scripts/import-cycles.py
	cargo clippy --release --workspace --all-targets -- -D warnings

unit: build
	cargo test --release --workspace
	cd tools/h3get && go vet ./... && go test ./...

e2e: build
	python3 -m pytest -v -p no:cacheprovider tests/e2e

bench: build
	@./scripts/install-deps.sh --bench
	bench/run.sh

# Coverage-guided fuzzing of every target under AFL++ (FUZZ_MINUTES each,
# default 5; FUZZ_JOBS at a time). Not part of `make test`, which replays
# the corpora instead.
fuzz:
	@./scripts/install-deps.sh --fuzz
	@./scripts/quiche-src.sh
	@./scripts/boringssl-src.sh
	python3 scripts/fuzz.py

# Thirty minutes of every kind of traffic through one Gatehouse under
# faults (SOAK_MINUTES to change it); writes its report and plots into
# docs/RELIABILITY.md. Not part of `make test`.
soak: build
	@./scripts/install-deps.sh --soak
	cd tools/h3get && go build -o ../../target/soakload ./soakload
	python3 tests/soak/soak.py

clean:
	cargo clean
