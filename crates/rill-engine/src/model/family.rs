//! Model families as descriptions of how their transformer block differs from llama's (issue
//! 14): RoPE pairing, biases, q/k norms, the gate's activation, post-norms, the embedding
//! scale, soft-caps, sliding windows, the query scale and fused projections. One block
//! (`decoder.rs`) executes every description, on our kernels (CPU) and on candle's tensors (GPU);
//! a family is not a copy of the block. llama.cpp's `src/models/<family>.cpp` show each graph;
//! the fields below are what separates them.

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama.cpp's "normal": Llama, Mistral, as GGUF's
    /// converter permutes their weights).
    Normal,
    /// Halves `(x[i], x[i + d/2])` (llama.cpp's "NEOX": Qwen, Gemma, Phi-3).
    Neox,
}

/// How M-RoPE's sections (`rope.dimension_sections`) share a head's pairs among a token's
/// positions (time, height, width, extra): where a file has sections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mrope {
    /// Consecutive runs of pairs, one per section (ggml's `MROPE`: Qwen2-VL, Qwen2.5-VL).
    Sectioned,
    /// Pairs cycling through the sections (ggml's `IMROPE`: Qwen3-VL, Qwen3.5).
    Interleaved,
}

/// The feed-forward gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (Llama, Qwen, Phi-3).
    Silu,
    /// `gelu(gate) · up` with GELU's tanh approximation (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): the gate capped at 7 and the up clamped
    /// to ±7, then `g · σ(1.702·g) · (u + 1)`.
    SwigluOai,
}

/// Which layers attend over a sliding window of the last positions, and how (Gemma). A cycle of
/// `pattern` layers has `pattern − 1` windowed layers, then one over the whole context, unless
/// the file lists them (`attention.sliding_window_pattern`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    pub pattern: usize,
    /// The window when the file does not say (`attention.sliding_window`); `None`: without
    /// the key, no layer is windowed (Gemma 3).
    pub default_window: Option<usize>,
    /// The windowed layers' RoPE when the file has no `rope.freq_base_swa`: `None`, the global
    /// layers' base and scaling (Gemma 2); else this base, unscaled (Gemma 3's 10,000).
    pub default_base: Option<f32>,
}

/// How the queries are scaled before their dot products with the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryScale {
    /// `1/√head_dim`, on the scores.
    HeadDim,
    /// None at all (Gemma 4: its q/k norms set the scores' scale).
    One,
    /// `1/√head_dim`, on the queries before the scores (Phi-3: llama.cpp scales them there,
    /// which decides where they are rounded to f16).
    QueriesByHeadDim,
    /// Gemma's: `1/√(width / heads)` for the 27B (as llama.cpp tells it: by its layer count),
    /// `1/√head_dim` otherwise; applied to the queries before the scores.
    Gemma { layers_27b: usize },
}

/// How a mixture of experts' router turns its logits into the experts a row goes through and
/// their weights (llama.cpp's `build_moe_ffn`, `llama-graph.cpp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over every expert, the `k` likeliest chosen, their probabilities divided by
    /// their sum (Qwen3 MoE: llama.cpp's softmax gating with `norm_w`).
    SoftmaxTopK,
    /// The `k` largest logits chosen, their weights a softmax over those `k` alone (gpt-oss:
    /// llama.cpp's `SOFTMAX_WEIGHT` gating).
    TopKSoftmax,
}

