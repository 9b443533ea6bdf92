#!/usr/bin/env bash
# Fetch llama.cpp's test assets: the vocab-only GGUFs of its tokenizers with their test strings
# and expected ids (`ggml-vocab-*.gguf` + `.inp` / `.out`), and its real chat templates
# (`templates/*.jinja`). They ship inside llama-cpp-python's sdist on PyPI (no Hugging Face
# needed); only `vendor/llama.cpp/models/` is unpacked. Cached once, never committed.
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

py="$(command -v python3 || command -v python || true)"
if [[ -z "$py" ]]; then
  echo "error: python3 with pip is needed to fetch llama.cpp's test assets" >&2
  exit 1
fi
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetching llama.cpp's test assets from PyPI (llama-cpp-python==$version, 77 MB) ..." >&2
if ! "$py" -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$tmp" "llama-cpp-python==$version" >&2; then
  echo "error: could not download llama-cpp-python==$version from PyPI (offline?)" >&2
  exit 1
fi
sdist="$(ls "$tmp"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1)"
if [[ -z "$sdist" ]]; then
  echo "error: pip returned no sdist for llama-cpp-python==$version" >&2
  exit 1
fi
tar -xzf "$sdist" -C "$tmp" --wildcards "llama_cpp_python-$version/vendor/llama.cpp/models/*"
rm -rf "$cache/llama.cpp"
mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp" "$cache/llama.cpp"
touch "$cache/.complete"
echo "$models"
