#!/usr/bin/env bash
# Keeps a long-lived cargo target dir bounded. Cargo never deletes an old build: every change to a
# test crate leaves its previous test binary behind (hundreds of MB each), and incremental caches
# pile up, until the disk is full and the linker dies of SIGBUS. This removes, under each
# `deps/` folder, every executable that a newer one of the same name has replaced, and the
# incremental caches when they pass a size. What it removes, cargo rebuilds when it needs it.
#
# Usage: scripts/prune-target.sh [TARGET_DIR]   (default: $CARGO_TARGET_DIR)
set -euo pipefail

dir="${1:-${CARGO_TARGET_DIR:-}}"
if [[ -z "$dir" || ! -d "$dir" ]]; then
    echo "prune-target: no target dir to prune (${dir:-unset})"
    exit 0
fi
before=$(du -sm "$dir" | cut -f1)

# Executables are named NAME-HASH (16 hex digits), beside NAME-HASH.d. Newest first, keep the
# first of each NAME.
find "$dir" -path '*/deps/*' -type f -perm -u+x -regextype posix-extended \
    -regex '.*/[^/]+-[0-9a-f]{16}' -printf '%T@ %p\n' |
    sort -rn | cut -d' ' -f2- |
    {
    declare -A seen
    while read -r path; do
        name="$(dirname "$path")/$(basename "$path" | sed -E 's/-[0-9a-f]{16}$//')"
        if [[ -n "${seen[$name]:-}" ]]; then
            rm -f "$path" "$path.d"
        fi
        seen[$name]=1
    done
    }

# Incremental caches help a developer's next edit, not a clean clone's build: drop them past 2 GB.
find "$dir" -maxdepth 3 -type d -name incremental | while read -r inc; do
    if (($(du -sm "$inc" | cut -f1) > 2048)); then
        rm -rf "$inc"
    fi
done

after=$(du -sm "$dir" | cut -f1)
echo "prune-target: $dir ${before} MB -> ${after} MB"