/// What a family's block does beyond llama's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Family {
    /// `general.architecture`, which also prefixes its metadata keys.
    pub arch: &'static str,
    pub rope: RopeStyle,
    /// `attn_q.bias`, `attn_k.bias`, `attn_v.bias` are added after the projections (Qwen2).
    pub qkv_bias: bool,
    /// Each head's query and key are RMS-normalised before RoPE (`attn_q_norm`,
    /// `attn_k_norm`; Qwen3, Gemma 3).
    pub qk_norm: bool,
    pub activation: Activation,
    /// The attention's and the feed-forward's outputs are RMS-normalised before their residual
    /// adds (`attn_post_norm`, `ffn_post_norm`; Gemma).
    pub post_norms: bool,
    /// The embeddings are multiplied by `√width` (Gemma).
    pub embed_scale: bool,
    /// Attention scores are soft-capped, `c · tanh(s / c)`, with `c` from the file's
    /// `attn_logit_softcapping`, this when it has none (Gemma 2: 50).
    pub attn_softcap: Option<f32>,
    /// The logits are soft-capped likewise: `final_logit_softcapping`, this when the file has
    /// none (Gemma 2: 30). Gemma 3 caps them only when its file says.
    pub final_softcap: Option<f32>,
    /// Whether the file's soft-capping keys are read at all (the Gemmas).
    pub softcap_keys: bool,
    pub sliding_window: Option<SlidingWindow>,
    pub query_scale: QueryScale,
    /// Round as llama.cpp does where candle and llama.cpp differ, so that the answers are
    /// llama.cpp's, not merely close: attention weights rounded to f16 before they weigh the
    /// values (`attention::Scores::f16_weights`), RMS norms summed in f64 and scaled by the
    /// inverse root (`ops::rms_norm_like_ggml`). Every family but llama and mistral, whose
    /// answers stay bit for bit what they were before the families came.
    pub llama_cpp_rounding: bool,
    /// The gate and up projections are one tensor, `ffn_up` of twice the feed-forward width,
    /// gate first (Phi-3). A fused `attn_qkv` is read wherever a file has one.
    pub fused_gate_up: bool,
    /// The feed-forward is a mixture of experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`)
    /// routed this way, instead of one SwiGLU (`model/experts.rs`).
    pub experts: Option<Gating>,
    /// The router and every expert's projections add biases (`ffn_gate_inp.bias`,
    /// `ffn_{gate,up,down}_exps.bias`; gpt-oss).
    pub expert_biases: bool,
    /// The attention's output projection adds a bias (`attn_output.bias`; gpt-oss).
    pub out_bias: bool,
    /// Each query head has a learned sink logit in its softmax (`attn_sinks`; gpt-oss).
    pub attn_sinks: bool,
    /// The name of the norm before the feed-forward: `ffn_norm`, or gpt-oss's and Qwen3.5's
    /// `post_attention_norm`.
    pub ffn_norm: &'static str,
    /// The query projection gives each head's query and then an output gate of the same
    /// width; the attention's output is multiplied by the gate's sigmoid before its
    /// projection (Qwen3.5's full-attention layers).
    pub gated_query: bool,
    /// Most layers are Gated DeltaNet layers (linear attention with a recurrent state,
    /// `model/delta.rs`) and every few one is attention (Qwen3.5).
    pub delta_net: bool,
    /// A mixture's rows also go through one shared SwiGLU expert (`ffn_{gate,up,down}_shexp`),
    /// weighed by the sigmoid of its own gate's logit (`ffn_gate_inp_shexp`; Qwen3.5 MoE).
    pub shared_expert: bool,
    /// The windowed layers' heads have a width and RoPE of their own (`key_length_swa`,
    /// `rope.dimension_count_swa`), the global layers' RoPE the file's `rope_freqs`, the
    /// windowed layers' none (Gemma 4).
    pub swa_heads: bool,
    /// A layer may have no `attn_v`: its values are then its keys' projection; values are
    /// RMS-normalised without weights (Gemma 4).
    pub v_norm: bool,
    /// Each layer's output is multiplied by its `layer_output_scale` where the file has one
    /// (Gemma 4).
    pub layer_scale: bool,
    /// Where a file has a mixture (`expert_count`), its layers run it beside their dense MLP,
    /// each with norms of its own, the router reading the residual stream normalised and
    /// scaled per value (`ffn_gate_inp.scale`): Gemma 4 26B-A4B (`model/experts.rs`).
    pub experts_beside_mlp: bool,
    /// How the file's M-RoPE sections share the pairs, where it has them.
    pub mrope: Mrope,
}

const LLAMA: Family = Family {
    arch: "llama",
    rope: RopeStyle::Normal,
    qkv_bias: false,
    qk_norm: false,
    activation: Activation::Silu,
    post_norms: false,
    embed_scale: false,
    attn_softcap: None,
    final_softcap: None,
    softcap_keys: false,
    sliding_window: None,
    query_scale: QueryScale::HeadDim,
    llama_cpp_rounding: false,
    fused_gate_up: false,
    experts: None,
    expert_biases: false,
    out_bias: false,
    attn_sinks: false,
    ffn_norm: "ffn_norm",
    gated_query: false,
    delta_net: false,
    shared_expert: false,
    swa_heads: false,
    v_norm: false,
    layer_scale: false,
    experts_beside_mlp: false,
    mrope: Mrope::Interleaved,
};

/// Gemma's block: GELU, post-norms, √width embeddings, NEOX, queries pre-scaled.
const GEMMA: Family = Family {
    arch: "gemma2",
    rope: RopeStyle::Neox,
    activation: Activation::GeluTanh,
    post_norms: true,
    embed_scale: true,
    attn_softcap: Some(50.0),
    final_softcap: Some(30.0),
    softcap_keys: true,
    sliding_window: Some(SlidingWindow {
        pattern: 2,
        default_window: Some(4096),
        default_base: None,
    }),
    query_scale: QueryScale::Gemma { layers_27b: 46 },
    llama_cpp_rounding: true,
    ..LLAMA
};

