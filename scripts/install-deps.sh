#!/usr/bin/env bash
# Installs what building and testing Rill needs on Debian/Ubuntu, and says what it installs.
# Safe to run again: present packages are skipped.
set -euo pipefail

need_apt=(build-essential pkg-config curl wget file ca-certificates python3 python3-pip
  # the desktop app (Tauri 2 on WebKitGTK)
  libwebkit2gtk-4.1-dev libgtk-3-dev libxdo-dev libssl-dev libayatana-appindicator3-dev librsvg2-dev
  # the UI build and its tests
  nodejs chromium
  # the real window under test: a virtual display and WebKitWebDriver
  xvfb xauth webkit2gtk-driver)

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi

if command -v dpkg >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  missing=()
  for p in "${need_apt[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  # Debian's nodejs comes without npm; NodeSource's brings its own (and conflicts with Debian's).
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if ((${#missing[@]})); then
    echo "install-deps: installing Debian packages: ${missing[*]}"
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
  fi
else
  echo "install-deps: not a Debian/Ubuntu system; make sure these are installed: ${need_apt[*]}" >&2
fi

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: installing the Rust toolchain with rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  export PATH="$HOME/.cargo/bin:$PATH"
fi
# The window tests drive the real app through tauri-driver (stay on 2.x: crates.io's newest is
# a 3.0 alpha) and selenium.
if ! command -v tauri-driver >/dev/null 2>&1; then
  echo "install-deps: installing tauri-driver 2 with cargo (about 90 s)"
  cargo install --locked tauri-driver --version '^2'
fi
if ! python3 -c "import selenium" >/dev/null 2>&1; then
  echo "install-deps: installing selenium for python3"
  python3 -m pip install --quiet selenium || python3 -m pip install --quiet --break-system-packages selenium
fi
# gguf-py (llama.cpp's GGUF writer, with numpy) writes the test models of each family.
if ! python3 -c "import gguf, numpy" >/dev/null 2>&1; then
  echo "install-deps: installing gguf (gguf-py) and numpy for python3"
  python3 -m pip install --quiet "gguf==0.19.0" numpy ||
    python3 -m pip install --quiet --break-system-packages "gguf==0.19.0" numpy
fi
# The official OpenAI client and a JSON Schema validator, for the API tests (tests/api_openai.py).
if ! python3 -c "import openai, jsonschema" >/dev/null 2>&1; then
  echo "install-deps: installing openai and jsonschema for python3"
  python3 -m pip install --quiet "openai>=1.50" jsonschema ||
    python3 -m pip install --quiet --break-system-packages "openai>=1.50" jsonschema
fi
echo "install-deps: ready ($(cargo --version), node $(node --version))"
