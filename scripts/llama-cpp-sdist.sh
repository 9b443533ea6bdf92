#!/usr/bin/env bash
# llama-cpp-python's sdist from PyPI, which carries llama.cpp's source, test vocabularies and
# chat templates (`vendor/llama.cpp/`). Downloaded once into the cache, for
# `llama-cpp-source.sh` to unpack. Idempotent. Prints the tarball's path on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

version=0.3.36
cache="${RILL_CACHE:-$HOME/.cache/rill}"
sdist="$cache/llama_cpp_python-$version.tar.gz"
if [[ -f "$sdist" ]]; then
  echo "$sdist"
  exit 0
fi

# shellcheck source=python.sh
source "$(dirname "${BASH_SOURCE[0]}")/python.sh" "fetch llama-cpp-python's sdist"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.sdist.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetching llama-cpp-python==$version's sdist from PyPI (77 MB) ..." >&2
if ! "$py" -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$tmp" "llama-cpp-python==$version" >&2; then
  echo "error: could not download llama-cpp-python==$version from PyPI (offline?)" >&2
  exit 1
fi
got="$(ls "$tmp"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1)"
if [[ -z "$got" ]]; then
  echo "error: pip returned no sdist for llama-cpp-python==$version" >&2
  exit 1
fi
# Renamed into place last: a download cut short leaves no file that looks whole.
mv "$got" "$sdist"
echo "$sdist"
