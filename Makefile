# Rill's two everyday commands (README.md): `make run` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# One debug build serves `make run` and `make test`: dependencies are optimised in the dev
# profile (Cargo.toml), so the model runs at full speed without a second, release build.
# Always the whole workspace with all targets, so cargo unifies features the same way each
# time and never rebuilds candle or tauri because a different subset was asked for.
RILL := $(TARGET_DIR)/debug/rill
APP := $(TARGET_DIR)/debug/rill-app

.PHONY: run test deps model fixtures ui build bench fmt lint bundle test-layers test-rust test-ui test-e2e test-arm check-cuda

deps:
	@bash scripts/install-deps.sh

model:
	@bash scripts/fetch-test-model.sh >/dev/null

# llama.cpp's tokenizer test vocabularies and chat templates (from llama-cpp-python's sdist),
# and the test models of each family written from them (seeded random weights, gguf-py).
fixtures:
	@bash scripts/fetch-llama-cpp-assets.sh >/dev/null
	@python3 scripts/make-test-models.py >/dev/null
	@python3 scripts/make-test-projectors.py >/dev/null

# The web UI: dependencies from package-lock.json, then a production build into ui/dist,
# which the app embeds when it is compiled.
ui: deps
	@if [[ ! -d ui/node_modules ]] || [[ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]]; then npm --prefix ui ci --no-audit --no-fund; fi
	npm --prefix ui run build

build: deps ui
	cargo build --workspace --all-targets

# Opens the desktop app. With no model on this machine yet, the test model (SmolLM2-135M) is
# fetched and registered where it lies, so the first launch can chat at once.
run: build model
	@if ! $(RILL) models list --json | grep -q '"path"'; then $(RILL) models import "$$(bash scripts/fetch-test-model.sh)"; fi
	$(APP)

# Every test: Rust unit and integration tests (engine on the real model, store, CLI, API),
# the UI's component tests, the built UI in chromium, and the real app end to end.
test: deps model fixtures ui test-layers test-rust test-ui test-e2e

# Each crate's modules import downward only: no circle (docs/architecture.md, "Layers").
test-layers:
	python3 scripts/check-layers.py

test-rust:
	cargo test --workspace --all-targets

test-ui:
	npm --prefix ui test
	npm --prefix ui run test:browser

test-e2e:
	cargo build --workspace --all-targets
	xvfb-run -a -s "-screen 0 1280x800x24" python3 tests/e2e_app.py $(APP) "$$(bash scripts/fetch-test-model.sh)"

# Installers: the deb bundle builds here; AppImage, msi and dmg on their platforms (README).
# The tauri CLI comes from npm (ui/node_modules); it runs the UI build itself.
bundle: deps ui
	ui/node_modules/.bin/tauri build --bundles deb

bench: build model
	$(RILL) bench --model "$$(bash scripts/fetch-test-model.sh)" --threads 2

# The engine's unit tests (NEON kernels included) for 64-bit ARM under qemu-user; not in `test`.
test-arm:
	bash scripts/test-aarch64.sh

# The CUDA build, checked without a GPU: Debian's CUDA toolkit and candle's kernels compiled to
# PTX (scripts/check-cuda.sh installs what is missing); not in `test`.
check-cuda:
	bash scripts/check-cuda.sh

fmt:
	cargo fmt --all

lint:
	cargo clippy --workspace --all-targets -- -D warnings
