//! The decoder: the transformer block of every family Rill runs, written once. The family's
//! description (`family.rs`) is read here, in `Decoder::run`, and nowhere else: the block's
//! steps (norms, projections, biases, q/k norms, attention, post-norms, the feed-forward,
//! soft-caps) are asked of a [`Backend`] — our kernels on plain host buffers (`host.rs`, CPU
//! models) or candle's tensors (`device.rs`, GPUs) — so both run every family the same way.
//!
//! Adapted from the shape of candle-transformers' `quantized_llama.rs`, with one change of
//! design that the flow needs (docs/architecture.md, style rule 7): the model holds only
//! weights, and each sequence brings its own [`KvCache`], so one set of weights serves every
//! conversation. The cache grows by doubling into reserved memory, never by concatenating a
//! copy per token.

use candle_core::{DType, Device, Tensor};

use super::backend::{Attention, Backend, Parts, RopeTable};
pub use super::config::DecoderConfig;
use super::delta::DeltaNet;
use super::experts::Experts;
pub use super::inject::Injected;
pub use super::kv::{KvCache, KV_MIN_CAPACITY};
use super::kv_rows::KvType;
use super::parts::{
    Bias, Embedding, Group, Linear, Norm, PerLayerInputs, PerLayerStep, SharedExpert,
};

use crate::error::{Error, Result};

pub(super) struct Layer {
    pub(super) attn_norm: Norm,
    /// q, k, v; in a Gated DeltaNet layer, its input projections.
    pub(super) qkv: Group,
    /// `qkv` gives q and k only: the values are the keys' projection (Gemma 4).
    pub(super) keys_as_values: bool,
    /// The layer's output is multiplied by this (Gemma 4's `layer_output_scale`).
    pub(super) out_scale: Option<f32>,
    /// A Gated DeltaNet layer's own weights, where the layer is one instead of attention
    /// (Qwen3.5): then `qkv` and `wo` are its input and output projections, and the
    /// attention's fields below are unused.
    pub(super) delta: Option<Box<DeltaNet>>,
    pub(super) bias: Option<Bias>,
    /// Per-head RMS norms of the queries and keys, before RoPE (Qwen3); of the queries only
    /// in a layer that reads another's keys (`DecoderConfig::kv_layer`).
    pub(super) qk_norm: Option<(Norm, Option<Norm>)>,
    /// The attention's (or Gated DeltaNet's) output projection.
    pub(super) wo: Linear,
    /// Added to the attention's output (gpt-oss).
    pub(super) wo_bias: Option<Vec<f32>>,
    /// Each query head's sink logit (gpt-oss).
    pub(super) sinks: Option<Vec<f32>>,
    pub(super) ffn_norm: Norm,
    pub(super) ffn: Ffn,
    /// A mixture's shared expert, added to its routed experts' output (Qwen3.5 MoE).
    pub(super) shared: Option<Box<SharedExpert>>,
    /// A mixture beside the dense feed-forward (Gemma 4 26B-A4B).
    pub(super) beside: Option<Box<Beside>>,
    /// The norms of the attention's and the feed-forward's outputs (Gemma).
    pub(super) post_norms: Option<(Norm, Norm)>,
    /// The layer's per-layer embedding step (Gemma 4's E2B and E4B).
    pub(super) per_layer: Option<Box<PerLayerStep>>,
    /// Which of the model's RoPE tables this layer uses, and the window it attends over.
    pub(super) rope: usize,
    pub(super) window: Option<usize>,
}

/// A layer's feed-forward: one gated MLP, or a mixture of experts.
pub(super) enum Ffn {
    Dense {
        /// gate, up.
        gate_up: Group,
        down: Linear,
    },
    Experts(Box<Experts>),
}

