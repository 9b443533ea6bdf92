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

- `qwen25vl-mmproj-test.F16.gguf`: Qwen2.5-VL's vision encoder and merger (`conversion/qwenvl.py`,
  `Qwen2VLVisionModel`): patches of 14 embedded by two kernels (the converter splits the
  temporal Conv3D so), four layers 96 wide (4 heads of 24, so M-RoPE's quarters are 6 pairs),
  RMS norms, a SwiGLU feed-forward 160 wide, window attention on layers 0 and 2 and full on 1
  and 3 (`n_wa_pattern` 2), the final norm (`merger.ln_q`), and the merger's GELU MLP from
  4 × 96 to the width of `qwen2vl-test` (128). No patch bias, no position embeddings.
- `qwen2vl-mmproj-test.F16.gguf`: Qwen2-VL's (the same converter class): the same shape
  without windows (every layer attends over the whole picture), LayerNorms with biases, and a
  plain feed-forward (up, GELU's quick form, down; neither `use_gelu` nor `use_silu` set).

- `gemma4-mmproj-test.F16.gguf`: Gemma 4's vision encoder (`conversion/gemma.py`,
  `Gemma4VisionAudioModel`): patches of 16 without a bias, learned position embeddings by
  column and by row (a table of 64 each), three layers 96 wide (4 heads of 24) with RMS norms,
  q/k norms per head, post-norms and an output scale per block, a GeGLU feed-forward 160 wide
  (GELU's quick form: the converter sets neither `use_gelu` nor `use_silu`), pooling 3 × 3
  (the default: no scale factor written), the standardisation (`v.std_bias`, `v.std_scale`)
  and the projection to the width of `gemma4v-test` (128); clamp bounds (Gemma 4's
  `ClippableLinear`) on two matrices, set to bite.

- `qwen3vl-mmproj-test.F16.gguf`: Qwen3-VL's (`conversion/qwen3vl.py`, `Qwen3VLVisionModel`):
  patches of 16 by two kernels with a bias, a learned position table of 6 × 6 (resized to each
  picture), four layers 96 wide (4 heads of 24) with LayerNorms, a fused q/k/v and a GELU
  feed-forward 160 wide, deepstack mergers after layers 1 and 2, and the merger to the width of
  `qwen3vl-test` (128): each image token's row is 3 × 128 wide.
- `qwen35-mmproj-test.F16.gguf`: the same encoder without deepstack layers, as Qwen3.5's
  projector is (the converter's class is the same), for `qwen35-test`.

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

class Projector:
    """A projector file being written: the keys every encoder has, seeded random values, and
    the write to a partial file renamed into place once whole."""

    def __init__(self, path: Path, name: str, kind, s: dict, image: int, seed: int):
        self.path, self.tmp = path, path.with_suffix(".partial")
        self.rng = np.random.default_rng(seed)
        w = self.w = gguf.GGUFWriter(str(self.tmp), "clip")
        w.add_name(name)
        w.add_type(gguf.GGUFType.MMPROJ)
        w.add_bool("clip.has_vision_encoder", True)
        w.add_clip_projector_type(kind)
        w.add_vision_image_size(image)
        w.add_vision_patch_size(s["patch"])
        w.add_vision_embedding_length(s["width"])
        w.add_vision_feed_forward_length(s["ff"])
        w.add_vision_block_count(s["layers"])
        w.add_vision_head_count(s["heads"])
        w.add_vision_projection_dim(s["text"])
        w.add_vision_attention_layernorm_eps(1e-6)

    def normal(self, shape, std, mean=0.0):
        return (np.float32(mean) + self.rng.standard_normal(shape, dtype=np.float32)
                * np.float32(std)).astype(np.float32)

    def tensor(self, name, data, qtype):
        self.w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def finish(self) -> Path:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        self.tmp.replace(self.path)
        return self.path


# SigLIP's shape, small: image side, patch side, width, heads, feed-forward, layers, and the
# side of the pooling window (Gemma 3's 4: 64×64 patches become 16×16 tokens).
GEMMA3 = dict(image=224, patch=14, width=96, heads=4, ff=200, layers=3, merge=4, text=128)


def gemma3(path: Path, s: dict = GEMMA3, seed: int = 4321):
    """`s`: the shape (GEMMA3 for the tests; `make-bench-models.py` writes Gemma 3 4B's)."""
    out = Projector(path, "Gemma 3 vision test projector (random weights)",
                    gguf.VisionProjectorType.GEMMA3, s, s["image"], seed)
    w, normal, tensor = out.w, out.normal, out.tensor
    w.add_vision_use_gelu(True)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    n_side = s["image"] // s["patch"]
    # The default pooling is 4; the converter writes the factor only when it differs, as here
    # it does not, so the key is left out and the default is what both engines must take.
    width, ff = s["width"], s["ff"]

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
    return out.finish()


QWEN25VL = dict(patch=14, width=96, heads=4, ff=160, layers=4, wa_pattern=2, text=128)


def qwen25vl(path: Path, v2: bool = False):
    """`v2`: Qwen2-VL's instead (no windows, LayerNorms, no gate)."""
    s = QWEN25VL
    # The image size is the converter's default (only llama.cpp's warm-up reads it).
    if v2:
        out = Projector(path, "Qwen2-VL vision test projector (random weights)",
                        gguf.VisionProjectorType.QWEN2VL, s, 560, 1357)
    else:
        out = Projector(path, "Qwen2.5-VL vision test projector (random weights)",
                        gguf.VisionProjectorType.QWEN25VL, s, 560, 2468)
    w, normal, tensor = out.w, out.normal, out.tensor
    if not v2:
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(s["wa_pattern"])
    # The Qwen-VL processors' CLIP normalisation.
    w.add_vision_image_mean([0.48145466, 0.4578275, 0.40821073])
    w.add_vision_image_std([0.26862954, 0.26130258, 0.27577711])
    width, ff, unit = s["width"], s["ff"], 4 * s["width"]

    # Each kernel gives half the patch's row, so the sum has unit scale.
    k = 3 * s["patch"] * s["patch"]
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        tensor(name, normal((width, 3, s["patch"], s["patch"]), 0.7 / np.sqrt(k)), F16)
    for i in range(s["layers"]):
        p = f"v.blk.{i}"
        for part in ("ln1", "ln2"):
            tensor(f"{p}.{part}.weight", normal((width,), 0.1, 1.0), F32)
            if v2:
                tensor(f"{p}.{part}.bias", normal((width,), 0.1), F32)
        # Queries and keys that make the softmax pick among patches without turning it into an
        # argmax: at Gemma's 3.0 this encoder, reading the photo at its own size, moved its rows
        # by a normalised MSE of 6e-3 under JPEG decoders a few levels apart (1.8e-5 with
        # llama.cpp's decoded pixels); a real encoder is far smoother than random weights.
        for part, std in (("attn_q", 1.5), ("attn_k", 1.5), ("attn_v", 1.0), ("attn_out", 1.0)):
            tensor(f"{p}.{part}.weight", normal((width, width), std / np.sqrt(width)), F16)
            tensor(f"{p}.{part}.bias", normal((width,), 0.1), F32)
        for part in ("ffn_up",) if v2 else ("ffn_gate", "ffn_up"):
            tensor(f"{p}.{part}.weight", normal((ff, width), 1.5 / np.sqrt(width)), F16)
            tensor(f"{p}.{part}.bias", normal((ff,), 0.1), F32)
        tensor(f"{p}.ffn_down.weight", normal((width, ff), 1 / np.sqrt(ff)), F16)
        tensor(f"{p}.ffn_down.bias", normal((width,), 0.1), F32)
    tensor("v.post_ln.weight", normal((width,), 0.1, 1.0), F32)
    if v2:
        tensor("v.post_ln.bias", normal((width,), 0.1), F32)
    # The merger: its rows reach the text model at the scale of its token embeddings (1).
    tensor("mm.0.weight", normal((unit, unit), 2 / np.sqrt(unit)), F16)
    tensor("mm.0.bias", normal((unit,), 0.1), F32)
    tensor("mm.2.weight", normal((s["text"], unit), 1.5 / np.sqrt(unit)), F16)
    tensor("mm.2.bias", normal((s["text"],), 0.1), F32)
    return out.finish()


# Gemma 4's shape, small: patch side, width, heads, feed-forward, layers, the position tables'
# length, and the text model's width.
GEMMA4 = dict(patch=16, width=96, heads=4, ff=160, layers=3, table=64, text=128)


def gemma4(path: Path):
    s = GEMMA4
    # The converter writes an image size of 224 that nothing reads.
    out = Projector(path, "Gemma 4 vision test projector (random weights)",
                    gguf.VisionProjectorType.GEMMA4V, s, 224, 9753)
    w, normal, tensor = out.w, out.normal, out.tensor
    # Gemma 4's processor: pixels in [0, 1], stretched to [-1, 1] by the encoder itself.
    w.add_vision_image_mean([0.0, 0.0, 0.0])
    w.add_vision_image_std([1.0, 1.0, 1.0])
    width, ff, hd = s["width"], s["ff"], s["width"] // s["heads"]
    scalar = lambda name, v: tensor(name, np.array([v], dtype=np.float32), F32)

    k = 3 * s["patch"] * s["patch"]
    tensor("v.patch_embd.weight", normal((width, 3, s["patch"], s["patch"]), 1 / np.sqrt(k)), F16)
    # [2, table, width]: the columns' table, then the rows'.
    tensor("v.position_embd.weight", normal((2, s["table"], width), 0.5), F32)
    for i in range(s["layers"]):
        p = f"v.blk.{i}"
        for part in ("ln1", "ln2", "attn_post_norm", "ffn_post_norm"):
            tensor(f"{p}.{part}.weight", normal((width,), 0.1, 1.0), F32)
        # Scores are not scaled: the q/k norms' weights set them (about 1.5 wide here).
        for part in ("attn_q_norm", "attn_k_norm"):
            tensor(f"{p}.{part}.weight", normal((hd,), 0.05, 0.55), F32)
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"{p}.{part}.weight", normal((width, width), 1 / np.sqrt(width)), F16)
        for part in ("ffn_gate", "ffn_up"):
            tensor(f"{p}.{part}.weight", normal((ff, width), 1.5 / np.sqrt(width)), F16)
        tensor(f"{p}.ffn_down.weight", normal((width, ff), 1 / np.sqrt(ff)), F16)
        scalar(f"{p}.out_scale.weight", 0.8)
    # Clamps that bite: the second block's queries read inputs within ±1.5 (its normed input
    # has unit RMS) and the first block's feed-forward gives outputs of at most 0.5.
    scalar("v.blk.1.attn_q.input_min", -1.5)
    scalar("v.blk.1.attn_q.input_max", 1.5)
    scalar("v.blk.0.ffn_down.output_max", 0.5)
    tensor("v.std_bias", normal((width,), 0.5), F32)
    tensor("v.std_scale", normal((width,), 0.1, 1.0), F32)
    tensor("mm.input_projection.weight", normal((s["text"], width), 1 / np.sqrt(width)), F16)
    return out.finish()


QWEN3VL = dict(patch=16, width=96, heads=4, ff=160, layers=4, table=6, text=128)


def qwen3vl(path: Path, deepstack=(1, 2), seed: int = 8642, s: dict = QWEN3VL):
    """`deepstack`: the layers after which a merger of its own gives the text model more rows
    (none for Qwen3.5's); `s`: the shape (QWEN3VL for the tests; `make-bench-models.py` writes
    Qwen3.5 4B's)."""
    # The converter's image size: the position table's side in pixels.
    out = Projector(path, "Qwen3-VL vision test projector (random weights)",
                    gguf.VisionProjectorType.QWEN3VL, s, s["table"] * s["patch"], seed)
    w, normal, tensor = out.w, out.normal, out.tensor
    w.add_vision_use_gelu(True)
    w.add_vision_spatial_merge_size(2)
    if deepstack:
        w.add_vision_is_deepstack_layers([i in deepstack for i in range(s["layers"])])
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    width, ff, unit = s["width"], s["ff"], 4 * s["width"]

    k = 3 * s["patch"] * s["patch"]
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        tensor(name, normal((width, 3, s["patch"], s["patch"]), 0.7 / np.sqrt(k)), F16)
    tensor("v.patch_embd.bias", normal((width,), 0.1), F32)
    tensor("v.position_embd.weight", normal((s["table"] ** 2, width), 0.5), F32)
    for i in range(s["layers"]):
        p = f"v.blk.{i}"
        for part in ("ln1", "ln2"):
            tensor(f"{p}.{part}.weight", normal((width,), 0.1, 1.0), F32)
            tensor(f"{p}.{part}.bias", normal((width,), 0.1), F32)
        # q, k, v in one matrix; q and k at Qwen2.5-VL's tamed scale (1.5), v at 1.
        qkv = np.concatenate([normal((width, width), std / np.sqrt(width))
                              for std in (1.5, 1.5, 1.0)])
        tensor(f"{p}.attn_qkv.weight", qkv, F16)
        tensor(f"{p}.attn_qkv.bias", normal((3 * width,), 0.1), F32)
        tensor(f"{p}.attn_out.weight", normal((width, width), 1 / np.sqrt(width)), F16)
        tensor(f"{p}.attn_out.bias", normal((width,), 0.1), F32)
        tensor(f"{p}.ffn_up.weight", normal((ff, width), 1.5 / np.sqrt(width)), F16)
        tensor(f"{p}.ffn_up.bias", normal((ff,), 0.1), F32)
        tensor(f"{p}.ffn_down.weight", normal((width, ff), 1 / np.sqrt(ff)), F16)
        tensor(f"{p}.ffn_down.bias", normal((width,), 0.1), F32)
        if i in deepstack:
            d = f"v.deepstack.{i}"
            tensor(f"{d}.norm.weight", normal((unit,), 0.1, 1.0), F32)
            tensor(f"{d}.norm.bias", normal((unit,), 0.1), F32)
            tensor(f"{d}.fc1.weight", normal((unit, unit), 2 / np.sqrt(unit)), F16)
            tensor(f"{d}.fc1.bias", normal((unit,), 0.1), F32)
            # The text model adds these to its residual stream: rows of RMS about 0.5.
            tensor(f"{d}.fc2.weight", normal((s["text"], unit), 0.7 / np.sqrt(unit)), F16)
            tensor(f"{d}.fc2.bias", normal((s["text"],), 0.1), F32)
    tensor("v.post_ln.weight", normal((width,), 0.1, 1.0), F32)
    tensor("v.post_ln.bias", normal((width,), 0.1), F32)
    tensor("mm.0.weight", normal((unit, unit), 2 / np.sqrt(unit)), F16)
    tensor("mm.0.bias", normal((unit,), 0.1), F32)
    tensor("mm.2.weight", normal((s["text"], unit), 1.5 / np.sqrt(unit)), F16)
    tensor("mm.2.bias", normal((s["text"],), 0.1), F32)
    return out.finish()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "models/test-models")
    ap.add_argument("--force", action="store_true", help="write files that are there already")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    # Written once: the same seed gives the same bytes (the parity test checks them).
    for name, make in (("gemma3-mmproj-test.F16.gguf", gemma3),
                       ("qwen25vl-mmproj-test.F16.gguf", qwen25vl),
                       ("qwen2vl-mmproj-test.F16.gguf", lambda p: qwen25vl(p, v2=True)),
                       ("gemma4-mmproj-test.F16.gguf", gemma4),
                       ("qwen3vl-mmproj-test.F16.gguf", qwen3vl),
                       ("qwen35-mmproj-test.F16.gguf", lambda p: qwen3vl(p, (), 7531))):
        path = a.out / name
        print(path if path.is_file() and not a.force else make(path))


if __name__ == "__main__":
    sys.exit(main())
