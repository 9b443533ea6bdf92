#!/usr/bin/env bash
# Fetch llama.cpp's test assets: the vocab-only GGUFs of its tokenizers with their test strings
# and expected ids (`ggml-vocab-*.gguf` + `.inp` / `.out`), and its real chat templates
# (`templates/*.jinja`). They ship inside llama-cpp-python's sdist on PyPI (no Hugging Face
# needed; `llama-cpp-sdist.sh` fetches it); only `vendor/llama.cpp/models/` is unpacked.
# Cached once, never committed.
# Idempotent. Prints the models folder on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

version=0.3.36
cache="${RILL_CACHE:-$HOME/.cache/rill}/llama-cpp-python-$version"
models="$cache/llama.cpp/models"
# The marker is written last: a fetch cut short starts again.
if [[ -f "$cache/.complete" ]]; then
  echo "$models"
  exit 0
fi

sdist="$(bash "$(dirname "${BASH_SOURCE[0]}")/llama-cpp-sdist.sh")"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp" --wildcards "llama_cpp_python-$version/vendor/llama.cpp/models/*"
rm -rf "$cache/llama.cpp"
mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp" "$cache/llama.cpp"
touch "$cache/.complete"
echo "$models"
