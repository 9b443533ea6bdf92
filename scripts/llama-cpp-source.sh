#!/usr/bin/env bash
# llama.cpp's source (`vendor/llama.cpp` of llama-cpp-python's sdist, the version the tests'
# reference logits come from), unpacked once into the cache for the scripts that build its
# tools (build-llama-bench.sh, build-llama-quantize.sh). Never committed. Idempotent. Prints
# the source folder on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

version=0.3.36
cache="${RILL_CACHE:-$HOME/.cache/rill}"
src="$cache/llama.cpp-src-$version"
# The marker is written last: an unpack cut short starts again.
if [[ -f "$src/.complete" ]]; then
  echo "$src"
  exit 0
fi
sdist="$(bash "$(dirname "${BASH_SOURCE[0]}")/llama-cpp-sdist.sh")"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.source.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$version/vendor/llama.cpp"
rm -rf "$src"
mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp" "$src"
touch "$src/.complete"
echo "$src"
