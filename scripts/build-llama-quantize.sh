#!/usr/bin/env bash
# Build llama.cpp's quantiser, `llama-quantize`, which `make-test-models.py` runs to write the
# test models' K-quant files (Q4_K_M) as llama.cpp itself writes them. Built portable: no SIMD
# options and no fused multiply-adds (`-ffp-contract=off`), so that its reference
# quantisation, plain C, gives the same bytes on every x86-64 or ARM machine, and the files
# keep the SHA-256 their recorded reference logits are tied to. Built once into the cache (a
# few minutes on two cores; CI builds it too); never committed.
# Idempotent. Prints the binary's path on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

version=0.3.36
cache="${RILL_CACHE:-$HOME/.cache/rill}/llama-quantize-$version"
bin="$cache/build/bin/llama-quantize"
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

src="$(bash "$(dirname "${BASH_SOURCE[0]}")/llama-cpp-source.sh")"
# shellcheck source=cmake-ninja.sh
source "$(dirname "${BASH_SOURCE[0]}")/cmake-ninja.sh"
echo "building llama-quantize, portable (a few minutes) ..." >&2
flags="-ffp-contract=off"
cmake -S "$src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DGGML_NATIVE=OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX_VNNI=OFF \
  -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_AVX512=OFF -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$cache/build" --target llama-quantize >&2
echo "$bin"