/// Gemma 4 26B-A4B's mixture beside a layer's MLP: its experts, the norm before them
/// (`pre_ffw_norm_2`), the norms after the MLP (`post_ffw_norm_1`) and after the experts
/// (`post_ffw_norm_2`), and the router's input: the residual stream RMS-normalised with the
/// weights `ffn_gate_inp.scale / √width` (llama.cpp's plain norm, `1/√width`, then the scale).
pub(super) struct Beside {
    pub(super) experts: Experts,
    pub(super) pre: Norm,
    pub(super) post_mlp: Norm,
    pub(super) post_experts: Norm,
    pub(super) router_norm: Norm,
}

impl Ffn {
    /// Bytes of weights a one-row step reads, held and in the file.
    fn step_bytes(&self) -> (usize, usize) {
        match self {
            Ffn::Dense { gate_up, down } => {
                let ((a, b), (c, d)) = (gate_up.bytes(), down.bytes());
                (a + c, b + d)
            }
            Ffn::Experts(e) => e.step_bytes(),
        }
    }

    /// Weights one row goes through.
    fn step_weights(&self) -> usize {
        match self {
            Ffn::Dense { gate_up, down } => gate_up.weights() + down.weights(),
            Ffn::Experts(e) => e.step_weights(),
        }
    }
}

/// The weights of a model, loaded once and shared by every sequence.
pub struct Decoder {
    pub(super) cfg: DecoderConfig,
    pub(super) embed: Embedding,
    /// Every layer's own embedding of the tokens (Gemma 4's E2B and E4B).
    pub(super) per_layer: Option<Box<PerLayerInputs>>,
    pub(super) layers: Vec<Layer>,
    pub(super) norm: Norm,
    pub(super) output: Linear,
    /// The global layers' RoPE table, then the windowed layers' where theirs differs (Gemma).
    pub(super) ropes: Vec<RopeTable>,
    /// Rill's own forward pass on plain host buffers (CPU models), else candle's tensors.
    pub(super) host: bool,
    /// How the host path's KV caches store keys and values.
    pub(super) kv_type: KvType,
    pub(super) device: Device,
    /// The host forward pass's buffers, kept between steps (`host.rs`).
    pub(super) workspace: std::sync::Mutex<super::workspace::Workspace>,
    /// Matrices read in the file's map whose panels are still to be made, the last first
    /// (`kernels/later.rs`).
    pub(super) pending_panels: Vec<std::sync::Arc<crate::kernels::Later>>,
    /// The memory [`lock_weights`](Self::lock_weights) locked, region by region, unlocked
    /// when the model is dropped (`resident.rs`).
    pub(super) locked: Vec<crate::kernels::Region>,
}

impl Decoder {
    /// Makes the panels of the next matrix still read in the file's map (`kernels/later.rs`),
    /// on the calling thread's pool; `false` once none is left. An idle engine calls it
    /// between commands, so a model loads at once and reaches its full speed for prompts a
    /// moment later.
    pub fn make_next_panels(&mut self) -> bool {
        // A prompt may have made some already.
        self.pending_panels.retain(|l| l.pending());
        if let Some(l) = self.pending_panels.pop() {
            l.make();
        }
        !self.pending_panels.is_empty()
    }

    /// Whether some matrices' panels are still to be made.
    pub fn panels_pending(&self) -> bool {
        self.pending_panels.iter().any(|l| l.pending())
    }

    /// The embedding rows of `ids`.
    pub(super) fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let rows = match (&self.embed, &self.output) {
            (Embedding::Table(t), _) => {
                return Ok(t.index_select(&Tensor::new(ids, &self.device)?, 0)?)
            }
            (Embedding::Quantized(q), _) | (Embedding::Tied, Linear::Ours(q)) => q.rows(ids),
            // Tied is only chosen when the output runs on our kernels.
            (Embedding::Tied, Linear::Candle(_)) => None,
        };
        match rows {
            Some(r) => Ok(r?),
            None => Err(Error::param(
                "prompt",
                "a token id is outside the model's embedding table",
            )),
        }
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// Bytes of KV cache a sequence of `positions` positions takes at most: every position in
    /// a full layer, a windowed layer's window and margins (`kv.rs`).
    pub fn kv_bytes(&self, positions: usize) -> usize {
        super::kv::kv_bytes(&self.cfg, positions, |layer| {
            self.kv_bytes_per_position(layer)
        }) + super::recurrent::Recurrent::bytes_for(&self.cfg)
    }

