//! What the decoder's block asks of the machine it runs on: the [`Backend`] trait, with one
//! implementation on our kernels and plain host buffers (`host.rs`) and one on candle's tensors
//! (`device.rs`). The block (`decoder.rs`) reads the family's settings and calls these steps;
//! a backend reads no family setting of its own, only what a step is given ([`Attention`]:
//! the scale, cap, window and sinks a layer's scores take).

use super::attention::Rope;
use super::config::DecoderConfig;
use super::delta::DeltaNet;
use super::experts::Experts;
use super::family::{Activation, RopeStyle};
use super::kv::KvCache;
use super::parts::{Bias, Group, Linear, Norm, PerLayerInputs, PerLayerStep, SharedExpert};
use super::workspace::Workspace;
use crate::error::Result;
use candle_core::{Device, Tensor};

/// A RoPE table (cos, sin per position and pair) for candle's attention, and on the host for
/// ours (CPU models).
pub(super) struct RopeTable {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) host: Option<Rope>,
}

/// What a backend reads of the model besides the weights each step is given.
#[derive(Clone, Copy)]
pub(super) struct Parts<'a> {
    pub(super) cfg: &'a DecoderConfig,
    pub(super) ropes: &'a [RopeTable],
    pub(super) device: &'a Device,
    /// The host forward pass's buffers, kept between steps (`host.rs`).
    pub(super) workspace: &'a std::sync::Mutex<Workspace>,
}

/// How one layer's attention weighs its keys, as the decoder reads it from the family.
pub(super) struct Attention<'a> {
    /// The layer's index (its place in each KV cache).
    pub(super) layer: usize,
    /// The layer whose keys and values the queries read: `layer`, whose new keys and values
    /// the step appends, or an earlier one (Gemma 4's shared layers: the step's rows are
    /// queries only, that layer's keys already appended).
    pub(super) kv_layer: usize,
    /// Which of the decoder's RoPE tables the layer uses (the global one, or the windowed
    /// layers' own).
    pub(super) rope: usize,
    /// The dimensions of each head RoPE turns (the first; all but in partial rotary).
    pub(super) rope_dim: usize,
    /// How RoPE pairs them (the host's tables know it already).
    pub(super) rope_style: RopeStyle,
    /// The queries are multiplied by this before their dot products (Phi-3, Gemma); `None`
    /// scales the scores by `1/√head_dim` instead.
    pub(super) prescale: Option<f32>,
    /// Scores soft-capped, `c · tanh(s / c)` (Gemma 2).
    pub(super) softcap: Option<f32>,
    /// Only the last this many positions are attended over.
    pub(super) window: Option<usize>,
    /// Each query head's sink logit in its softmax (gpt-oss).
    pub(super) sinks: Option<&'a [f32]>,
    /// Attention weights rounded to f16 before they weigh the values, as llama.cpp's CPU
    /// does (`family::Family::llama_cpp_rounding`); where a backend's arithmetic has no such
    /// step (candle's), it computes in f32.
    pub(super) f16_weights: bool,
}

/// The steps of the decoder's block on one machine. `Rows` are activations, one row per
/// token of the batch; a step that takes rows by value is their last reader, so a backend
/// may reuse their memory.
pub(super) trait Backend {
    /// `[rows][width]` activations.
    type Rows;
    /// A layer's queries, keys and values for every row.
    type Qkv;

