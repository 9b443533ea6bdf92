# Sourced by the scripts that need pip: sets `py` to python3 (or python), or stops with an
# error naming what it was needed for (the first argument).
py="$(command -v python3 || command -v python || true)"
if [[ -z "$py" ]]; then
  echo "error: python3 with pip is needed to $1" >&2
  exit 1
fi
