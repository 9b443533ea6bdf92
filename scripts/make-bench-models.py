#!/usr/bin/env python3
"""Writes benchmark models at a real size: Llama 3.2 1B's dimensions (width 2048, 16 layers,
32 query heads and 8 KV heads of 64, feed-forward 8192, tied embeddings) with each family's
own block and test vocabulary, as `scripts/make-test-models.py` describes the families.
Speed does not depend on the values, so one random block is written for every layer. Q8_0 and
Q4_0 are written directly; Q4_K_M comes from llama.cpp's quantiser (`llama-quantize
--allow-requantize` from the Q8_0 file, built by `scripts/build-llama-bench.sh`). Benchmark
inputs only: kept outside the repository, never used by the tests or CI.

    python3 scripts/make-bench-models.py [--out DIR] [--force] [--size 1b|3b|8b] [FAMILY ...]

FAMILY is `llama` (the llama-bpe vocabulary: Llama 3's 128,256 tokens) or one of the test
models' families. Default DIR: ~/.cache/rill/bench-models.

`--size 3b` is Llama 3.2 3B's shape (width 3072, 28 layers, 24 query and 8 KV heads of 128,
feed-forward 8192, tied embeddings) and `--size 8b` Llama 3.1 8B's (width 4096, 32 layers, 32
query and 8 KV heads of 128, feed-forward 14,336, its own output matrix). At those sizes only
Q4_0 is written directly (a Q8_0 8B file is 8.5 GB), and Q4_K_M is made from it.

`qwen3moe` is Qwen3-30B-A3B's shape instead (width 2048, 32 query and 4 KV heads of 128, 128
experts of feed-forward 768 of which 8 are used, Qwen's 151,936 tokens), with `--layers N` of
its 48 layers (default 48: about 17 GB at 4 bits). The experts repeat one random block, but
every layer's router is its own random matrix, so that routing spreads over the experts as a
real model's does.

`qwen35` is Qwen3.5-4B's shape (width 2560, 32 layers of which every fourth is attention with
16 query and 4 KV heads of 256, RoPE over 64, a gated query; the other 24 Gated DeltaNet
layers with 16 key and 32 value heads of 128 and a 4-tap convolution; feed-forward 9216;
Qwen3.5's 248,320 tokens, tied embeddings): Q4_0 directly, Q4_K_M from it.

`gemma4e2b` is Gemma 4 E2B's shape (`G4E` below: per-layer embeddings, 20 layers reading
earlier layers' keys and values, Gemma 4's 262,144 tokens): Q4_0 directly (the per-layer
table's 2.3 billion values as random Q4_0 blocks), Q4_K_M from it.

`gpt-oss` is gpt-oss-20b's shape (width 2880, 64 query and 8 KV heads of 64, 32 experts of
feed-forward 2880 of which 4 are used, a 128-position window on every other layer, YaRN),
its experts in MXFP4 and the other matrices in Q8_0 as the released file has them, with
`--layers N` of its 24 layers (default 24: about 12 GB, as the released file). The vocabulary
is Qwen's 151,936 tokens with harmony's, padded with reserved tokens to o200k_harmony's
201,088, so the embeddings and the output matrix have the real size. One random block of
experts repeats; each layer's router is its own.

`qwen35-mmproj` is a Qwen3.5 4B-shaped vision projector (`qwen3vl_merger`, the encoder Qwen3-VL
and Qwen3.5 share, at Qwen3-VL 4B's size: 16-pixel patches, 24 layers 1,024 wide with 16 heads
and a feed-forward of 4,096, a 48 × 48 position table) without deepstack layers, projected to
2,560 so that it pairs with `qwen35-4b.*.gguf`. F16.

`gemma3-mmproj` is Gemma 3 4B's vision projector (`mmproj`): SigLIP-400M (896-pixel images in
patches of 14, 27 layers 1,152 wide with 16 heads and a feed-forward of 4,304), pooled to 256
image tokens and projected to 2,048 (the 1B shape's width, so that it pairs with
`gemma3-1b.*.gguf` for a question about a picture; the real 4B's text model is 2,560 wide).
F16, as the released `mmproj-model-f16.gguf`, written by `make-test-projectors.py`.
"""

import argparse
import importlib.util
from functools import partial
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("tm", ROOT / "scripts/make-test-models.py")
tm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tm)
spec = importlib.util.spec_from_file_location("tp", ROOT / "scripts/make-test-projectors.py")
tp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tp)