    /// Bytes of weights a decode step reads, as the model holds them (our kernels' layouts),
    /// and as the file stores them: every layer's matrices and the output projection, not the
    /// embedding rows it looks up (nor the norms and biases, a few KB). What bounds decode: a
    /// step reads them all; of a mixture of experts, the router and the `k` experts one row
    /// goes through (at their average size).
    pub fn step_weight_bytes(&self) -> (usize, usize) {
        let add = |(a, b): (usize, usize), (x, y): (usize, usize)| (a + x, b + y);
        let inputs = self.per_layer.as_ref().map_or((0, 0), |p| p.proj.bytes());
        self.layers
            .iter()
            .flat_map(|l| {
                let shared = l.shared.as_ref().map_or((0, 0), |s| s.bytes());
                let per_layer = l.per_layer.as_ref().map_or((0, 0), |p| p.bytes());
                let beside = l.beside.as_ref().map_or((0, 0), |b| b.experts.step_bytes());
                [
                    l.qkv.bytes(),
                    l.wo.bytes(),
                    add(l.ffn.step_bytes(), beside),
                    shared,
                    per_layer,
                ]
            })
            .fold(add(self.output.bytes(), inputs), add)
    }

    /// Multiply-adds of a prompt's row in the layers' matrices (each weight once; the output
    /// projection aside, which only a prompt's last row goes through, and the attention's,
    /// which grow with the positions): what bounds prefill, with the machine's rate of them
    /// (`kernels::byte_product_peak`).
    pub fn prompt_row_macs(&self) -> usize {
        let inputs = self.per_layer.as_ref().map_or(0, |p| p.proj.weights());
        inputs
            + self
                .layers
                .iter()
                .map(|l| {
                    let shared = l.shared.as_ref().map_or(0, |s| s.weights());
                    let per_layer = l.per_layer.as_ref().map_or(0, |p| p.weights());
                    let beside = l.beside.as_ref().map_or(0, |b| b.experts.step_weights());
                    let ffn = l.ffn.step_weights() + beside;
                    l.qkv.weights() + l.wo.weights() + ffn + shared + per_layer
                })
                .sum::<usize>()
    }