/// Qwen3.5 (llama.cpp's `qwen35.cpp`): three Gated DeltaNet layers to one of attention, whose
/// query projection also gives an output gate, with q/k norms and RoPE over a quarter of each
/// head (M-RoPE's sections, which text turns as NEOX does); the norm before the feed-forward
/// named `post_attention_norm`.
const QWEN35: Family = Family {
    arch: "qwen35",
    rope: RopeStyle::Neox,
    qk_norm: true,
    llama_cpp_rounding: true,
    ffn_norm: "post_attention_norm",
    gated_query: true,
    delta_net: true,
    ..LLAMA
};

/// The families Rill runs, by `general.architecture`.
pub const FAMILIES: &[Family] = &[
    LLAMA,
    Family {
        arch: "mistral",
        ..LLAMA
    },
    // Qwen2, Qwen2.5 (and Coder), DeepSeek-R1-Distill-Qwen: llama's block with q/k/v biases and
    // NEOX RoPE.
    Family {
        arch: "qwen2",
        rope: RopeStyle::Neox,
        qkv_bias: true,
        llama_cpp_rounding: true,
        ..LLAMA
    },
    // Qwen2-VL and Qwen2.5-VL's text model: Qwen2's block with M-RoPE in consecutive
    // sections (on text every section turns by the token's position; an image's rows by
    // their place in the picture: `decoder.rs`).
    Family {
        arch: "qwen2vl",
        rope: RopeStyle::Neox,
        qkv_bias: true,
        llama_cpp_rounding: true,
        mrope: Mrope::Sectioned,
        ..LLAMA
    },
    // Qwen3 dense: per-head q/k norms, NEOX, no biases.
    Family {
        arch: "qwen3",
        rope: RopeStyle::Neox,
        qk_norm: true,
        llama_cpp_rounding: true,
        ..LLAMA
    },
    // Qwen3-VL's text model: Qwen3's block with M-RoPE in interleaved sections, and image
    // rows that carry, beside their embedding, one more row per "deepstack" layer, added to
    // the residual stream after each of the first layers (`decoder.rs`).
    Family {
        arch: "qwen3vl",
        rope: RopeStyle::Neox,
        qk_norm: true,
        llama_cpp_rounding: true,
        mrope: Mrope::Interleaved,
        ..LLAMA
    },
    Family {
        arch: "qwen3vlmoe",
        rope: RopeStyle::Neox,
        qk_norm: true,
        llama_cpp_rounding: true,
        experts: Some(Gating::SoftmaxTopK),
        mrope: Mrope::Interleaved,
        ..LLAMA
    },
    // Qwen3 mixtures of experts (Qwen3-30B-A3B and its Coder and 2507 versions, 235B-A22B):
    // Qwen3's attention, and a feed-forward of 128 SwiGLU experts of which a row goes through
    // 8.
    Family {
        arch: "qwen3moe",
        rope: RopeStyle::Neox,
        qk_norm: true,
        llama_cpp_rounding: true,
        experts: Some(Gating::SoftmaxTopK),
        ..LLAMA
    },
    // Gemma 2: attention and final-logit soft-capping, a 4,096-position window on every other
    // layer.
    GEMMA,
    // Gemma 3 (1B, and the text model of 4B/12B/27B): q/k norms, five windowed layers to one
    // global, the windowed ones with a RoPE base of their own.
    Family {
        arch: "gemma3",
        qk_norm: true,
        attn_softcap: None,
        final_softcap: None,
        sliding_window: Some(SlidingWindow {
            pattern: 6,
            default_window: None,
            default_base: Some(10_000.0),
        }),
        query_scale: QueryScale::Gemma { layers_27b: 62 },
        ..GEMMA
    },
    // gpt-oss (20b, 120b; llama.cpp's `openai-moe.cpp`): a mixture of 32 or 128 experts of
    // which a row goes through 4, routed by a softmax over the chosen, each a clamped SwiGLU
    // with biases (MXFP4 weights in the released files); q/k/v and output biases, a sink
    // logit per head, a 128-position window on every other layer, YaRN RoPE.
    Family {
        arch: "gpt-oss",
        rope: RopeStyle::Neox,
        qkv_bias: true,
        activation: Activation::SwigluOai,
        sliding_window: Some(SlidingWindow {
            pattern: 2,
            default_window: Some(128),
            default_base: None,
        }),
        llama_cpp_rounding: true,
        experts: Some(Gating::TopKSoftmax),
        expert_biases: true,
        out_bias: true,
        attn_sinks: true,
        ffn_norm: "post_attention_norm",
        ..LLAMA
    },
    // Gemma 4 (31B, and the text block of its smaller models; llama.cpp's `gemma4.cpp`): Gemma
    // 3's block with windowed layers of narrower heads and their own RoPE, global layers with
    // fewer key/value heads whose values may be their keys, RoPE frequency factors on the
    // global layers, values RMS-normalised, no score scale, a scale on each layer's output and
    // the final logits soft-capped (30 unless the file says).
    Family {
        arch: "gemma4",
        qk_norm: true,
        attn_softcap: None,
        final_softcap: Some(30.0),
        sliding_window: Some(SlidingWindow {
            pattern: 6,
            default_window: None,
            default_base: Some(10_000.0),
        }),
        query_scale: QueryScale::One,
        swa_heads: true,
        v_norm: true,
        layer_scale: true,
        experts: Some(Gating::SoftmaxTopK),
        experts_beside_mlp: true,
        ..GEMMA
    },
    // Qwen3.5 dense (0.8B to 27B).
    QWEN35,
    // Qwen3.5 mixtures of experts (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's layers, and a
    // feed-forward of routed SwiGLU experts (softmax gating, the chosen renormalised) plus a
    // gated shared expert.
    Family {
        arch: "qwen35moe",
        experts: Some(Gating::SoftmaxTopK),
        shared_expert: true,
        ..QWEN35
    },
    // Phi-3/3.5-mini, Phi-4-mini: fused qkv and gate-up, NEOX RoPE over part of each head,
    // long/short RoPE factors (and their attention factor) where the file has them.
    Family {
        arch: "phi3",
        rope: RopeStyle::Neox,
        query_scale: QueryScale::QueriesByHeadDim,
        llama_cpp_rounding: true,
        fused_gate_up: true,
        ..LLAMA
    },
];