# Gemma 3 4B's SigLIP (`mmproj-model-f16.gguf`), projecting to the 1B shape's width.
SIGLIP = dict(image=896, patch=14, width=1152, heads=16, ff=4304, layers=27, merge=4, text=2048)

# Qwen3.5 4B's vision encoder (Qwen3-VL 4B's size), projecting to the qwen35 4B shape's width.
QWEN35_VISION = dict(patch=16, width=1024, heads=16, ff=4096, layers=24, table=48, text=2560)

# The Llama shapes: width, layers, query heads, KV heads, head size, feed-forward, and
# whether the output matrix is the embeddings' (tied).
SHAPES = {
    "1b": (2048, 16, 32, 8, 64, 8192, True),
    "3b": (3072, 28, 24, 8, 128, 8192, True),
    "8b": (4096, 32, 32, 8, 128, 14336, False),
}

FAMILIES = {
    "llama": dict(vocab="llama-bpe", template="meta-llama-Llama-3.2-3B-Instruct.jinja",
                  rope_base=500_000.0, qkv_bias=False, qk_norm=False),
    **tm.FAMILIES,
}
# The real models' windows and patterns where the test models shrink them.
WINDOWS = {"gemma2": 4096, "gemma3": 512}


def gaussian(rng, shape, std) -> np.ndarray:
    """Normal f32 values of deviation `std`, drawn from `rng` (every writer's weights)."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def finish(w: gguf.GGUFWriter, tmp: Path, path: Path) -> Path:
    """Writes out `w`'s file at `tmp`, then names it `path` (a run cut short leaves no file
    that looks whole)."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)
    return path