    /// The embedding rows of the batch's tokens (looked up by the decoder), multiplied by
    /// `scale` when given (Gemma's `√width`).
    fn embed(&mut self, rows: Tensor, scale: Option<f32>) -> Result<Self::Rows>;
    /// Row `row` of `x` becomes `values` (an image's row, `inject.rs`), or has them added
    /// (`add`: Qwen3-VL's deepstack rows).
    fn inject(&mut self, x: &mut Self::Rows, row: usize, values: &[f32], add: bool) -> Result<()>;
    /// `norm(x)`, with `x` kept (the residual stream).
    fn norm(&mut self, norm: &Norm, x: &Self::Rows) -> Result<Self::Rows>;
    /// `y ← norm(y)` (Gemma's post-norms).
    fn renorm(&mut self, norm: &Norm, y: &mut Self::Rows) -> Result<()>;
    /// `x · wᵀ`.
    fn linear(&mut self, w: &Linear, x: Self::Rows) -> Result<Self::Rows>;
    /// Adds `bias` to every row (gpt-oss's attention output).
    fn add_bias(&mut self, y: &mut Self::Rows, bias: &[f32]) -> Result<()>;
    /// `x ← x + y`.
    fn residual(&mut self, x: &mut Self::Rows, y: Self::Rows) -> Result<()>;
    /// The q, k and v projections of `h`.
    fn qkv(&mut self, w: &Group, h: Self::Rows) -> Result<Self::Qkv>;
    /// Adds the q/k/v biases (Qwen2).
    fn qkv_bias(&mut self, qkv: &mut Self::Qkv, bias: &Bias) -> Result<()>;
    /// RMS-normalises each head's query and key (Qwen3, Gemma 3), layer `layer`'s heads; the
    /// queries only without `k` (a layer that reads another's keys: `qkv` is queries only).
    fn qk_norm(
        &mut self,
        qkv: &mut Self::Qkv,
        layer: usize,
        q: &Norm,
        k: Option<&Norm>,
    ) -> Result<()>;
    /// Makes q and k (a layer without `attn_v`) q, k and v, the values the keys' projection.
    fn keys_as_values(&mut self, qkv: &mut Self::Qkv, layer: usize) -> Result<()>;
    /// RMS-normalises each value head, without weights (Gemma 4).
    fn v_norm(&mut self, qkv: &mut Self::Qkv, layer: usize) -> Result<()>;
    /// Gemma 4's per-layer inputs of the batch's rows, `[rows][n_layer · width]`: the
    /// projection of the embedded rows `x` scaled by `1/√hidden` and normalised per layer,
    /// plus the tokens' rows of the per-layer table (`table`, looked up by the decoder) scaled
    /// by `√width`, all scaled by `1/√2`.
    fn per_layer_inputs(
        &mut self,
        p: &PerLayerInputs,
        x: &Self::Rows,
        table: Tensor,
    ) -> Result<Self::Rows>;
    /// Layer `layer`'s per-layer embedding step: `x ← x + norm(proj(gelu(gate(x)) · input))`,
    /// `input` the layer's part of `inputs`.
    fn per_layer(
        &mut self,
        step: &PerLayerStep,
        layer: usize,
        inputs: &Self::Rows,
        x: &mut Self::Rows,
    ) -> Result<()>;
    /// `x ← x · s` (Gemma 4's layer output scale).
    fn scale(&mut self, x: &mut Self::Rows, s: f32) -> Result<()>;
    /// RoPE on the new queries and keys, the keys and values appended to each sequence's
    /// cache, then every query over its cache: `[rows][n_head · head_dim]`.
    fn attend(
        &mut self,
        how: &Attention<'_>,
        qkv: Self::Qkv,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Self::Rows>;
    /// One gated MLP: `down(act(gate(h)) · up(h))`.
    fn dense(
        &mut self,
        gate_up: &Group,
        down: &Linear,
        act: Activation,
        h: Self::Rows,
    ) -> Result<Self::Rows>;
    /// A mixture of experts over `h`, routed by the router's logits of `route_by` where given
    /// (Gemma 4's), else of `h`.
    fn experts(
        &mut self,
        experts: &Experts,
        h: Self::Rows,
        route_by: Option<Self::Rows>,
    ) -> Result<Self::Rows>;
    /// A mixture's shared expert: `σ(h · gate) · down(silu(gate(h)) · up(h))` per row.
    fn shared_expert(&mut self, s: &SharedExpert, h: Self::Rows) -> Result<Self::Rows>;
    /// Takes each query head's output gate out of the queries (the query projection gives
    /// `[query | gate]` per head, Qwen3.5), leaving `qkv` as an ungated projection's:
    /// `[rows][n_head · head_dim]` gates.
    fn split_gate(&mut self, qkv: &mut Self::Qkv, layer: usize) -> Result<Self::Rows>;
    /// `y ← y · σ(gate)`.
    fn gate(&mut self, y: &mut Self::Rows, gate: Self::Rows) -> Result<()>;
    /// A Gated DeltaNet layer (`delta.rs`) from its input `h` to what its output projection
    /// reads: the input projections `w`, then the convolution and the delta rule over each
    /// sequence's state in `layer` of its cache.
    fn delta_net(
        &mut self,
        w: &Group,
        net: &DeltaNet,
        layer: usize,
        h: Self::Rows,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Self::Rows>;
    /// The rows `rows` of `x` normalised, projected to the vocabulary and soft-capped when
    /// `softcap` is given: `rows.len() × vocab` logits.
    fn logits(
        &mut self,
        x: Self::Rows,
        rows: &[usize],
        norm: &Norm,
        output: &Linear,
        softcap: Option<f32>,
    ) -> Result<Vec<f32>>;
}