    /// Bytes of weights read where they lie in the memory-mapped file (a mixture's experts: their
    /// pages are the page cache's, shared, and resident only once read), not held in memory
    /// of the model's own.
    pub fn mapped_weight_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                let beside = l.beside.as_ref().map_or(0, |b| b.experts.mapped_bytes());
                beside
                    + match &l.ffn {
                        Ffn::Experts(e) => e.mapped_bytes(),
                        Ffn::Dense { gate_up, down } => {
                            gate_up.mapped_bytes() + down.mapped_bytes()
                        }
                    }
            })
            .sum()
    }

    /// Bytes one position costs in `layer` (keys and values): the [`KvType`]'s on the host,
    /// f32 in candle's tensors.
    fn kv_bytes_per_position(&self, layer: usize) -> usize {
        let width = self.cfg.kv_width(layer);
        match self.host {
            true => 2 * self.kv_type.bytes(width),
            false => 2 * width * DType::F32.size_in_bytes(),
        }
    }

    /// How the KV caches store keys and values from now on (a cache made for another type
    /// starts afresh when next used). The 8-bit store needs our forward pass (the CPU) and a
    /// head size that is a multiple of 32; otherwise this is refused and nothing changes.
    pub fn set_kv_type(&mut self, kind: KvType) -> Result<()> {
        if kind != KvType::F16 && !self.host {
            return Err(Error::param(
                "kv_cache",
                format!(
                    "a {} KV cache runs on the CPU only; on this device the cache is f32",
                    kind.name()
                ),
            ));
        }
        if let Some(h) = self.cfg.heads.iter().find(|h| !kind.fits(h.head_dim)) {
            return Err(Error::param(
                "kv_cache",
                format!(
                    "a {} KV cache needs heads of a multiple of 32 values; this model's have {}",
                    kind.name(),
                    h.head_dim
                ),
            ));
        }
        self.kv_type = kind;
        Ok(())
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Runs `tokens` at the positions after what `cache` holds, appends their keys and values,
    /// and returns the logits of the last token.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        let mut logits = self.forward_batch(&mut [(tokens, cache)])?;
        Ok(logits.pop().unwrap_or_default())
    }

    /// One step for several sequences at once, each with its own new tokens (a prefill chunk,
    /// or the one token of a decode step) and its own cache. All rows go through the linear
    /// layers as one matrix, so every weight is read once per step however many answers are
    /// streaming; attention runs per sequence against its own cache. Returns the logits of each
    /// sequence's last token, in order.
    pub fn forward_batch(&self, batch: &mut [(&[u32], &mut KvCache)]) -> Result<Vec<Vec<f32>>> {
        let outs = vec![1; batch.len()];
        self.forward_rows(batch, &outs)
    }

    /// [`forward_batch`](Self::forward_batch), returning for each sequence the logits of its
    /// last `outs[i]` tokens, row after row in one vector (a speculative draft's check needs
    /// every position it proposed). A row's logits do not depend on the rows beside it.
    pub fn forward_rows(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        outs: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_rows_with(batch, outs, &[])
    }

    /// [`forward_rows`](Self::forward_rows) where some rows are given as embeddings rather
    /// than tokens (`injected`: an image's rows, whose token ids are placeholders).
    pub fn forward_rows_with(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        outs: &[usize],
        injected: &[Injected],
    ) -> Result<Vec<Vec<f32>>> {
        let cfg = &self.cfg;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if outs.len() != batch.len()
            || batch
                .iter()
                .zip(outs)
                .any(|((t, _), &o)| o == 0 || o > t.len())
        {
            return Err(Error::param(
                "rows",
                "each sequence gives 1 to all of its rows' logits",
            ));
        }
        let mut ids = Vec::new();
        for (tokens, cache) in batch.iter_mut() {
            if tokens.is_empty() {
                return Err(Error::param("prompt", "no tokens to run"));
            }
            if cache.len() + tokens.len() > cfg.context_length {
                return Err(Error::PromptTooLong {
                    prompt_tokens: cache.len() + tokens.len(),
                    context: cfg.context_length,
                });
            }
            let host = self.host.then_some(self.kv_type);
            cache.reserve(cfg, tokens.len(), &self.device, host)?;
            ids.extend_from_slice(tokens);
        }
        // Per sequence: its first row in the batch and its number of rows.
        let mut spans = Vec::with_capacity(batch.len());
        let mut row = 0;
        for (tokens, _) in batch.iter() {
            spans.push((row, tokens.len()));
            row += tokens.len();
        }
        // The rows projected to the vocabulary: each sequence's last `outs[i]`.
        let out_rows: Vec<usize> = spans
            .iter()
            .zip(outs)
            .flat_map(|(&(row, t), &o)| row + t - o..row + t)
            .collect();
        let width = cfg.hidden * (1 + cfg.deepstack);
        let (rows, both_ways) = super::inject::place(injected, &spans, width, &mut ids)?;
        match self.host {
            true => {
                // (On the host only: a model on a GPU refuses images, so its caches hold none.)
                let positions = super::inject::positions(cfg, batch, injected);
                let host = super::host::Host::new(self.parts(), ids.len(), None);
                let mut host = host.with_both_ways(&both_ways).with_positions(positions);
                self.run(&mut host, &ids, &rows, batch, &spans, &out_rows, outs)
            }
            false if !injected.is_empty() => Err(Error::param(
                "image",
                "images run on the CPU for now (this model is on a GPU)",
            )),
            false => {
                let mut device = super::device::OnDevice::new(self.parts(), batch)?;
                self.run(&mut device, &ids, &[], batch, &spans, &out_rows, outs)
            }
        }
    }

    /// Runs `tokens` after what `cache` holds on the CPU's own forward pass, as
    /// [`forward`](Self::forward), and returns with the logits the experts each
    /// mixture-of-experts layer's token went through and their weights (`tokens.len() · k`
    /// routes, token by token): llama.cpp's `ffn_moe_topk` and `ffn_moe_weights_norm`, to
    /// compare routing with it.
    pub fn forward_routes(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<(Vec<f32>, Vec<Vec<super::experts::Route>>)> {
        if !self.host {
            return Err(Error::param(
                "device",
                "routes are recorded on the CPU's own forward pass only",
            ));
        }
        if tokens.is_empty() || cache.len() + tokens.len() > self.cfg.context_length {
            return Err(Error::param(
                "prompt",
                "no tokens, or more than the context",
            ));
        }
        cache.reserve(&self.cfg, tokens.len(), &self.device, Some(self.kv_type))?;
        let mut routes = Vec::new();
        let mut host = super::host::Host::new(self.parts(), tokens.len(), Some(&mut routes));
        let mut batch = [(tokens, cache)];
        let spans = [(0, tokens.len())];
        let mut logits = self.run(
            &mut host,
            tokens,
            &[],
            &mut batch,
            &spans,
            &[tokens.len() - 1],
            &[1],
        )?;
        drop(host);
        Ok((logits.pop().unwrap_or_default(), routes))
    }

    /// What a backend reads of the model besides the weights each step is given.
    fn parts(&self) -> Parts<'_> {
        Parts {
            cfg: &self.cfg,
            ropes: &self.ropes,
            device: &self.device,
            workspace: &self.workspace,
        }
    }

    /// The block, for every family, on backend `b`: `ids` are the batch's rows in order
    /// (`spans`: each sequence's first row and count), `injected` rows (first row, values) take
    /// the place of their tokens' embeddings (the values' first `hidden`; the next ones, one
    /// run per deepstack layer, are added after those layers), and the rows `out_rows` are
    /// projected to the vocabulary, `outs[i]` of them for sequence `i`.
    #[allow(clippy::too_many_arguments)]
    fn run<B: Backend>(
        &self,
        b: &mut B,
        ids: &[u32],
        injected: &[(usize, &[f32])],
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
        out_rows: &[usize],
        outs: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let cfg = &self.cfg;
        let family = &cfg.family;
        let scale = family.embed_scale.then(|| (cfg.hidden as f32).sqrt());
        let mut x = b.embed(self.embed(ids)?, scale)?;
        // An image's rows are the model's width already: not scaled (llama.cpp's Gemma 3
        // scales token embeddings only).
        let hidden = cfg.hidden;
        for &(row, values) in injected {
            b.inject(&mut x, row, &values[..hidden], false)?;
        }
        let inputs = match &self.per_layer {
            Some(p) => Some(b.per_layer_inputs(p, &x, p.rows(ids)?)?),
            None => None,
        };
        for (li, layer) in self.layers.iter().enumerate() {
            let h = b.norm(&layer.attn_norm, &x)?;
            let y = match &layer.delta {
                Some(net) => b.delta_net(&layer.qkv, net, li, h, batch, spans)?,
                None => self.attention(b, li, layer, h, batch, spans)?,
            };
            let mut y = b.linear(&layer.wo, y)?;
            if let Some(bias) = &layer.wo_bias {
                b.add_bias(&mut y, bias)?;
            }
            if let Some((post, _)) = &layer.post_norms {
                b.renorm(post, &mut y)?;
            }
            b.residual(&mut x, y)?;

            let h = b.norm(&layer.ffn_norm, &x)?;
            // The shared expert reads the same input as the routed ones.
            let shared_in = match &layer.shared {
                Some(_) => Some(b.norm(&layer.ffn_norm, &x)?),
                None => None,
            };
            let mut y = match &layer.ffn {
                Ffn::Dense { gate_up, down } => b.dense(gate_up, down, family.activation, h)?,
                Ffn::Experts(e) => b.experts(e, h, None)?,
            };
            if let Some(side) = &layer.beside {
                b.renorm(&side.post_mlp, &mut y)?;
                let (h, by) = (b.norm(&side.pre, &x)?, b.norm(&side.router_norm, &x)?);
                let mut z = b.experts(&side.experts, h, Some(by))?;
                b.renorm(&side.post_experts, &mut z)?;
                b.residual(&mut y, z)?;
            }
            if let (Some(s), Some(h)) = (&layer.shared, shared_in) {
                let z = b.shared_expert(s, h)?;
                b.residual(&mut y, z)?;
            }
            if let Some((_, post)) = &layer.post_norms {
                b.renorm(post, &mut y)?;
            }
            b.residual(&mut x, y)?;
            if let (Some(step), Some(inputs)) = (&layer.per_layer, &inputs) {
                b.per_layer(step, li, inputs, &mut x)?;
            }
            if let Some(scale) = layer.out_scale {
                b.scale(&mut x, scale)?;
            }
            // Qwen3-VL's deepstack: an image row's next run after each of the first layers.
            if li < cfg.deepstack {
                for &(row, values) in injected {
                    b.inject(&mut x, row, &values[(li + 1) * hidden..][..hidden], true)?;
                }
            }
        }
        for (tokens, cache) in batch.iter_mut() {
            cache.advance(tokens.len());
        }
        // Only the rows asked for are projected to the vocabulary.
        let logits = b.logits(x, out_rows, &self.norm, &self.output, cfg.final_softcap)?;
        Ok(per_sequence(logits, outs))
    }
}