def write(family: str, qtype, out: Path, models: Path, size: str = "1b") -> Path:
    s = dict(FAMILIES[family])
    HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD, FF, tied = SHAPES[size]
    arch = "llama" if family == "llama" else family
    rng = np.random.default_rng(7)
    path = out / f"{family}-{size}.{qtype.name}.gguf"
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(f"{family} {size.upper()}-shape benchmark model (random weights)")
    n_vocab = tm.copy_tokenizer(w, models / f"ggml-vocab-{s['vocab']}.gguf",
                                s.get("extra_tokens", ()))
    w.add_chat_template((models / "templates" / s["template"]).read_text(encoding="utf-8"))
    rope_dim = HEAD * 3 // 4 if s.get("rope_dim") else HEAD
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.add_rope_dimension_count(rope_dim)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int(qtype))
    if family in WINDOWS:
        w.add_uint32(f"{arch}.attention.sliding_window", WINDOWS[family])

    normal = partial(gaussian, rng)

    def q(data):
        return gguf.quants.quantize(data, qtype)

    w.add_tensor("token_embd.weight", q(normal((n_vocab, HIDDEN), 1.0 / np.sqrt(HIDDEN))),
                 raw_dtype=qtype)
    if not tied:
        w.add_tensor("output.weight", q(normal((n_vocab, HIDDEN), 1.0 / np.sqrt(HIDDEN))),
                     raw_dtype=qtype)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if s.get("rope_factors"):
        w.add_tensor("rope_factors_long.weight", np.ones(rope_dim // 2, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.ones(rope_dim // 2, dtype=np.float32))
    qw, kw = HEADS * HEAD, KV_HEADS * HEAD
    # One block's tensors, quantised once and written for every layer.
    block = {}
    qkv = normal((qw + 2 * kw, HIDDEN), 1.0 / np.sqrt(HIDDEN))
    if s.get("fused"):
        block["attn_qkv.weight"] = q(qkv)
    else:
        block["attn_q.weight"] = q(qkv[:qw])
        block["attn_k.weight"] = q(qkv[qw:qw + kw])
        block["attn_v.weight"] = q(qkv[qw + kw:])
    block["attn_output.weight"] = q(normal((HIDDEN, qw), 1.0 / np.sqrt(qw)))
    gate_up = normal((2 * FF, HIDDEN), 1.0 / np.sqrt(HIDDEN))
    if s.get("fused"):
        block["ffn_up.weight"] = q(gate_up)
    else:
        block["ffn_gate.weight"] = q(gate_up[:FF])
        block["ffn_up.weight"] = q(gate_up[FF:])
    block["ffn_down.weight"] = q(normal((HIDDEN, FF), 1.0 / np.sqrt(FF)))
    norms = ["attn_norm", "ffn_norm"]
    if s.get("gemma"):
        norms += ["post_attention_norm", "post_ffw_norm"]
    for i in range(LAYERS):
        for n in norms:
            w.add_tensor(f"blk.{i}.{n}.weight", np.ones(HIDDEN, dtype=np.float32))
        if s["qkv_bias"]:
            w.add_tensor(f"blk.{i}.attn_q.bias", np.zeros(qw, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_k.bias", np.zeros(kw, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_v.bias", np.zeros(kw, dtype=np.float32))
        if s["qk_norm"]:
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(HEAD, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(HEAD, dtype=np.float32))
        for name, data in block.items():
            w.add_tensor(f"blk.{i}.{name}", data, raw_dtype=qtype)
    return finish(w, tmp, path)


MOE = dict(hidden=2048, heads=32, kv_heads=4, head=128, experts=128, used=8, ff=768,
           layers=48, vocab="qwen2", template="Qwen-Qwen3-0.6B.jinja")


def write_moe(qtype, out: Path, models: Path, layers: int) -> Path:
    """A Qwen3-30B-A3B-shape qwen3moe file of `layers` layers."""
    m = MOE
    rng = np.random.default_rng(7)
    path = out / f"qwen3moe-30b-a3b-{layers}l.{qtype.name}.gguf"
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "qwen3moe")
    w.add_name(f"qwen3moe 30B-A3B-shape benchmark model, {layers} layers (random weights)")
    n_vocab = tm.copy_tokenizer(w, models / f"ggml-vocab-{m['vocab']}.gguf")
    w.add_chat_template((models / "templates" / m["template"]).read_text(encoding="utf-8"))
    hidden, head = m["hidden"], m["head"]
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(6144)
    w.add_expert_count(m["experts"])
    w.add_expert_used_count(m["used"])
    w.add_expert_feed_forward_length(m["ff"])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int(qtype))

    normal = partial(gaussian, rng)

    def q(data):
        return gguf.quants.quantize(data, qtype)

    w.add_tensor("token_embd.weight", q(normal((n_vocab, hidden), 1.0)), raw_dtype=qtype)
    w.add_tensor("output.weight", q(normal((n_vocab, hidden), 1.0 / np.sqrt(hidden))),
                 raw_dtype=qtype)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    qw, kw, n, ff = m["heads"] * head, m["kv_heads"] * head, m["experts"], m["ff"]
    block = {
        "attn_q.weight": q(normal((qw, hidden), 1.0 / np.sqrt(hidden))),
        "attn_k.weight": q(normal((kw, hidden), 1.0 / np.sqrt(hidden))),
        "attn_v.weight": q(normal((kw, hidden), 1.0 / np.sqrt(hidden))),
        "attn_output.weight": q(normal((hidden, qw), 1.0 / np.sqrt(qw))),
        "ffn_gate_exps.weight": q(normal((n, ff, hidden), 1.0 / np.sqrt(hidden))),
        "ffn_up_exps.weight": q(normal((n, ff, hidden), 1.0 / np.sqrt(hidden))),
        "ffn_down_exps.weight": q(normal((n, hidden, ff), 1.0 / np.sqrt(ff))),
    }
    for i in range(layers):
        for norm in ["attn_norm", "ffn_norm"]:
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", normal((n, hidden), 1.0 / np.sqrt(hidden)))
        for name, data in block.items():
            w.add_tensor(f"blk.{i}.{name}", data, raw_dtype=qtype)
    return finish(w, tmp, path)


OSS = dict(hidden=2880, heads=64, kv_heads=8, head=64, experts=32, used=4, ff=2880, layers=24,
           vocab=201088)


def write_oss(out: Path, models: Path, layers: int) -> Path:
    """A gpt-oss-20b-shape file of `layers` layers: MXFP4 experts, Q8_0 elsewhere."""
    m, q8, mx = OSS, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    rng = np.random.default_rng(7)
    path = out / f"gpt-oss-20b-{layers}l.MXFP4.gguf"
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "gpt-oss")
    w.add_name(f"gpt-oss 20b-shape benchmark model, {layers} layers (random weights)")
    qwen = len(gguf.GGUFReader(models / "ggml-vocab-qwen2.gguf").fields["tokenizer.ggml.tokens"].data)
    reserved = [f"<|reserved_{i}|>" for i in range(OSS["vocab"] - qwen - len(tm.HARMONY_TOKENS))]
    n_vocab = tm.copy_tokenizer(w, models / "ggml-vocab-qwen2.gguf", tm.HARMONY_TOKENS + reserved)
    w.add_chat_template((models / "templates/openai-gpt-oss-120b.jinja").read_text(encoding="utf-8"))
    hidden, head, n, ff = m["hidden"], m["head"], m["experts"], m["ff"]
    w.add_context_length(131072)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_expert_count(n)
    w.add_expert_used_count(m["used"])
    w.add_expert_feed_forward_length(ff)
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(150_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32("gpt-oss.attention.sliding_window", 128)
    w.add_string("gpt-oss.rope.scaling.type", "yarn")
    w.add_float32("gpt-oss.rope.scaling.factor", 32.0)
    w.add_uint32("gpt-oss.rope.scaling.original_context_length", 4096)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)

    normal = partial(gaussian, rng)

    def q(data, qtype=q8):
        return gguf.quants.quantize(data, qtype)

    w.add_tensor("token_embd.weight", q(normal((n_vocab, hidden), 1.0)), raw_dtype=q8)
    w.add_tensor("output.weight", q(normal((n_vocab, hidden), 1.0 / np.sqrt(hidden))),
                 raw_dtype=q8)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    qw, kw = m["heads"] * head, m["kv_heads"] * head
    block = {
        "attn_q.weight": (q(normal((qw, hidden), 1.0 / np.sqrt(hidden))), q8),
        "attn_k.weight": (q(normal((kw, hidden), 1.0 / np.sqrt(hidden))), q8),
        "attn_v.weight": (q(normal((kw, hidden), 1.0 / np.sqrt(hidden))), q8),
        "attn_output.weight": (q(normal((hidden, qw), 1.0 / np.sqrt(qw))), q8),
    }
    # One expert's matrices in MXFP4, repeated for all of them.
    for name, shape, std in [("ffn_gate_exps", (ff, hidden), 1.0 / np.sqrt(hidden)),
                             ("ffn_up_exps", (ff, hidden), 1.0 / np.sqrt(hidden)),
                             ("ffn_down_exps", (hidden, ff), 1.0 / np.sqrt(ff))]:
        one = q(normal(shape, std), mx)
        block[f"{name}.weight"] = (np.broadcast_to(one, (n, *one.shape)).copy(), mx)
    zeros = lambda *shape: np.zeros(shape, dtype=np.float32)  # noqa: E731
    for i in range(layers):
        for norm in ["attn_norm", "post_attention_norm"]:
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_sinks.weight", zeros(m["heads"]))
        for b, width in [("attn_q", qw), ("attn_k", kw), ("attn_v", kw), ("attn_output", hidden)]:
            w.add_tensor(f"blk.{i}.{b}.bias", zeros(width))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", normal((n, hidden), 1.0 / np.sqrt(hidden)))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.bias", zeros(n))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", zeros(n, ff))
        w.add_tensor(f"blk.{i}.ffn_up_exps.bias", zeros(n, ff))
        w.add_tensor(f"blk.{i}.ffn_down_exps.bias", zeros(n, hidden))
        for name, (data, qtype) in block.items():
            w.add_tensor(f"blk.{i}.{name}", data, raw_dtype=qtype)
    return finish(w, tmp, path)