impl Family {
    /// Why the family runs on the CPU only (candle's path lacks a step of its block), or
    /// `None`: the one place that decides, read when a model loads off the CPU.
    pub fn host_only(&self) -> Option<&'static str> {
        if self.delta_net || self.gated_query {
            return Some("its Gated DeltaNet layers are on Rill's own kernels");
        }
        if self.swa_heads || self.v_norm || self.layer_scale {
            return Some("its layers of different head sizes are on Rill's own attention");
        }
        match (
            self.attn_sinks,
            self.expert_biases || self.activation == Activation::SwigluOai,
        ) {
            (_, true) => Some("its clamped SwiGLU and MXFP4 experts are on Rill's own kernels"),
            (true, false) => Some("its attention sinks are on Rill's own attention"),
            (false, false) => None,
        }
    }
}

/// The family of `general.architecture = arch`, if Rill runs it.
pub fn of(arch: &str) -> Option<Family> {
    FAMILIES.iter().find(|f| f.arch == arch).copied()
}

/// A family's name for people: "Qwen3", "Gemma 3", "Phi-3"; for an architecture Rill does not
/// run, what it is and that it does not run.
pub fn label(arch: &str) -> String {
    let known = match arch {
        "llama" => "Llama",
        "mistral" => "Mistral",
        "qwen2" => "Qwen2",
        "qwen2vl" => "Qwen2-VL / Qwen2.5-VL",
        "qwen3" => "Qwen3",
        "qwen3moe" => "Qwen3 MoE",
        "qwen3vl" => "Qwen3-VL",
        "qwen3vlmoe" => "Qwen3-VL MoE",
        "gpt-oss" => "gpt-oss",
        "gemma2" => "Gemma 2",
        "gemma3" => "Gemma 3",
        "phi3" => "Phi-3",
        "qwen35" => "Qwen3.5",
        "qwen35moe" => "Qwen3.5 MoE",
        "gemma4" => "Gemma 4",
        _ => return format!("{arch} (not run: {})", not_run(arch)),
    };
    known.to_string()
}

/// The error for a file of architecture `arch`, which no family here runs.
pub fn unsupported(arch: &str) -> crate::error::Error {
    crate::error::Error::UnsupportedArchitecture {
        architecture: arch.to_string(),
        what: not_run(arch),
        families: names(),
    }
}

/// What a file of an architecture Rill does not run is, for its error and its line in the
/// models list.
pub fn not_run(arch: &str) -> &'static str {
    match arch {
        "qwen2moe" => "a Qwen2 mixture of experts (with a shared expert), not run yet",
        "clip" | "mmproj" => "a vision projector (mmproj), which goes beside a model, not a model",
        "gemma" => "the first Gemma, not run",
        "qwen3next" => "a Qwen3-Next: Gated DeltaNet layers beside attention, not run yet",
        "gemma3n" => "a Gemma of a newer block, not run yet",
        "gemma4-assistant" => "Gemma 4's speculative draft head, which goes beside a Gemma 4",
        "phi2" => "Phi-2, not run",
        "bert" | "nomic-bert" | "jina-bert-v2" => "an embedding model, not a chat model",
        _ => "an architecture Rill does not know",
    }
}

/// The architectures Rill runs, for messages: "llama, mistral, qwen2, qwen3".
pub fn names() -> String {
    FAMILIES
        .iter()
        .map(|f| f.arch)
        .collect::<Vec<_>>()
        .join(", ")
}
