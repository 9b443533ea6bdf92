# Sourced by the scripts that build llama.cpp's tools: puts cmake and ninja on the PATH, the
# system's where it has them, else pip's (installed for this user, whose scripts folders go on
# the PATH).
# shellcheck source=python.sh
source "$(dirname "${BASH_SOURCE[0]}")/python.sh" "build llama.cpp's tools"
scripts="$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
export PATH="$PATH:$scripts:$HOME/.local/bin"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  "$py" -m pip install --quiet --disable-pip-version-check cmake ninja >&2 ||
    "$py" -m pip install --quiet --disable-pip-version-check --break-system-packages cmake ninja >&2
fi
