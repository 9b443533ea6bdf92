#!/usr/bin/env bash
# Build llama.cpp's own C++ tools, the reference BENCHMARKS.md measures against: `llama-bench`,
# `llama-batched-bench`, `llama-quantize` and `llama-mtmd-cli` (images), from the llama.cpp source inside
# llama-cpp-python's sdist on PyPI (the same version the tests' reference logits come from),
# with `-DGGML_NATIVE=ON` for this machine's CPU. cmake and ninja come from pip. Built once into
# the cache (a few minutes on two cores); never committed, never run by CI.
#
# Some VMs list AMX among their CPU flags but fault on its instructions: there the native
# build dies with SIGILL in its repacked-weights path on every model. The tools are tried on
# the test model once built, and where they die so, built again for this CPU without AMX
# (every other instruction set the CPU lists kept), so that llama.cpp runs at its best.
# Idempotent. Prints the folder holding the four binaries on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

version=0.3.36
cache="${RILL_CACHE:-$HOME/.cache/rill}/llama-bench-$version"
bin="$cache/build/bin"
here="$(dirname "${BASH_SOURCE[0]}")"

# Whether the built llama-bench runs a token of the test model (exit 132: SIGILL).
runs() {
  local model
  model="$(bash "$here/fetch-test-model.sh")"
  "$bin/llama-bench" -m "$model" -t 1 -p 8 -n 1 -r 1 >/dev/null 2>&1
}

build() {
  local src
  src="$(bash "$here/llama-cpp-source.sh")"
  # shellcheck source=cmake-ninja.sh
  source "$here/cmake-ninja.sh"
  echo "building llama-bench, llama-batched-bench, llama-quantize and llama-mtmd-cli (a few minutes) ..." >&2
  cmake -S "$src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF "$@" >&2
  cmake --build "$cache/build" --target llama-bench llama-batched-bench llama-quantize llama-mtmd-cli >&2
}

# The CPU's instruction sets as ggml's options, AMX left out.
without_amx() {
  local flags opts=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  flags="$(grep -m1 '^flags' /proc/cpuinfo)"
  local pair
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
    avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ " $flags " == *" ${pair%%:*} "* ]]; then opts+=("-DGGML_${pair#*:}=ON"); fi
  done
  printf '%s\n' "${opts[@]}"
}

if [[ -x "$bin/llama-bench" && -x "$bin/llama-batched-bench" && -x "$bin/llama-quantize" \
  && -x "$bin/llama-mtmd-cli" ]] && runs; then
  echo "$bin"
  exit 0
fi
if [[ ! -x "$bin/llama-bench" || ! -x "$bin/llama-mtmd-cli" ]]; then
  build -DGGML_NATIVE=ON
fi
if ! runs; then
  echo "llama-bench dies on this CPU (listed AMX that faults?): building it again without AMX ..." >&2
  rm -rf "$cache/build"
  mapfile -t opts < <(without_amx)
  build "${opts[@]}"
  runs || { echo "llama-bench still does not run on this CPU" >&2; exit 1; }
fi
echo "$bin"
