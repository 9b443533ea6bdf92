#!/usr/bin/env python3
"""Writes small GGUF test models of the families Rill runs, with seeded random weights, the
family's real vocabulary and a real chat template from llama.cpp's assets (gguf-py from PyPI
writes them; `scripts/fetch-llama-cpp-assets.sh` provides the vocabularies and templates).

    python3 scripts/make-test-models.py [--out DIR] [--force] [FAMILY ...]

Each family gets, in DIR (default: `models/test-models/` in the repository) — gpt-oss gets an
`.MXFP4.gguf` (its experts in MXFP4, the other matrices Q8_0, as the released files are) and
an `.F16.gguf` instead:
- `<family>-test.F16.gguf`, `.Q8_0.gguf`, `.Q4_0.gguf` and `.Q4_1.gguf`: the same weights,
  written by gguf-py;
- `<family>-test.Q4_K_M.gguf` and `.Q5_K_M.gguf`: llama.cpp's own quantiser (`llama-quantize`, built portable by
  `scripts/build-llama-quantize.sh`) run on an F16 file of rows K-quants can hold (width 256,
  feed-forward 768; a narrower tensor gets llama.cpp's fallback type, as in a real file).
The same seed gives the same bytes, so the reference logits recorded from llama.cpp
(`scripts/record-reference-logits.py`) stay tied to each file by its SHA-256.

Random weights give flat distributions, or a model that repeats its input through a tied
embedding (docs/architecture.md, "Test models"): the output projection is untied and scaled so that the
model's top token is far likelier than 1/vocabulary, and the record script checks it.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent

# The shape every test model shares: small, but with grouped-query attention and more than one
# layer. Widths are multiples of 32 so every 2-D weight quantises to Q4_0 and Q8_0.
HIDDEN, LAYERS, HEADS, KV_HEADS, FF = 128, 2, 4, 2, 352
# The K-quant files' widths: multiples of 256, the K-quants' block.
K_HIDDEN, K_FF = 256, 768

# Phi-3's own tokens after the SentencePiece vocabulary, at its ids (32000-32010; the
# placeholders are there as in the real files).
PHI3_TOKENS = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>",
               "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>",
               "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]

# A window short enough that the teacher-forced text (70 tokens) and the candle-path test (24)
# run past it on the windowed layers.
WINDOW = 8

# gpt-oss's harmony tokens, after the vocabulary (the assets have no o200k vocabulary).
HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                  "<|constrain|>"]

MXFP4 = gguf.GGMLQuantizationType.MXFP4

FAMILIES = {
    # Qwen2/2.5 and the DeepSeek-R1 Qwen distills: q/k/v biases, NEOX RoPE.
    "qwen2": dict(vocab="qwen2", template="Qwen-Qwen2.5-7B-Instruct.jinja", head_dim=32,
                  rope_base=1_000_000.0, qkv_bias=True, qk_norm=False,
                  # llama.cpp takes Qwen2's query width to be its model width.
                  k=dict(head_dim=64)),
    # Qwen3: q/k norms, heads wider than hidden / heads (key_length), no biases.
    "qwen3": dict(vocab="qwen2", template="Qwen-Qwen3-0.6B.jinja", head_dim=64,
                  rope_base=1_000_000.0, qkv_bias=False, qk_norm=True),
    # Qwen3 MoE (Qwen3-30B-A3B): Qwen3's attention, and a mixture of 8 SwiGLU experts, 2 of
    # which each token goes through (the real model: 128 and 8). The router's weights are
    # distinct random values whose logits spread by about 1.5 units, so that routing is
    # decisive and a change of expert changes the answer.
    "qwen3moe": dict(vocab="qwen2", template="Qwen-Qwen3-0.6B.jinja", head_dim=64,
                     rope_base=1_000_000.0, qkv_bias=False, qk_norm=True,
                     experts=dict(count=8, used=2, ff=96, router_std=1.5),
                     k=dict(experts=dict(count=8, used=2, ff=256, router_std=1.5))),
    # Gemma 2: post-norms, GELU, √hidden embeddings, tied output, soft-caps set low enough to
    # bite on random weights (the real 50 and 30 are the defaults a file without them gets),
    # a window on every other layer. The llama-spm vocabulary (Gemma's own is not in the
    # assets) exercises the same SentencePiece path.
    "gemma2": dict(vocab="llama-spm", template="google-gemma-2-2b-it.jinja", head_dim=32,
                   rope_base=10_000.0, qkv_bias=False, qk_norm=False, gemma=True,
                   logit_scale=6.0, post_norm=2.0,
                   keys={"attn_logit_softcapping": 5.0, "final_logit_softcapping": 15.0,
                         "attention.sliding_window": WINDOW}),
    # Gemma 3: q/k norms, six layers so that five windowed ones (RoPE base 10,000, the default
    # the file leaves unsaid) come before one global (base 1,000,000, positions scaled by 1/8
    # as the 4B's are).
    "gemma3": dict(vocab="llama-spm", template="google-gemma-2-2b-it.jinja", head_dim=32,
                   rope_base=1_000_000.0, qkv_bias=False, qk_norm=True, gemma=True, layers=6,
                   post_norm=1.0,
                   # At the K-quant file's width 256, the unit scale echoes the input.
                   k=dict(post_norm=1.25),
                   keys={"attention.sliding_window": WINDOW, "rope.scaling.type": "linear",
                         "rope.scaling.factor": 8.0}),
    # Phi-3/Phi-4-mini: fused qkv and gate-up, NEOX RoPE over 24 of each head's 32 dimensions
    # (Phi-4-mini's partial rotary), and a long-context file's RoPE factors: an original
    # context of 512 that both engines run past, so both pick the long factors, and their
    # attention factor, √(1 + ln 8 / ln 512) as the converter writes it for an 8x extension.
    "phi3": dict(vocab="llama-spm", template="microsoft-Phi-3.5-mini-instruct.jinja", head_dim=32,
                 rope_dim=24, rope_base=10_000.0, qkv_bias=False, qk_norm=False, fused=True,
                 rope_factors=True, extra_tokens=PHI3_TOKENS,
                 # llama.cpp takes Phi-3's query width to be its model width.
                 k=dict(head_dim=64),
                 keys={"rope.scaling.original_context_length": 512,
                       "rope.scaling.attn_factor": float(np.sqrt(1 + np.log(8) / np.log(512)))}),
    # gpt-oss (llama.cpp's `openai-moe.cpp`): q/k/v and output biases, a sink logit per head,
    # the norm before the experts named `post_attention_norm`, a mixture of 8 experts of which
    # 2 are used, routed by a softmax over the chosen logits with the router's bias, each a
    # clamped SwiGLU with biases; every other layer windowed; YaRN RoPE (factor 32 over an
    # original context of 128, so the ramp between the scaled and unscaled pairs falls inside
    # the head). The qwen2 vocabulary with harmony's tokens, under the real gpt-oss template.
    "gpt-oss": dict(vocab="qwen2", template="openai-gpt-oss-120b.jinja", head_dim=64,
                    rope_base=150_000.0, qkv_bias=True, qk_norm=False, oss=True,
                    extra_tokens=HARMONY_TOKENS,
                    experts=dict(count=8, used=2, ff=96, router_std=1.5),
                    formats=("MXFP4", gguf.GGMLQuantizationType.F16),
                    keys={"attention.sliding_window": WINDOW, "rope.scaling.type": "yarn",
                          "rope.scaling.factor": 32.0,
                          "rope.scaling.original_context_length": 128}),
    # Qwen3.5 (llama.cpp's `qwen35.cpp`): four layers, three Gated DeltaNet (a 4-tap
    # convolution, 2 key and 4 value heads of 32, so two value heads read each key head) and
    # one attention whose query projection also gives a gate per head; q/k norms, heads of 64
    # with RoPE over 16 of them in M-RoPE's interleaved sections (3, 3, 2: all turn on text);
    # `post_attention_norm` before the feed-forward. The real Qwen3.5 vocabulary and template.
    "qwen35": dict(vocab="qwen35", template="Qwen3.5-4B.jinja", head_dim=64, rope_dim=16,
                   rope_base=10_000_000.0, qkv_bias=False, qk_norm=True, layers=4,
                   ffn_norm="post_attention_norm", gated_query=True,
                   delta=dict(conv=4, head=32, k_heads=2, v_heads=4, interval=4),
                   sections=[3, 3, 2, 0]),
    # Gemma 4 (31B's block, llama.cpp's `gemma4.cpp`): six layers, five windowed with heads of 32
    # (2 key/value heads, RoPE over all 32, base 10,000) and one global with heads of 64 (1
    # key/value head whose values are its keys' projection: no `attn_v`; RoPE over 64 with the
    # file's `rope_freqs`, base 1,000,000); q/k norms, values RMS-normalised, no score scale, a
    # `layer_output_scale` per layer, the final logits soft-capped at 15 (to bite). Gemma 4's
    # own vocabulary and template.
    "gemma4": dict(vocab="gemma-4", template="google-gemma-4-31B-it.jinja", head_dim=64,
                   rope_base=1_000_000.0, qkv_bias=False, qk_norm=True, gemma=True, layers=6,
                   post_norm=1.0, gemma4=dict(swa_head=32, swa_kv=2, kv=1),
                   keys={"attention.sliding_window": WINDOW, "rope.freq_base_swa": 10_000.0,
                         "attention.key_length_swa": 32, "attention.value_length_swa": 32,
                         "rope.dimension_count_swa": 32, "embedding_length_per_layer_input": 0,
                         "final_logit_softcapping": 15.0}),
    # Qwen3.5 MoE: Qwen3.5's layers with a mixture of 8 SwiGLU experts of which 2 are used (the
    # real 35B-A3B: 256 and 8) and a shared expert behind a sigmoid gate.
    "qwen35moe": dict(vocab="qwen35", template="Qwen3.5-4B.jinja", head_dim=64, rope_dim=16,
                      rope_base=10_000_000.0, qkv_bias=False, qk_norm=True, layers=4,
                      ffn_norm="post_attention_norm", gated_query=True,
                      delta=dict(conv=4, head=32, k_heads=2, v_heads=4, interval=4),
                      sections=[3, 3, 2, 0],
                      experts=dict(count=8, used=2, ff=96, router_std=1.5, shared_ff=128),
                      k=dict(experts=dict(count=8, used=2, ff=256, router_std=1.5,
                                          shared_ff=256))),
}

# Mistral's control tokens (Nemo's, and the v11 tokenizer's `[ARGS]` and `[CALL_ID]`), so
# forced tool calls can name them.
MISTRAL_TOKENS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                  "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                  "[ARGS]", "[CALL_ID]"]
# Llama's block (Mistral 7B is a llama model), on llama.cpp's SentencePiece test vocabulary.
MISTRAL = dict(vocab="llama-spm", head_dim=32, rope_base=1_000_000.0, qkv_bias=False,
               qk_norm=False, extra_tokens=MISTRAL_TOKENS)

# The same weights under another family's template: one Q8_0 file each.
VARIANTS = {
    # A thinking model: the DeepSeek-R1 Qwen distills' template opens the `<think>` block
    # itself, so a random-weight model answers inside it (the reasoning tests, issue 16).
    "deepseek-r1-qwen": ("qwen2", dict(FAMILIES["qwen2"],
                                       template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")),
    # Mistral's tool calls, in both forms (issue 16): Nemo's `[TOOL_CALLS][{…}]` and Small
    # 3.2's `[TOOL_CALLS]name[ARGS]{…}`.
    "mistral-nemo": ("llama", dict(MISTRAL, template="mistralai-Mistral-Nemo-Instruct-2407.jinja")),
    "mistral-small": ("llama", dict(MISTRAL, template="Mistral-Small-3.2-24B-Instruct-2506.jinja")),
    # Qwen3.5 with a multi-token-prediction block after its own four (issue 41): skipped as
    # llama.cpp's main pass skips it, so its logits are the plain file's.
    "qwen35-mtp": ("qwen35", dict(FAMILIES["qwen35"], mtp=True)),
    # Gemma 3 for the image tests (issue 42): its weights with a window of 1,024, so that the
    # image a question is about stays in sight of every layer (with the window of 8, only the
    # global layer would see it, and the answer would barely depend on it).
    "gemma3v": ("gemma3", dict(FAMILIES["gemma3"],
                               keys=dict(FAMILIES["gemma3"]["keys"],
                                         **{"attention.sliding_window": 1024}))),
    # Qwen2.5-VL's text model for the image tests (issue 42): Qwen2's block under its own
    # architecture, `qwen2vl`, with M-RoPE's consecutive sections (4, 6, 6 of the head's 16
    # pairs: time, height, width, as the real 16, 24, 24 of 64), which turn alike on text and
    # by an image row's place in the picture.
    "qwen2vl": ("qwen2vl", dict(FAMILIES["qwen2"], sections=[4, 6, 6, 0])),
    # Qwen3-VL's text model for the image tests (issue 42): Qwen3's block under its own
    # architecture, `qwen3vl`, with M-RoPE's interleaved sections (12, 10, 10 of the head's 32
    # pairs, as the real 24, 20, 20 of 64), four layers and two deepstack layers: an image row
    # brings two more rows, added to the residual stream after layers 0 and 1 (llama.cpp cannot
    # add one after the last layer, whose rows it has cut to the outputs by then).
    "qwen3vl": ("qwen3vl", dict(FAMILIES["qwen3"], sections=[12, 10, 10, 0], layers=4,
                                keys={"n_deepstack_layers": 2})),
    # Qwen3-VL 30B-A3B's text model: the same with Qwen3 MoE's mixture of experts.
    "qwen3vlmoe": ("qwen3vlmoe", dict(FAMILIES["qwen3moe"], sections=[12, 10, 10, 0], layers=4,
                                      keys={"n_deepstack_layers": 2})),
    # Gemma 4 for the image tests (issue 42): its weights with a window of 1,024, as gemma3v's.
    "gemma4v": ("gemma4", dict(FAMILIES["gemma4"],
                               keys=dict(FAMILIES["gemma4"]["keys"],
                                         **{"attention.sliding_window": 1024}))),
    # Gemma 4 E2B/E4B's block (issue 41): six layers, a global one every third, per-layer
    # embeddings 32 wide (each layer's own row of every token, a projection of the residual
    # stream to them, and a gated step per layer), and the last three layers reading the keys
    # and values of layers 1 (windowed) and 2 (global), as llama.cpp picks them; those layers
    # still carry `attn_k`/`attn_v`, which must go unread. In F16, Q8_0 and Q4_0.
    "gemma4e": ("gemma4", dict(FAMILIES["gemma4"], per_layer=32, shared_kv=3,
                               gemma4=dict(FAMILIES["gemma4"]["gemma4"], every=3),
                               keys=dict(FAMILIES["gemma4"]["keys"],
                                         embedding_length_per_layer_input=32,
                                         **{"attention.shared_kv_layers": 3}),
                               formats=(gguf.GGMLQuantizationType.F16,
                                        gguf.GGMLQuantizationType.Q8_0,
                                        gguf.GGMLQuantizationType.Q4_0))),
    # Gemma 4 26B-A4B's block (issue 41): the gemma4 model with, beside each layer's MLP, a
    # mixture of 8 GELU experts of which 2 are used, their gate and up in one tensor as the
    # converter writes them, each expert's output scale, the router reading the residual
    # stream normalised and scaled per value, and the mixture's own norms. In F16 and Q8_0.
    "gemma4moe": ("gemma4", dict(FAMILIES["gemma4"],
                                 experts=dict(count=8, used=2, ff=96, router_std=1.5),
                                 formats=(gguf.GGMLQuantizationType.F16,
                                          gguf.GGMLQuantizationType.Q8_0))),
}


def assets() -> Path:
    out = subprocess.run(["bash", str(ROOT / "scripts/fetch-llama-cpp-assets.sh")],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def copy_tokenizer(writer: gguf.GGUFWriter, vocab_file: Path, extra=()):
    """Every `tokenizer.*` key of llama.cpp's vocab-only file, as it is, with `extra` control
    tokens appended."""
    reader = gguf.GGUFReader(vocab_file)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or name == "tokenizer.chat_template":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            if extra and name == "tokenizer.ggml.tokens":
                values += list(extra)
            elif extra and name == "tokenizer.ggml.scores":
                values += [0.0] * len(extra)
            elif extra and name == "tokenizer.ggml.token_type":
                values += [int(gguf.TokenType.CONTROL)] * len(extra)
            writer.add_array(name, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode())
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data) + len(extra)
    return n_vocab


def write(family: str, spec: dict, qtype: gguf.GGMLQuantizationType, path: Path, models: Path,
          hidden: int = HIDDEN, ff: int = FF, experts_qtype=None):
    """`experts_qtype`: the experts' format where it is not the other matrices' (MXFP4)."""
    rng = np.random.default_rng(1234)
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), family)
    w.add_name(f"{family} test model (random weights)")
    n_vocab = copy_tokenizer(w, models / f"ggml-vocab-{spec['vocab']}.gguf",
                             spec.get("extra_tokens", ()))
    w.add_chat_template((models / "templates" / spec["template"]).read_text(encoding="utf-8"))
    hd = spec["head_dim"]
    layers = spec.get("layers", LAYERS)
    gemma = spec.get("gemma", False)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    # A multi-token-prediction block follows the model's own where the spec asks (`mtp`).
    w.add_block_count(layers + (1 if spec.get("mtp") else 0))
    if spec.get("mtp"):
        w.add_uint32(f"{family}.nextn_predict_layers", 1)
    w.add_feed_forward_length(ff)
    experts = spec.get("experts")
    if experts:
        w.add_expert_count(experts["count"])
        w.add_expert_used_count(experts["used"])
        w.add_expert_feed_forward_length(experts["ff"])
        if experts.get("shared_ff"):
            w.add_expert_shared_feed_forward_length(experts["shared_ff"])
    w.add_head_count(HEADS)
    g4 = spec.get("gemma4")
    if g4:
        # The windowed layers' key/value heads and the global ones' (every sixth, or the
        # spec's `every`), and which are windowed.
        every = g4.get("every", 6)
        swa = [i % every != every - 1 for i in range(spec["layers"])]
        w.add_head_count_kv([g4["swa_kv"] if s else g4["kv"] for s in swa])
        w.add_array(f"{family}.attention.sliding_window_pattern", swa)
    else:
        w.add_head_count_kv(KV_HEADS)
    w.add_key_length(hd)
    w.add_value_length(hd)
    rope_dim = spec.get("rope_dim", hd)
    w.add_rope_dimension_count(rope_dim)
    w.add_rope_freq_base(spec["rope_base"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if experts_qtype == MXFP4 else int(qtype))
    delta = spec.get("delta")
    if delta:
        w.add_ssm_conv_kernel(delta["conv"])
        w.add_ssm_state_size(delta["head"])
        w.add_ssm_group_count(delta["k_heads"])
        w.add_ssm_time_step_rank(delta["v_heads"])
        w.add_ssm_inner_size(delta["head"] * delta["v_heads"])
        w.add_full_attention_interval(delta["interval"])
    if spec.get("sections"):
        w.add_rope_dimension_sections(spec["sections"])
    for key, value in spec.get("keys", {}).items():
        key = f"{family}.{key}"
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_float32(key, value)

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def quantized(name, data, as_type=qtype):
        w.add_tensor(name, gguf.quants.quantize(data, as_type), raw_dtype=as_type)

    def matrix(name, rows, cols, std):
        quantized(name, normal((rows, cols), std))

    def vector(name, n, mean, std):
        w.add_tensor(name, (np.float32(mean) + normal((n,), std)).astype(np.float32))

    if gemma:
        # Gemma ties the output to the embedding, which it scales by √hidden: rows of RMS
        # 1/√hidden enter the residual at unit RMS. The final norm's weights spread the logits by
        # a few units, and the post-norms make the blocks' outputs outweigh the embedding, so
        # the greedy text does not echo the input token back: twice the unit scale with two
        # layers, the unit scale with six (larger, the six-layer model turns chaotic: its logits
        # move by tenths under rounding differences that a two-layer model shrugs off).
        matrix("token_embd.weight", n_vocab, hidden, 1.0 / np.sqrt(hidden))
        vector("output_norm.weight", hidden, spec.get("logit_scale", 3.5), 0.3)
    else:
        # Embeddings of unit scale; an untied output projection whose logits spread by a few
        # units (after the final norm a row has unit RMS: logit std ≈ std · √hidden).
        matrix("token_embd.weight", n_vocab, hidden, 1.0)
        matrix("output.weight", n_vocab, hidden, 3.5 / np.sqrt(hidden))
        vector("output_norm.weight", hidden, 1.0, 0.1)
    q_width, kv_width = HEADS * hd, KV_HEADS * hd
    if spec.get("rope_factors"):
        # Per-pair divisors of the RoPE frequencies, as Phi-3's long-context files carry them:
        # the long ones spread over 1-8, the short ones near 1.
        w.add_tensor("rope_factors_long.weight",
                     rng.uniform(1.0, 8.0, rope_dim // 2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight",
                     rng.uniform(1.0, 1.5, rope_dim // 2).astype(np.float32))
    if g4:
        # Gemma 4's global layers' RoPE frequency factors (its "proportional" RoPE).
        w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 4.0, hd // 2).astype(np.float32))
    per_layer = spec.get("per_layer", 0)
    if per_layer:
        # Per-layer embeddings: rows that the model scales by √width to unit size, the
        # projection of the residual stream (normalised after it) and the norm's weights.
        all_layers = per_layer * layers
        matrix("per_layer_token_embd.weight", n_vocab, all_layers, 1.0 / np.sqrt(per_layer))
        matrix("per_layer_model_proj.weight", all_layers, hidden, 1.0 / np.sqrt(hidden))
        vector("per_layer_proj_norm.weight", per_layer, 1.0, 0.1)
    fused = spec.get("fused", False)
    oss = spec.get("oss", False)
    ffn_norm = "post_attention_norm" if oss else spec.get("ffn_norm", "ffn_norm")
    for i in range(layers):
        p = f"blk.{i}"
        vector(f"{p}.attn_norm.weight", hidden, 1.0, 0.1)
        vector(f"{p}.{ffn_norm}.weight", hidden, 1.0, 0.1)
        if g4:
            write_gemma4_attention(w, p, spec, g4, i, hidden, normal, quantized, matrix, vector)
            write_ffn(w, p, {}, hidden, ff, normal, quantized, matrix, vector, fused,
                      experts_qtype, qtype)
            if experts:
                write_gemma4_experts(w, p, spec, experts, hidden, normal, quantized, vector)
            if per_layer:
                # The layer's gated step: its gate, projection back and norm (as the
                # post-norms).
                post = spec["post_norm"]
                matrix(f"{p}.inp_gate.weight", per_layer, hidden, 1.0 / np.sqrt(hidden))
                matrix(f"{p}.proj.weight", hidden, per_layer, 1.0 / np.sqrt(per_layer))
                vector(f"{p}.post_norm.weight", hidden, post, 0.1 * post)
            continue
        if delta and (i + 1) % delta["interval"] != 0:
            write_delta_net(w, p, delta, hidden, normal, matrix, vector, rng)
            write_ffn(w, p, spec, hidden, ff, normal, quantized, matrix, vector, fused,
                      experts_qtype, qtype)
            continue
        if oss:
            # Sinks about as large as the scores, so that heads attend to them in part.
            vector(f"{p}.attn_sinks.weight", HEADS, 0.0, 1.0)
            vector(f"{p}.attn_output.bias", hidden, 0.0, 0.2)
        if gemma:
            post = spec["post_norm"]
            vector(f"{p}.post_attention_norm.weight", hidden, post, 0.1 * post)
            vector(f"{p}.post_ffw_norm.weight", hidden, post, 0.1 * post)
        # A gated query's projection gives each head's query, then its gate.
        q = normal((2 * q_width if spec.get("gated_query") else q_width, hidden),
                   1.5 / np.sqrt(hidden))
        k = normal((kv_width, hidden), 1.5 / np.sqrt(hidden))
        v = normal((kv_width, hidden), 1.0 / np.sqrt(hidden))
        if fused:
            quantized(f"{p}.attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            quantized(f"{p}.attn_q.weight", q)
            quantized(f"{p}.attn_k.weight", k)
            quantized(f"{p}.attn_v.weight", v)
        matrix(f"{p}.attn_output.weight", hidden, q_width, 1.0 / np.sqrt(q_width))
        if spec["qkv_bias"]:
            vector(f"{p}.attn_q.bias", q_width, 0.0, 0.5)
            vector(f"{p}.attn_k.bias", kv_width, 0.0, 0.5)
            vector(f"{p}.attn_v.bias", kv_width, 0.0, 0.2)
        if spec["qk_norm"]:
            vector(f"{p}.attn_q_norm.weight", hd, 1.0, 0.2)
            vector(f"{p}.attn_k_norm.weight", hd, 1.0, 0.2)
        write_ffn(w, p, spec, hidden, ff, normal, quantized, matrix, vector, fused, experts_qtype,
                  qtype)
    if spec.get("mtp"):
        # Qwen3.5's MTP block (an attention layer and the `nextn.*` tensors), drawn after the
        # model's own so that those are the plain file's: llama.cpp's main pass skips it.
        p = f"blk.{layers}"
        for n in ["attn_norm", "post_attention_norm"]:
            vector(f"{p}.{n}.weight", hidden, 1.0, 0.1)
        matrix(f"{p}.attn_q.weight", 2 * q_width, hidden, 1.5 / np.sqrt(hidden))
        matrix(f"{p}.attn_k.weight", kv_width, hidden, 1.5 / np.sqrt(hidden))
        matrix(f"{p}.attn_v.weight", kv_width, hidden, 1.0 / np.sqrt(hidden))
        matrix(f"{p}.attn_output.weight", hidden, q_width, 1.0 / np.sqrt(q_width))
        vector(f"{p}.attn_q_norm.weight", hd, 1.0, 0.2)
        vector(f"{p}.attn_k_norm.weight", hd, 1.0, 0.2)
        write_ffn(w, p, {}, hidden, ff, normal, quantized, matrix, vector, False, None, qtype)
        matrix(f"{p}.nextn.eh_proj.weight", hidden, 2 * hidden, 1.0 / np.sqrt(2 * hidden))
        for n in ["enorm", "hnorm", "shared_head_norm"]:
            vector(f"{p}.nextn.{n}.weight", hidden, 1.0, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)  # a run cut short leaves no file that looks whole
    return path


def write_ffn(w, p, spec, hidden, ff, normal, quantized, matrix, vector, fused, experts_qtype,
              qtype):
    """The feed-forward: a mixture's router and experts (each projection of every expert as one
    tensor, `[experts, rows, columns]`) and its shared expert where the family has one, or one
    gated MLP (gate and up in one tensor where `fused`, the gate first), then down."""
    experts = spec.get("experts")
    if experts:
        # The router (F32, as converted files keep it).
        n, eff = experts["count"], experts["ff"]
        w.add_tensor(f"{p}.ffn_gate_inp.weight",
                     normal((n, hidden), experts["router_std"] / np.sqrt(hidden)))
        et = experts_qtype or qtype
        quantized(f"{p}.ffn_gate_exps.weight", normal((n, eff, hidden), 1.0 / np.sqrt(hidden)), et)
        quantized(f"{p}.ffn_up_exps.weight", normal((n, eff, hidden), 1.0 / np.sqrt(hidden)), et)
        quantized(f"{p}.ffn_down_exps.weight", normal((n, hidden, eff), 1.0 / np.sqrt(eff)), et)
        if spec.get("oss"):
            # The router's bias and each expert's projections' (F32, as converted).
            vector(f"{p}.ffn_gate_inp.bias", n, 0.0, 0.5)
            w.add_tensor(f"{p}.ffn_gate_exps.bias", normal((n, eff), 0.2))
            w.add_tensor(f"{p}.ffn_up_exps.bias", normal((n, eff), 0.2))
            w.add_tensor(f"{p}.ffn_down_exps.bias", normal((n, hidden), 0.2))
        if experts.get("shared_ff"):
            # The shared expert, and its gate's logit (a vector, F32 as converted), spread
            # so that the gate's sigmoid ranges over about 0.2 to 0.8.
            sff = experts["shared_ff"]
            matrix(f"{p}.ffn_gate_shexp.weight", sff, hidden, 1.0 / np.sqrt(hidden))
            matrix(f"{p}.ffn_up_shexp.weight", sff, hidden, 1.0 / np.sqrt(hidden))
            matrix(f"{p}.ffn_down_shexp.weight", hidden, sff, 1.0 / np.sqrt(sff))
            w.add_tensor(f"{p}.ffn_gate_inp_shexp.weight", normal((hidden,), 1.0 / np.sqrt(hidden)))
        return
    gate = normal((ff, hidden), 1.0 / np.sqrt(hidden))
    up = normal((ff, hidden), 1.0 / np.sqrt(hidden))
    if fused:
        quantized(f"{p}.ffn_up.weight", np.concatenate([gate, up]))
    else:
        quantized(f"{p}.ffn_gate.weight", gate)
        quantized(f"{p}.ffn_up.weight", up)
    matrix(f"{p}.ffn_down.weight", hidden, ff, 1.0 / np.sqrt(ff))


def write_gemma4_attention(w, p, spec, g4, i, hidden, normal, quantized, matrix, vector):
    """A Gemma 4 layer's attention and its norms: a windowed layer's heads of `swa_head` with
    `swa_kv` key/value heads and an `attn_v`, a global layer's (every sixth) of the model's
    head size with `kv` key/value heads and none (its values are its keys' projection)."""
    every = g4.get("every", 6)
    swa = i % every != every - 1
    hd, kv = (g4["swa_head"], g4["swa_kv"]) if swa else (spec["head_dim"], g4["kv"])
    post = spec["post_norm"]
    vector(f"{p}.post_attention_norm.weight", hidden, post, 0.1 * post)
    vector(f"{p}.post_ffw_norm.weight", hidden, post, 0.1 * post)
    matrix(f"{p}.attn_q.weight", HEADS * hd, hidden, 1.5 / np.sqrt(hidden))
    matrix(f"{p}.attn_k.weight", kv * hd, hidden, 1.5 / np.sqrt(hidden))
    if swa:
        matrix(f"{p}.attn_v.weight", kv * hd, hidden, 1.0 / np.sqrt(hidden))
    matrix(f"{p}.attn_output.weight", hidden, HEADS * hd, 1.0 / np.sqrt(HEADS * hd))
    # With no score scale, the q/k norms' weights set the scores' spread: about hd^-1/4 each
    # keeps them near unit variance (as `1/√head_dim` would), so that attention is not an
    # argmax that any rounding flips.
    g = hd ** -0.25
    vector(f"{p}.attn_q_norm.weight", hd, g, 0.2 * g)
    vector(f"{p}.attn_k_norm.weight", hd, g, 0.2 * g)
    vector(f"{p}.layer_output_scale.weight", 1, 1.0, 0.05)


def write_gemma4_experts(w, p, spec, experts, hidden, normal, quantized, vector):
    """Gemma 4's mixture beside a layer's MLP, as llama.cpp's converter writes 26B-A4B's: the
    router (F32) and its scale per input value, every expert's gate and up in one tensor (the
    gate first) and down, each expert's output scale, and the norms before the experts and
    after the MLP and the experts."""
    n, eff = experts["count"], experts["ff"]
    # The router reads a row of RMS 1/√hidden: weights of `router_std` spread its logits so.
    w.add_tensor(f"{p}.ffn_gate_inp.weight", normal((n, hidden), experts["router_std"]))
    vector(f"{p}.ffn_gate_inp.scale", hidden, 1.0, 0.2)
    gate_up = np.concatenate([normal((n, eff, hidden), 1.0 / np.sqrt(hidden)),
                              normal((n, eff, hidden), 1.0 / np.sqrt(hidden))], axis=1)
    quantized(f"{p}.ffn_gate_up_exps.weight", gate_up)
    quantized(f"{p}.ffn_down_exps.weight", normal((n, hidden, eff), 1.0 / np.sqrt(eff)))
    vector(f"{p}.ffn_down_exps.scale", n, 1.0, 0.3)
    post = spec["post_norm"]
    vector(f"{p}.pre_ffw_norm_2.weight", hidden, 1.0, 0.1)
    vector(f"{p}.post_ffw_norm_1.weight", hidden, post, 0.1 * post)
    vector(f"{p}.post_ffw_norm_2.weight", hidden, post, 0.1 * post)


def write_delta_net(w, p, d, hidden, normal, matrix, vector, rng):
    """A Gated DeltaNet layer's tensors, named and laid out as llama.cpp's converter writes
    Qwen3.5's: the queries, keys and values before the convolution (`attn_qkv`), the output
    gate (`attn_gate`), β and α's projections, the convolution's taps and the decay's bias and
    `A` (`−exp(A_log)`) in F32, the output norm and projection. The decays `e^(softplus(α + dt)·A)`
    spread over about 0.3 to 0.95, so each state remembers a few tokens to tens of them."""
    keys, values = d["head"] * d["k_heads"], d["head"] * d["v_heads"]
    conv = 2 * keys + values
    matrix(f"{p}.attn_qkv.weight", conv, hidden, 1.0 / np.sqrt(hidden))
    matrix(f"{p}.attn_gate.weight", values, hidden, 1.0 / np.sqrt(hidden))
    matrix(f"{p}.ssm_beta.weight", d["v_heads"], hidden, 1.0 / np.sqrt(hidden))
    matrix(f"{p}.ssm_alpha.weight", d["v_heads"], hidden, 1.0 / np.sqrt(hidden))
    w.add_tensor(f"{p}.ssm_conv1d.weight", normal((conv, d["conv"]), 0.5))
    vector(f"{p}.ssm_dt.bias", d["v_heads"], 0.0, 0.5)
    w.add_tensor(f"{p}.ssm_a", -rng.uniform(0.1, 1.5, d["v_heads"]).astype(np.float32))
    vector(f"{p}.ssm_norm.weight", d["head"], 1.0, 0.1)
    matrix(f"{p}.ssm_out.weight", hidden, values, 1.0 / np.sqrt(values))


def quantize_k(family: str, out: Path, models: Path, name: str = "Q4_K_M") -> Path:
    """`<family>-test.<name>.gguf` (Q4_K_M, Q5_K_M), as llama.cpp's quantiser makes it from
    F16 weights of K-quant widths."""
    path = out / f"{family}-test.{name}.gguf"
    # A family may change a scale at these widths (`k`), to keep its text from echoing.
    spec = {**FAMILIES[family], **FAMILIES[family].get("k", {})}
    source = write(family, spec, gguf.GGMLQuantizationType.F16,
                   out / f"{family}-test.k-source.F16.gguf", models, hidden=K_HIDDEN, ff=K_FF)
    # The build's progress, and any error, goes to stderr.
    tool = subprocess.run(["bash", str(ROOT / "scripts/build-llama-quantize.sh")], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    tmp = path.with_suffix(".partial")
    run = subprocess.run([tool, str(source), str(tmp), name], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"llama-quantize failed on {source}:\n{run.stderr}")
    source.unlink()
    tmp.rename(path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "models/test-models")
    ap.add_argument("--force", action="store_true", help="write files that are there already")
    ap.add_argument("families", nargs="*", help="families or variants (default: all)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    models = assets()
    for family in [f for f in FAMILIES if not a.families or f in a.families]:
        formats = FAMILIES[family].get("formats", (
            gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
            gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q4_1, "Q4_K_M", "Q5_K_M"))
        for qtype in formats:
            label = getattr(qtype, "name", qtype)
            path = a.out / f"{family}-test.{label}.gguf"
            # Written once: the same seed gives the same bytes (the parity test checks them).
            if path.is_file() and not a.force:
                print(path)
            elif qtype == "MXFP4":
                print(write(family, FAMILIES[family], gguf.GGMLQuantizationType.Q8_0, path,
                            models, experts_qtype=MXFP4))
            elif isinstance(qtype, str):
                print(quantize_k(family, a.out, models, qtype))
            else:
                print(write(family, FAMILIES[family], qtype, path, models))
    for name, (family, spec) in VARIANTS.items():
        # All of them by default; when families are named, those of them or named themselves.
        if a.families and family not in a.families and name not in a.families:
            continue
        for qtype in spec.get("formats", (gguf.GGMLQuantizationType.Q8_0,)):
            path = a.out / f"{name}-test.{qtype.name}.gguf"
            if path.is_file() and not a.force:
                print(path)
            else:
                print(write(family, spec, qtype, path, models))


if __name__ == "__main__":
    sys.exit(main())