impl Decoder {
    /// Layer `li`'s attention, from its input `h` to what its output projection reads: the
    /// q/k/v projections, a gated query's gate set aside, biases, q/k norms, then RoPE and
    /// every query over its sequence's cache, and the gate.
    fn attention<B: Backend>(
        &self,
        b: &mut B,
        li: usize,
        layer: &Layer,
        h: B::Rows,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<B::Rows> {
        let (cfg, family) = (&self.cfg, &self.cfg.family);
        // A layer that reads an earlier layer's keys and values projects queries only.
        let own_kv = cfg.kv_layer[li] == li;
        let mut qkv = b.qkv(&layer.qkv, h)?;
        if layer.keys_as_values {
            b.keys_as_values(&mut qkv, li)?;
        }
        let gate = match family.gated_query {
            true => Some(b.split_gate(&mut qkv, li)?),
            false => None,
        };
        if let Some(bias) = &layer.bias {
            b.qkv_bias(&mut qkv, bias)?;
        }
        if family.v_norm && own_kv {
            b.v_norm(&mut qkv, li)?;
        }
        if let Some((q, k)) = &layer.qk_norm {
            b.qk_norm(&mut qkv, li, q, k.as_ref())?;
        }
        let attention = Attention {
            layer: li,
            kv_layer: cfg.kv_layer[li],
            rope: layer.rope,
            rope_dim: cfg.heads[li].rope_dim,
            rope_style: family.rope,
            prescale: cfg.query_prescale,
            softcap: cfg.attn_softcap,
            window: layer.window,
            sinks: layer.sinks.as_deref(),
            f16_weights: family.llama_cpp_rounding,
        };
        let mut y = b.attend(&attention, qkv, batch, spans)?;
        if let Some(g) = gate {
            b.gate(&mut y, g)?;
        }
        Ok(y)
    }
}

/// The logits of all projected rows, `rows × vocab`, split into each sequence's `outs[i]` rows.
pub(super) fn per_sequence(logits: Vec<f32>, outs: &[usize]) -> Vec<Vec<f32>> {
    let total: usize = outs.iter().sum();
    let vocab = logits.len() / total.max(1);
    let mut rest = logits.as_slice();
    outs.iter()
        .map(|&o| {
            let (mine, more) = rest.split_at(o * vocab);
            rest = more;
            mine.to_vec()
        })
        .collect()
}
