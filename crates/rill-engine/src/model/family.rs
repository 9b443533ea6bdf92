//! Model families as descriptions of how their transformer block differs from llama's (issue
//! 14). One block (`llama.rs`) executes every description, on our kernels (CPU) and on candle's
//! tensors (GPU); a family is not a copy of the block. llama.cpp's `src/models/<family>.cpp`
//! show each graph; the fields below are what separates them.

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama.cpp's "normal": Llama, Mistral, as GGUF's
    /// converter permutes their weights).
    Normal,
    /// Halves `(x[i], x[i + d/2])` (llama.cpp's "NEOX": Qwen, Gemma, Phi-3).
    Neox,
}

/// What a family's block does beyond llama's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// `general.architecture`, which also prefixes its metadata keys.
    pub arch: &'static str,
    pub rope: RopeStyle,
    /// `attn_q.bias`, `attn_k.bias`, `attn_v.bias` are added after the projections (Qwen2).
    pub qkv_bias: bool,
    /// Each head's query and key are RMS-normalised before RoPE (`attn_q_norm`,
    /// `attn_k_norm`; Qwen3).
    pub qk_norm: bool,
}

const LLAMA: Family = Family {
    arch: "llama",
    rope: RopeStyle::Normal,
    qkv_bias: false,
    qk_norm: false,
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
        ..LLAMA
    },
    // Qwen3 dense: per-head q/k norms, NEOX, no biases.
    Family {
        arch: "qwen3",
        rope: RopeStyle::Neox,
        qk_norm: true,
        ..LLAMA
    },
];

/// The family of `general.architecture = arch`, if Rill runs it.
pub fn of(arch: &str) -> Option<Family> {
    FAMILIES.iter().find(|f| f.arch == arch).copied()
}

/// The architectures Rill runs, for messages: "llama, mistral, qwen2, qwen3".
pub fn names() -> String {
    FAMILIES
        .iter()
        .map(|f| f.arch)
        .collect::<Vec<_>>()
        .join(", ")
}
