#!/usr/bin/env bash
# Build llama.cpp's own C++ tools, the reference BENCHMARKS.md measures against: `llama-bench`,
# `llama-batched-bench` and `llama-quantize`, from the llama.cpp source inside
# llama-cpp-python's sdist on PyPI (the same version the tests' reference logits come from),
# with `-DGGML_NATIVE=ON` for this machine's CPU. cmake and ninja come from pip. Built once into
# the cache (a few minutes on two cores); never committed, never run by CI.
# Idempotent. Prints the folder holding the three binaries on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

version=0.3.36
cache="${RILL_CACHE:-$HOME/.cache/rill}/llama-bench-$version"
bin="$cache/build/bin"
if [[ -x "$bin/llama-bench" && -x "$bin/llama-batched-bench" && -x "$bin/llama-quantize" ]]; then
  echo "$bin"
  exit 0
fi

src="$(bash "$(dirname "${BASH_SOURCE[0]}")/llama-cpp-source.sh")"
# shellcheck source=cmake-ninja.sh
source "$(dirname "${BASH_SOURCE[0]}")/cmake-ninja.sh"
echo "building llama-bench, llama-batched-bench and llama-quantize (a few minutes) ..." >&2
cmake -S "$src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$cache/build" --target llama-bench llama-batched-bench llama-quantize >&2
echo "$bin"
