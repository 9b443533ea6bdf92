#!/usr/bin/env bash
# Runs on a lent GPU machine (CUDA 13, no Rust, no network): Rill's CUDA build against
# llama.cpp's CUDA build on the same 1B-shape files, as BENCHMARKS.md records them.
#
#   bash scripts/gpu-bench.sh DIR
#
# DIR was prepared here by `scripts/gpu-bench-prepare.sh`: `rill` built with `--features cuda`
# against CUDA 13 (scripts/cuda-toolkit-pypi.sh), llama.cpp's source trimmed to what a CUDA build
# needs, gguf-py and the llama-bpe vocabulary for the model writer. The machine writes the
# models itself (numpy is there), builds llama.cpp for its own GPU only, and runs both engines
# in turn on a quiet machine. Logs go to $OUT (default: DIR/out).
set -uo pipefail

dir="$(cd "$1" && pwd)"
out="${OUT:-$dir/out}"
mkdir -p "$out"
work=/tmp/rill-gpu
mkdir -p "$work/models"
log() { echo "== $(date +%T) $*" | tee -a "$out/summary.txt"; }

log "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv | tee -a "$out/summary.txt"
nvcc --version | tail -1 | tee -a "$out/summary.txt"
nproc | tee -a "$out/summary.txt"

# The CUDA 13 libraries rill was linked against (cuBLAS, cuRAND, NVRTC, cudart), wherever this
# machine keeps them.
libs="$(find / \( -path /proc -o -path /sys -o -path "$work" \) -prune -o \( -name libcublas.so.13 \
  -o -name libcublasLt.so.13 -o -name libcudart.so.13 -o -name libcurand.so.10 \
  -o -name libnvrtc.so.13 \) -print 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)"
echo "CUDA libraries: $libs" | tee -a "$out/summary.txt"
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rill="$work/rill"
xz -dc "$dir/rill.xz" >"$rill"
chmod +x "$rill"
ldd "$rill" | grep -E "cuda|cublas|curand|nvrtc|not found" | tee -a "$out/summary.txt"

log "building llama.cpp for this GPU (background)"
src="$work/llama.cpp"
mkdir -p "$src"
tar -C "$src" --strip-components=1 -xJf "$dir/llama.cpp.tar.xz"
cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
(
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$cc" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CUDA_NCCL=OFF &&
    cmake --build "$src/build" -j "$(nproc)" --target llama-bench llama-batched-bench llama-quantize
) >"$out/llama-build.log" 2>&1 &
build=$!

log "writing the 1B-shape Q4_0 model"
PYTHONPATH="$dir/gguf-py" python3 - "$dir" "$work/models" <<'EOF' 2>&1 | tail -3 | tee -a "$out/summary.txt"
import importlib.util, sys
from pathlib import Path
root = Path.cwd()
spec = importlib.util.spec_from_file_location("mb", root / "scripts/make-bench-models.py")
mb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mb)
import gguf
print(mb.write("llama", gguf.GGMLQuantizationType.Q4_0, Path(sys.argv[2]), Path(sys.argv[1]) / "models"))
EOF
q40="$work/models/llama-1b.Q4_0.gguf"

log "rill, smoke test on cuda (llama.cpp still building)"
timeout 120 "$rill" run --model "$q40" --device cuda --max-tokens 16 --temperature 0 \
  --prompt "Once upon a time" 2>&1 | tail -5 | tee -a "$out/summary.txt"

log "waiting for llama.cpp's build"
wait "$build"
echo "llama.cpp build exit: $?" | tee -a "$out/summary.txt"
tail -3 "$out/llama-build.log" | tee -a "$out/summary.txt"
bin="$src/build/bin"
q4km="$work/models/llama-1b.Q4_K_M.gguf"
"$bin/llama-quantize" --allow-requantize "$q40" "$q4km" Q4_K_M >"$out/quantize.log" 2>&1 ||
  echo "quantize failed" | tee -a "$out/summary.txt"

for m in "$q40" "$q4km"; do
  [[ -f "$m" ]] || continue
  name="$(basename "$m" .gguf)"
  log "rill bench $name: one stream, pp512 tg128"
  timeout 180 "$rill" bench --model "$m" --device cuda --prompt-tokens 512 --gen-tokens 128 \
    2>&1 | tail -25 | tee -a "$out/summary.txt"
  log "rill bench $name: 4 streams"
  timeout 180 "$rill" bench --model "$m" --device cuda --prompt-tokens 512 --gen-tokens 128 \
    --streams 4 2>&1 | tail -25 | tee -a "$out/summary.txt"
  log "llama-bench $name"
  timeout 180 "$bin/llama-bench" -m "$m" -ngl 99 -p 512 -n 128 -r 3 -fa 0,1 -o md 2>&1 |
    grep -E "^\|" | tee -a "$out/summary.txt"
  log "llama-batched-bench $name"
  timeout 180 "$bin/llama-batched-bench" -m "$m" -ngl 99 -c 4096 -npp 512 -ntg 128 -npl 1,4 \
    2>&1 | grep -E "^\|" | tee -a "$out/summary.txt"
done
log "done"
