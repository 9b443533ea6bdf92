#!/usr/bin/env bash
# Fetch llama.cpp's test assets: the vocab-only GGUFs of its tokenizers with their test strings
# and expected ids (`ggml-vocab-*.gguf` + `.inp` / `.out`), and its real chat templates
# (`templates/*.jinja`). They are the `models/` folder of llama.cpp's source inside
# llama-cpp-python's sdist on PyPI (no Hugging Face needed; `llama-cpp-source.sh` unpacks it).
# Cached once, never committed.
# Idempotent. Prints the models folder on stdout.
#
#   RILL_CACHE   where the cache lives (default: ~/.cache/rill)
set -euo pipefail

src="$(bash "$(dirname "${BASH_SOURCE[0]}")/llama-cpp-source.sh")"
echo "$src/models"
