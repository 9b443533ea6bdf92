#!/usr/bin/env bash
# `make check-cuda`: keeps the GPU build honest on a machine without a GPU. Type-checks the CLI
# with candle's CUDA backend, which compiles candle's CUDA kernels to PTX with nvcc on the way.
#
# The toolkit is Debian's: `nvidia-cuda-toolkit` (11.8 on bookworm) from contrib/non-free, which
# this script enables when it is missing. PyPI's nvcc wheels hold ptxas only, not nvcc. nvcc 11.8
# refuses GCC newer than 11, so GCC 11 comes too and is passed with `-ccbin` (through nvcc's own
# NVCC_PREPEND_FLAGS, so every nvcc that candle's build scripts run gets it). Without nvidia-smi
# the compute capability cannot be asked: CUDA_COMPUTE_CAP defaults to 80 (Ampere).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi

if ! command -v nvcc >/dev/null 2>&1 || ! command -v gcc-11 >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "check-cuda: install the CUDA toolkit (nvcc) and GCC 11 first" >&2
    exit 1
  fi
  # Debian's deb822 sources (bookworm) or a classic sources.list: add contrib and non-free.
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    "${sudo_cmd[@]}" sed -i -E \
      's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
      /etc/apt/sources.list.d/debian.sources
  elif [[ -f /etc/apt/sources.list ]] && grep -qE '^deb .*debian.* main$' /etc/apt/sources.list; then
    "${sudo_cmd[@]}" sed -i -E 's/^(deb .*debian.* main)$/\1 contrib non-free non-free-firmware/' \
      /etc/apt/sources.list
  fi
  echo "check-cuda: installing nvidia-cuda-toolkit and gcc-11 (about 2 GB)"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    nvidia-cuda-toolkit gcc-11 g++-11
fi

export PATH="$HOME/.cargo/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"
export NVCC_PREPEND_FLAGS="${NVCC_PREPEND_FLAGS:--ccbin gcc-11}"
echo "check-cuda: $(nvcc --version | tail -1), compute capability $CUDA_COMPUTE_CAP"
cargo check -p rill-cli --features cuda