Q35 = dict(hidden=2560, layers=32, heads=16, kv_heads=4, head=256, rope=64, ff=9216,
           delta=dict(conv=4, head=128, k_heads=16, v_heads=32, interval=4))


def write_qwen35(qtype, out: Path, models: Path) -> Path:
    """A Qwen3.5-4B-shape qwen35 file: one random attention block and one Gated DeltaNet block,
    each written for its layers."""
    m, d = Q35, Q35["delta"]
    rng = np.random.default_rng(7)
    path = out / f"qwen35-4b.{qtype.name}.gguf"
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "qwen35")
    w.add_name("qwen35 4B-shape benchmark model (random weights)")
    n_vocab = tm.copy_tokenizer(w, models / "ggml-vocab-qwen35.gguf")
    w.add_chat_template((models / "templates/Qwen3.5-4B.jinja").read_text(encoding="utf-8"))
    hidden, head, ff = m["hidden"], m["head"], m["ff"]
    w.add_context_length(32768)
    w.add_embedding_length(hidden)
    w.add_block_count(m["layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_dimension_count(m["rope"])
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_rope_freq_base(10_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(d["conv"])
    w.add_ssm_state_size(d["head"])
    w.add_ssm_group_count(d["k_heads"])
    w.add_ssm_time_step_rank(d["v_heads"])
    w.add_ssm_inner_size(d["head"] * d["v_heads"])
    w.add_full_attention_interval(d["interval"])
    w.add_file_type(int(qtype))

    normal = partial(gaussian, rng)

    def q(data):
        return gguf.quants.quantize(data, qtype)

    w.add_tensor("token_embd.weight", q(normal((n_vocab, hidden), 1.0 / np.sqrt(hidden))),
                 raw_dtype=qtype)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    qw, kw = m["heads"] * head, m["kv_heads"] * head
    keys, values = d["head"] * d["k_heads"], d["head"] * d["v_heads"]
    ffn = {
        "ffn_gate.weight": q(normal((ff, hidden), 1.0 / np.sqrt(hidden))),
        "ffn_up.weight": q(normal((ff, hidden), 1.0 / np.sqrt(hidden))),
        "ffn_down.weight": q(normal((hidden, ff), 1.0 / np.sqrt(ff))),
    }
    attention = {
        "attn_q.weight": q(normal((2 * qw, hidden), 1.0 / np.sqrt(hidden))),
        "attn_k.weight": q(normal((kw, hidden), 1.0 / np.sqrt(hidden))),
        "attn_v.weight": q(normal((kw, hidden), 1.0 / np.sqrt(hidden))),
        "attn_output.weight": q(normal((hidden, qw), 1.0 / np.sqrt(qw))),
    }
    delta = {
        "attn_qkv.weight": q(normal((2 * keys + values, hidden), 1.0 / np.sqrt(hidden))),
        "attn_gate.weight": q(normal((values, hidden), 1.0 / np.sqrt(hidden))),
        "ssm_beta.weight": q(normal((d["v_heads"], hidden), 1.0 / np.sqrt(hidden))),
        "ssm_alpha.weight": q(normal((d["v_heads"], hidden), 1.0 / np.sqrt(hidden))),
        "ssm_out.weight": q(normal((hidden, values), 1.0 / np.sqrt(values))),
    }
    for i in range(m["layers"]):
        for n in ["attn_norm", "post_attention_norm"]:
            w.add_tensor(f"blk.{i}.{n}.weight", np.ones(hidden, dtype=np.float32))
        recurrent = (i + 1) % d["interval"] != 0
        if recurrent:
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight", normal((2 * keys + values, d["conv"]), 0.5))
            w.add_tensor(f"blk.{i}.ssm_dt.bias", np.zeros(d["v_heads"], dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_a", -np.ones(d["v_heads"], dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_norm.weight", np.ones(d["head"], dtype=np.float32))
        else:
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head, dtype=np.float32))
        for name, data in {**(delta if recurrent else attention), **ffn}.items():
            w.add_tensor(f"blk.{i}.{name}", data, raw_dtype=qtype)
    return finish(w, tmp, path)


# Gemma 4 E2B's shape (`gemma4e2b`): width 1536, 35 layers of which every fifth is global,
# 8 query heads and 1 KV head, 256 wide on the windowed layers (window 512) and 512 on the
# global ones (RoPE over a quarter of them), feed-forward 6144 (twice that on the 20 layers
# that read earlier layers' keys and values), per-layer embeddings 256 wide, Gemma 4's
# 262,144 tokens, tied embeddings.
G4E = dict(hidden=1536, layers=35, heads=8, kv_heads=1, head_swa=256, head=512, ff=6144,
           per_layer=256, shared=20, window=512, every=5)


def random_q4_0(rows: int, cols: int, rng) -> np.ndarray:
    """A Q4_0 matrix of random nibbles under one small scale, as bytes: what quantising
    `rows × cols` random values would take minutes for (the per-layer table's billions)."""
    blocks = rows * cols // 32
    data = rng.integers(0, 256, size=(blocks, 18), dtype=np.uint8)
    data[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    return data.reshape(rows, cols // 32 * 18)


def write_gemma4e2b(out: Path, models: Path) -> Path:
    """A Gemma-4-E2B-shape gemma4 file in Q4_0: one random block of each kind (windowed,
    global; own keys or shared) written for its layers."""
    m, qtype = G4E, gguf.GGMLQuantizationType.Q4_0
    rng = np.random.default_rng(11)
    path = out / "gemma4-e2b.Q4_0.gguf"
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "gemma4")
    w.add_name("gemma4 E2B-shape benchmark model (random weights)")
    n_vocab = tm.copy_tokenizer(w, models / "ggml-vocab-gemma-4.gguf")
    w.add_chat_template((models / "templates/google-gemma-4-31B-it.jinja")
                        .read_text(encoding="utf-8"))
    hidden, layers, ff, pl = m["hidden"], m["layers"], m["ff"], m["per_layer"]
    own = layers - m["shared"]
    swa = [i % m["every"] != m["every"] - 1 for i in range(layers)]
    w.add_context_length(32768)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_array("gemma4.feed_forward_length", [ff if i < own else 2 * ff for i in range(layers)])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(m["head"])
    w.add_value_length(m["head"])
    w.add_uint32("gemma4.attention.key_length_swa", m["head_swa"])
    w.add_uint32("gemma4.attention.value_length_swa", m["head_swa"])
    w.add_rope_dimension_count(m["head"])
    w.add_uint32("gemma4.rope.dimension_count_swa", m["head_swa"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_float32("gemma4.rope.freq_base_swa", 10_000.0)
    w.add_uint32("gemma4.attention.sliding_window", m["window"])
    w.add_array("gemma4.attention.sliding_window_pattern", swa)
    w.add_uint32("gemma4.embedding_length_per_layer_input", pl)
    w.add_uint32("gemma4.attention.shared_kv_layers", m["shared"])
    w.add_float32("gemma4.final_logit_softcapping", 30.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int(qtype))

    normal = partial(gaussian, rng)

    def q(data):
        return gguf.quants.quantize(data, qtype)

    def add(name, data):
        w.add_tensor(name, data, raw_dtype=qtype)

    add("token_embd.weight", q(normal((n_vocab, hidden), 1.0 / np.sqrt(hidden))))
    add("per_layer_token_embd.weight", random_q4_0(n_vocab, layers * pl, rng))
    add("per_layer_model_proj.weight", q(normal((layers * pl, hidden), 1.0 / np.sqrt(hidden))))
    w.add_tensor("per_layer_proj_norm.weight", np.ones(pl, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    # The global layers' RoPE turns a quarter of each head (the converter's factors: 1, then
    # 1e30 for the pairs that do not turn).
    quarter = m["head"] // 8
    w.add_tensor("rope_freqs.weight", np.array([1.0] * quarter + [1e30] * (m["head"] // 2 - quarter),
                                               dtype=np.float32))
    blocks = {}
    for windowed in (True, False):
        hd = m["head_swa"] if windowed else m["head"]
        qw, kw = m["heads"] * hd, m["kv_heads"] * hd
        blocks[windowed] = {
            "attn_q.weight": q(normal((qw, hidden), 1.0 / np.sqrt(hidden))),
            "attn_k.weight": q(normal((kw, hidden), 1.0 / np.sqrt(hidden))),
            "attn_v.weight": q(normal((kw, hidden), 1.0 / np.sqrt(hidden))),
            "attn_output.weight": q(normal((hidden, qw), 1.0 / np.sqrt(qw))),
        }
    ffn = {}
    for width in (ff, 2 * ff):
        ffn[width] = {
            "ffn_gate.weight": q(normal((width, hidden), 1.0 / np.sqrt(hidden))),
            "ffn_up.weight": q(normal((width, hidden), 1.0 / np.sqrt(hidden))),
            "ffn_down.weight": q(normal((hidden, width), 1.0 / np.sqrt(width))),
        }
    per_layer = {
        "inp_gate.weight": q(normal((pl, hidden), 1.0 / np.sqrt(hidden))),
        "proj.weight": q(normal((hidden, pl), 1.0 / np.sqrt(pl))),
    }
    for i in range(layers):
        hd = m["head_swa"] if swa[i] else m["head"]
        for n in ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"]:
            w.add_tensor(f"blk.{i}.{n}.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(hd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(hd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.layer_output_scale.weight", np.ones(1, dtype=np.float32))
        attention = dict(blocks[swa[i]])
        if i >= own:
            # A layer that reads an earlier one's keys and values has queries only.
            attention = {k: v for k, v in attention.items() if k.startswith(("attn_q", "attn_o"))}
        layer = {**attention, **ffn[ff if i < own else 2 * ff], **per_layer}
        for name, data in layer.items():
            add(f"blk.{i}.{name}", data)
    return finish(w, tmp, path)


def q4_k_m(src: Path, dst: Path):
    """llama.cpp's quantiser (`llama-quantize`, built by `scripts/build-llama-bench.sh`)."""
    bin_dir = subprocess.run(["bash", str(ROOT / "scripts/build-llama-bench.sh")], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    tmp = dst.with_suffix(".partial")
    run = subprocess.run([f"{bin_dir}/llama-quantize", "--allow-requantize", str(src), str(tmp),
                          "Q4_K_M", "2"], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"llama-quantize failed on {src}:\n{run.stderr[-2000:]}")
    tmp.rename(dst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/rill/bench-models")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--size", choices=SHAPES, default="1b",
                    help="the Llama shape of the dense families' files (default: 1b)")
    ap.add_argument("--layers", type=int,
                    help="of the qwen3moe shape's 48 layers, or gpt-oss's 24 (default: all)")
    ap.add_argument("families", nargs="*",
                    default=[f for f in FAMILIES if f not in ("qwen3moe", "gpt-oss", "qwen35",
                                                               "qwen35moe")])
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    models = tm.assets()
    if "qwen3moe" in a.families:
        layers = a.layers or MOE["layers"]
        path = a.out / f"qwen3moe-30b-a3b-{layers}l.Q4_0.gguf"
        if a.force or not path.is_file():
            write_moe(gguf.GGMLQuantizationType.Q4_0, a.out, models, layers)
        print(path)
        a.families.remove("qwen3moe")
    if "gpt-oss" in a.families:
        layers = a.layers or OSS["layers"]
        path = a.out / f"gpt-oss-20b-{layers}l.MXFP4.gguf"
        if a.force or not path.is_file():
            write_oss(a.out, models, layers)
        print(path)
        a.families.remove("gpt-oss")
    if "qwen35" in a.families:
        for qtype in (gguf.GGMLQuantizationType.Q4_0,):
            path = a.out / f"qwen35-4b.{qtype.name}.gguf"
            if a.force or not path.is_file():
                write_qwen35(qtype, a.out, models)
            print(path)
        k = a.out / "qwen35-4b.Q4_K_M.gguf"
        if a.force or not k.is_file():
            q4_k_m(a.out / "qwen35-4b.Q4_0.gguf", k)
        print(k)
        a.families.remove("qwen35")
    if "qwen35-mmproj" in a.families:
        path = a.out / "qwen35-4b-mmproj.F16.gguf"
        if a.force or not path.is_file():
            tp.qwen3vl(path, (), seed=1, s=QWEN35_VISION)
        print(path)
        a.families.remove("qwen35-mmproj")
    if "gemma3-mmproj" in a.families:
        path = a.out / "gemma3-4b-mmproj.F16.gguf"
        if a.force or not path.is_file():
            tp.gemma3(path, SIGLIP, seed=1)
        print(path)
        a.families.remove("gemma3-mmproj")
    if "gemma4e2b" in a.families:
        path = a.out / "gemma4-e2b.Q4_0.gguf"
        if a.force or not path.is_file():
            write_gemma4e2b(a.out, models)
        print(path)
        k = a.out / "gemma4-e2b.Q4_K_M.gguf"
        if a.force or not k.is_file():
            q4_k_m(path, k)
        print(k)
        a.families.remove("gemma4e2b")
    big = a.size != "1b"
    for family in a.families:
        for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
            if big and qtype == gguf.GGMLQuantizationType.Q8_0:
                continue
            path = a.out / f"{family}-{a.size}.{qtype.name}.gguf"
            if a.force or not path.is_file():
                write(family, qtype, a.out, models, a.size)
            print(path)
        k = a.out / f"{family}-{a.size}.Q4_K_M.gguf"
        if a.force or not k.is_file():
            q4_k_m(a.out / f"{family}-{a.size}.{'Q4_0' if big else 'Q8_0'}.gguf", k)
        print(k)


if __name__ == "__main__":
    sys.exit(main())
