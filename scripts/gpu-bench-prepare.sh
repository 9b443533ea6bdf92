#!/usr/bin/env bash
# Prepares what `scripts/gpu-bench.sh` needs on a lent GPU machine (CUDA 13, no Rust, no
# network, a 64 MiB upload), in DIR (default: .devrun, which .git/info/exclude should name):
#
#   rill.xz           the CLI built with `--features cuda` against CUDA 13 from PyPI
#                     (scripts/cuda-toolkit-pypi.sh), stripped; its kernels for compute
#                     capability CUDA_COMPUTE_CAP (default 90: Hopper, the H100 and H200)
#   llama.cpp.tar.xz  llama.cpp's source from the sdist, without the docs, models, tests and the
#                     other GPU backends
#   gguf-py, models/  the model writer's library, the llama-bpe vocabulary and its template
#
# Then, with the device tool: run `bash scripts/gpu-bench.sh .devrun` carrying `.devrun`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${1:-.devrun}"
mkdir -p "$dir/models/templates"
root="$(bash scripts/cuda-toolkit-pypi.sh)"
src="$(bash scripts/llama-cpp-source.sh)"

echo "gpu-bench-prepare: building rill with CUDA 13 (the first time: about 30 minutes)" >&2
target="${CARGO_TARGET_DIR_CUDA:-$HOME/.cache/rill/target-cuda}"
CUDA_ROOT="$root" PATH="$root/bin:$PATH" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}" \
  CARGO_TARGET_DIR="$target" cargo build --release -p rill-cli --features cuda
strip -o "$dir/rill" "$target/release/rill"
xz -T0 -6 -f "$dir/rill"  # 72 MB stripped, 12 MB packed

name="$(basename "$src")"
excludes=()
for d in docs models media tests examples benches conversion tools/ui; do
  excludes+=("--exclude=$name/$d")
done
for b in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
  excludes+=("--exclude=$name/ggml/src/ggml-$b")
done
tar -C "$(dirname "$src")" -cJf "$dir/llama.cpp.tar.xz" "${excludes[@]}" "$name"

rm -rf "$dir/gguf-py"
cp -r "$src/gguf-py" "$dir/gguf-py"
cp "$src/models/ggml-vocab-llama-bpe.gguf" "$dir/models/"
cp "$src/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja" "$dir/models/templates/"
du -sh "$dir" >&2
