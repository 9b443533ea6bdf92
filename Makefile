# Rill's two everyday commands (README.md): `make run` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)


TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
RILL := $(TARGET_DIR)/release/rill

.PHONY: run test deps model build bench fmt lint

deps:
	@bash scripts/install-deps.sh

model:
	@bash scripts/fetch-test-model.sh >/dev/null

build: deps
	cargo build --release -p rill-cli

# Until the desktop app lands, `make run` opens a terminal chat on the test model.
run: build model
	$(RILL) chat --model "$$(bash scripts/fetch-test-model.sh)"

# Every test: unit tests, the engine on the real model, the CLI end to end.
test: deps model
	cargo test --workspace --all-targets

bench: build model
	$(RILL) bench --model "$$(bash scripts/fetch-test-model.sh)" --threads 2

fmt:
	cargo fmt --all

lint:
	cargo clippy --workspace --all-targets -- -D warnings
