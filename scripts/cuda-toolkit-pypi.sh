#!/usr/bin/env bash
# Assembles a CUDA 13.0 toolkit from NVIDIA's PyPI wheels into a cache, for building a `--features
# cuda` binary that runs on a machine with a CUDA 13 driver (the GPU machines this project is lent
# have CUDA 13 and no Rust toolchain, so the binary is built here and carried there).
#
# Debian's nvidia-cuda-toolkit (11.8, what `make check-cuda` uses) links the binary against CUDA 11
# libraries that such a machine does not have. The cu13 wheels hold nvcc with its nvvm, the
# headers, and the cudart/cuBLAS/cuRAND/NVRTC libraries; they hold no libcuda (the driver's), so a
# link-time stub is made from the driver functions cudarc declares. The real libcuda.so.1 is the
# GPU machine's.
#
# Prints the toolkit's root: CUDA_ROOT for cudarc's build, its bin/ on PATH for nvcc.
set -euo pipefail

root="${RILL_CUDA13:-$HOME/.cache/rill/cuda13}"
if [[ -x "$root/bin/nvcc" && -f "$root/lib64/stubs/libcuda.so" ]]; then
  echo "$root"
  exit 0
fi

wheels="$root.wheels"
mkdir -p "$wheels"
echo "cuda-toolkit-pypi: downloading CUDA 13.0 wheels (about 800 MB)" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 -d "$wheels" \
  "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88" \
  "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cccl==13.0.85" "nvidia-cuda-nvrtc==13.0.88" \
  "nvidia-cublas==13.0.2.14" "nvidia-curand==10.4.5.25" >&2

unpacked="$root.unpacked"
rm -rf "$unpacked"
mkdir -p "$unpacked"
for w in "$wheels"/*.whl; do
  python3 -m zipfile -e "$w" "$unpacked"
done
chmod +x "$unpacked"/nvidia/cu13/bin/* "$unpacked"/nvidia/cu13/nvvm/bin/* 2>/dev/null || true

rm -rf "$root"
mv "$unpacked/nvidia/cu13" "$root"
rm -rf "$unpacked"

# Linkers look for the unversioned names.
mkdir -p "$root/lib64/stubs"
for so in "$root"/lib/*.so.*; do
  base="$(basename "$so")"
  ln -sf "../lib/$base" "$root/lib64/$base"
  ln -sf "../lib/$base" "$root/lib64/${base%%.so.*}.so"
done

# libcuda's stub: every driver function cudarc's bindings declare, with the real SONAME.
cudarc_src="$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.10 | head -1)"
grep -oE 'fn cu[A-Za-z0-9_]+\(' "$cudarc_src/src/driver/sys/mod.rs" | sed -E 's/fn (.*)\(/\1/' |
  sort -u | sed -E 's/(.*)/void \1(void) {}/' >"$root/lib64/stubs/libcuda-stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$root/lib64/stubs/libcuda.so" \
  "$root/lib64/stubs/libcuda-stub.c"
echo "$root"
