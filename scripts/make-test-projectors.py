#!/usr/bin/env python3
"""Writes small vision projector files (`mmproj` GGUFs, llama.cpp's `clip` architecture) with
seeded random weights, in the layout llama.cpp's converter writes for the real models
(`conversion/gemma.py`, `Gemma3VisionModel`), so that Rill and llama.cpp's `mtmd` read the same
file (issue 42):

    python3 scripts/make-test-projectors.py [--out DIR] [--force]

- `gemma3-mmproj-test.F16.gguf`: Gemma 3's SigLIP encoder and projector: a 224×224 image in
  patches of 14 (16×16 patches), three layers 96 wide (4 heads of 24, a GELU feed-forward 200
  wide), the patches average-pooled 4×4 into 16 image tokens, RMS-normalised and projected to
  the width of `gemma3-test` (128). The patch and position embeddings are F32 and the other
  matrices F16, as the converter writes them (it forces `.embeddings.` to F32 and the input
  projection to F16); 200 is not a multiple of 32, as the real 4,304 is not.

The same seed gives the same bytes, so the reference embeddings recorded from llama.cpp
(`scripts/record-reference-images.py`) stay tied to each file by its SHA-256.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent

F16 = gguf.GGMLQuantizationType.F16
F32 = gguf.GGMLQuantizationType.F32

# SigLIP's shape, small: image side, patch side, width, heads, feed-forward, layers, and the
# side of the pooling window (Gemma 3's 4: 64×64 patches become 16×16 tokens).
GEMMA3 = dict(image=224, patch=14, width=96, heads=4, ff=200, layers=3, merge=4, text=128)


def gemma3(path: Path):
    s = GEMMA3
    rng = np.random.default_rng(4321)
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "clip")
    w.add_name("Gemma 3 vision test projector (random weights)")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    w.add_vision_image_size(s["image"])
    w.add_vision_patch_size(s["patch"])
    w.add_vision_embedding_length(s["width"])
    w.add_vision_feed_forward_length(s["ff"])
    w.add_vision_block_count(s["layers"])
    w.add_vision_head_count(s["heads"])
    w.add_vision_projection_dim(s["text"])
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_use_gelu(True)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    n_side = s["image"] // s["patch"]
    # The default pooling is 4; the converter writes the factor only when it differs, as here
    # it does not, so the key is left out and the default is what both engines must take.
    width, ff = s["width"], s["ff"]

    def normal(shape, std, mean=0.0):
        return (np.float32(mean) + rng.standard_normal(shape, dtype=np.float32)
                * np.float32(std)).astype(np.float32)

    def tensor(name, data, qtype):
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    # Patch embedding as a convolution's kernel [width, 3, patch, patch]: each patch's 588
    # pixel values in, unit-scale rows out.
    k = 3 * s["patch"] * s["patch"]
    tensor("v.patch_embd.weight", normal((width, 3, s["patch"], s["patch"]), 1 / np.sqrt(k)), F32)
    tensor("v.patch_embd.bias", normal((width,), 0.1), F32)
    tensor("v.position_embd.weight", normal((n_side * n_side, width), 0.5), F32)
    for i in range(s["layers"]):
        p = f"v.blk.{i}"
        for part in ("ln1", "ln2"):
            tensor(f"{p}.{part}.weight", normal((width,), 0.1, 1.0), F32)
            tensor(f"{p}.{part}.bias", normal((width,), 0.1), F32)
        # Queries and keys large enough that the softmax picks among patches, not averages.
        for part, std in (("attn_q", 3.0), ("attn_k", 3.0), ("attn_v", 1.0), ("attn_out", 1.0)):
            tensor(f"{p}.{part}.weight", normal((width, width), std / np.sqrt(width)), F16)
            tensor(f"{p}.{part}.bias", normal((width,), 0.1), F32)
        tensor(f"{p}.ffn_up.weight", normal((ff, width), 2 / np.sqrt(width)), F16)
        tensor(f"{p}.ffn_up.bias", normal((ff,), 0.1), F32)
        tensor(f"{p}.ffn_down.weight", normal((width, ff), 1 / np.sqrt(ff)), F16)
        tensor(f"{p}.ffn_down.bias", normal((width,), 0.1), F32)
    tensor("v.post_ln.weight", normal((width,), 0.1, 1.0), F32)
    tensor("v.post_ln.bias", normal((width,), 0.1), F32)
    # Stored as the converter does: the norm's weights with Gemma's +1 folded in, and the
    # projection as [vision width, text width] (llama.cpp transposes it when it runs). Its
    # scale gives image rows the RMS of gemma3-test's scaled token rows (about 1).
    tensor("mm.soft_emb_norm.weight", normal((width,), 0.1, 1.0), F32)
    tensor("mm.input_projection.weight", normal((width, s["text"]), 1 / np.sqrt(width)), F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "models/test-models")
    ap.add_argument("--force", action="store_true", help="write files that are there already")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "gemma3-mmproj-test.F16.gguf"
    # Written once: the same seed gives the same bytes (the parity test checks them).
    print(path if path.is_file() and not a.force else gemma3(path))


if __name__ == "__main__":
    sys.exit(main())
