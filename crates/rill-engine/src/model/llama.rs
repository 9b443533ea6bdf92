//! The forward pass of every family Rill runs: one transformer block, which the family's
//! description (`family.rs`) drives, with the KV cache passed in.
//!
//! Adapted from the shape of candle-transformers' `quantized_llama.rs`, with one change of
//! design that the flow needs (DESIGN.md, style rule 7): the model holds only weights, and each
//! sequence brings its own [`KvCache`], so one set of weights serves every conversation.
//! The cache grows by doubling into reserved memory, never by concatenating a copy per token.
//! On the CPU, attention is ours (`attention.rs`): RoPE in place, K and V appended in f16, one
//! fused pass per query head over the cache as it lies. On a GPU it stays candle's: the cache is
//! preallocated tensors written with `slice_set`, and grouped-query attention reshapes the
//! queries of a KV group into one matrix instead of repeating K and V per head.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::attention::Rope;
pub use super::config::LlamaConfig;
use super::experts::Experts;
use super::family::Activation;
pub use super::kv::{KvCache, KV_MIN_CAPACITY};
use super::kv_rows::KvType;
use super::parts::{Bias, Embedding, Group, Linear, Norm};
use super::tensors::{raw_tensor, RawTensor, TensorSource};
use crate::error::{candle_message, Error, Result};

pub(super) struct Layer {
    pub(super) attn_norm: Norm,
    /// q, k, v.
    pub(super) qkv: Group,
    pub(super) bias: Option<Bias>,
    /// Per-head RMS norms of the queries and keys, before RoPE (Qwen3).
    pub(super) qk_norm: Option<(Norm, Norm)>,
    pub(super) wo: Linear,
    /// Added to the attention's output (gpt-oss).
    pub(super) wo_bias: Option<Vec<f32>>,
    /// Each query head's sink logit (gpt-oss).
    pub(super) sinks: Option<Vec<f32>>,
    pub(super) ffn_norm: Norm,
    pub(super) ffn: Ffn,
    /// The norms of the attention's and the feed-forward's outputs (Gemma).
    pub(super) post_norms: Option<(Norm, Norm)>,
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
}

/// A RoPE table (cos, sin per position and pair) for candle's attention, and on the host for
/// ours (CPU models).
pub(super) struct RopeTable {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) host: Option<Rope>,
}

/// The weights of a llama-family model, loaded once and shared by every sequence.
pub struct Llama {
    pub(super) cfg: LlamaConfig,
    pub(super) embed: Embedding,
    pub(super) layers: Vec<Layer>,
    pub(super) norm: Norm,
    pub(super) output: Linear,
    /// The global layers' RoPE table, then the windowed layers' where theirs differs (Gemma).
    pub(super) ropes: Vec<RopeTable>,
    /// The dimensions of each head that RoPE rotates (the first; all of them but in Phi-4-mini's
    /// partial rotary).
    pub(super) rope_dim: usize,
    /// Rill's own forward pass on plain host buffers (CPU models), else candle's tensors.
    pub(super) host: bool,
    /// How the host path's KV caches store keys and values.
    pub(super) kv_type: KvType,
    pub(super) device: Device,
    /// The host forward pass's buffers, kept between steps (`host.rs`).
    pub(super) workspace: std::sync::Mutex<super::host::Workspace>,
    /// Matrices read in the file's map whose panels are still to be made, the last first
    /// (`kernels/later.rs`).
    pub(super) pending_panels: Vec<std::sync::Arc<crate::kernels::Later>>,
    /// The memory [`lock_weights`](Self::lock_weights) locked (address, length), unlocked
    /// when the model is dropped (`resident.rs`).
    pub(super) locked: Vec<(usize, usize)>,
}

/// The RoPE angles of every position for `base` and a position scale (`1`: none), each pair's
/// frequency divided by its `factors` where the file has them, cos and sin multiplied by the
/// file's attention factor, or YaRN's angles and factor where it has `yarn`; on `device` and,
/// when `host`, as our attention's table.
fn rope_table(
    cfg: &LlamaConfig,
    rope_dim: usize,
    (base, scale): (f32, f32),
    factors: Option<&[f32]>,
    yarn: Option<&super::config::Yarn>,
    device: &Device,
    host: bool,
) -> Result<RopeTable> {
    let inv_freq: Vec<f32> = (0..rope_dim)
        .step_by(2)
        .enumerate()
        .map(|(pair, i)| {
            let f = 1f32 / base.powf(i as f32 / rope_dim as f32);
            match factors {
                Some(by) => f / by[pair],
                None => f,
            }
        })
        .collect();
    let n = inv_freq.len();
    if let Some(y) = yarn {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..cfg.context_length {
            for (i, f) in inv_freq.iter().enumerate() {
                let (c, s) = y.cos_sin(rope_dim, base, i, p as f32 * f);
                cos.push(c);
                sin.push(s);
            }
        }
        let shape = (cfg.context_length, n);
        let neox = cfg.family.rope == super::family::RopeStyle::Neox;
        return Ok(RopeTable {
            cos: Tensor::from_slice(&cos, shape, device)?,
            sin: Tensor::from_slice(&sin, shape, device)?,
            host: host.then_some(Rope {
                cos,
                sin,
                pairs: n,
                neox,
            }),
        });
    }
    let inv_freq = Tensor::from_vec(inv_freq, (1, n), device)?;
    let mut pos = Tensor::arange(0u32, cfg.context_length as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((cfg.context_length, 1))?;
    if scale != 1.0 {
        pos = (pos * scale as f64)?;
    }
    let freqs = pos.matmul(&inv_freq)?;
    let (mut cos, mut sin) = (freqs.cos()?, freqs.sin()?);
    if cfg.rope_attn_factor != 1.0 {
        let a = cfg.rope_attn_factor as f64;
        (cos, sin) = ((cos * a)?, (sin * a)?);
    }
    let host = match host {
        true => Some(Rope {
            cos: cos.flatten_all()?.to_vec1()?,
            sin: sin.flatten_all()?.to_vec1()?,
            pairs: rope_dim / 2,
            neox: cfg.family.rope == super::family::RopeStyle::Neox,
        }),
        false => None,
    };
    Ok(RopeTable { cos, sin, host })
}

impl Llama {
    /// Reads the weights of a llama-family GGUF. `context_length` caps the positions (and so
    /// the RoPE tables and the largest cache).
    pub(crate) fn from_gguf<R: std::io::Read + std::io::Seek>(
        ct: &super::gguf::Header,
        source: TensorSource<'_, R>,
        device: &Device,
        family: super::family::Family,
        context_cap: Option<usize>,
        path: &Path,
        compute: super::Compute,
    ) -> Result<Self> {
        let (cfg, rope_dim) = LlamaConfig::read(ct, family, context_cap, path)?;
        // Rill's own forward pass (plain buffers, our kernels and attention) on the CPU; else
        // candle's tensors (GPUs, and the CPU when asked, to test that path).
        let host = device.is_cpu()
            && compute == super::Compute::Ours
            && rope_dim <= cfg.head_dim
            && rope_dim % 2 == 0;
        // gpt-oss's sinks, biases, clamped SwiGLU and MXFP4 experts are on our path only.
        if !host && (family.attn_sinks || family.expert_biases || family.out_bias) {
            return Err(Error::model_file(
                path,
                format!(
                    "{} runs on the CPU only for now (its attention sinks and MXFP4 experts \
                     are on Rill's own kernels); load it on the CPU",
                    super::family::label(family.arch)
                ),
            ));
        }
        let mut source = source;
        let failed = |name: &str, e: candle_core::Error| {
            Error::model_file(path, format!("tensor `{name}`: {}", candle_message(&e)))
        };
        // A tensor as the file holds it: our kernels make their layout from its bytes, and
        // what candle runs is made a candle tensor (`qtensor`).
        let mut raw =
            |name: &str| raw_tensor(ct, &mut source, name, device).map_err(|e| failed(name, e));
        let factors: Option<Vec<f32>> = match &cfg.rope_factors {
            Some(name) => Some(
                raw(name)?
                    .qtensor()?
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1()?,
            ),
            None => None,
        };
        if factors
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| !(x.is_finite() && *x > 0.0)))
        {
            return Err(Error::model_file(
                path,
                "RoPE factors that are not positive numbers",
            ));
        }
        let global = (cfg.rope_base, cfg.rope_scale);
        let windowed = (cfg.rope_base_swa, cfg.rope_scale_swa);
        let f = factors.as_deref();
        let yarn = cfg.yarn.as_ref();
        let mut ropes = vec![rope_table(&cfg, rope_dim, global, f, yarn, device, host)?];
        if windowed != global && cfg.windows.iter().any(Option::is_some) {
            // The windowed layers' own base is unscaled (Gemma 3), or scaled as the global
            // layers' are (linear: `windowed` says so; YaRN: the same scaling).
            let same = family
                .sliding_window
                .is_some_and(|w| w.default_base.is_none());
            let yarn = yarn.filter(|_| same);
            ropes.push(rope_table(&cfg, rope_dim, windowed, f, yarn, device, host)?);
        }
        let embed_raw = raw("token_embd.weight")?;
        let tied = !ct.tensor_infos.contains_key("output.weight");
        // The lookup table stays quantised where our kernels read its format: rows are
        // dequantised as tokens come. When the output projection is the same matrix (tied), the
        // output layer's copy serves both.
        let ours = host && crate::kernels::QLinear::supports_raw(embed_raw.dtype, &embed_raw.dims);
        let table = |t: &RawTensor| -> Result<Embedding> {
            Ok(Embedding::Table(t.qtensor()?.dequantize(device)?))
        };
        let embed = match (ours, tied) {
            (true, true) => Embedding::Tied,
            (true, false) => {
                let isa = crate::kernels::Isa::detect();
                let t = &embed_raw;
                // Read in the map where the format allows: a lookup reads a few rows.
                let q = crate::kernels::QLinear::from_raw_in(
                    t.dtype,
                    &t.dims,
                    &t.bytes,
                    isa,
                    t.map(),
                    true,
                );
                match q {
                    Some(q) => Embedding::Quantized(q),
                    None => table(t)?,
                }
            }
            (false, _) => table(&embed_raw)?,
        };
        let norm = Norm::new(
            raw("output_norm.weight")?.qtensor()?,
            cfg.rms_eps,
            host,
            cfg.family.llama_cpp_rounding,
        )?;
        // Small models tie the output projection to the embedding.
        let output = match tied {
            false => {
                drop(embed_raw);
                Linear::new(raw("output.weight")?, host)?
            }
            true => Linear::new(embed_raw, host)?,
        };

        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let fused_qkv = ct
                .tensor_infos
                .contains_key(&format!("blk.{i}.attn_qkv.weight"));
            let mut weight = |n: &str| raw(&format!("blk.{i}.{n}.weight"));
            let (qw, kw) = (cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
            let qkv = match fused_qkv {
                true => Group::fused(weight("attn_qkv")?, vec![qw, kw, kw], host)?,
                false => Group::new(
                    vec![weight("attn_q")?, weight("attn_k")?, weight("attn_v")?],
                    host,
                )?,
            };
            let wo = Linear::new(weight("attn_output")?, host)?;
            // A vector of the file (a bias, sinks) as f32.
            let mut floats = |n: &str| -> Result<Vec<f32>> {
                let t = raw(&format!("blk.{i}.{n}"))?.qtensor()?;
                Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?)
            };
            let biases = match cfg.family.expert_biases {
                false => None,
                true => Some(super::experts::ExpertBiases {
                    router: floats("ffn_gate_inp.bias")?,
                    gate: floats("ffn_gate_exps.bias")?,
                    up: floats("ffn_up_exps.bias")?,
                    down: floats("ffn_down_exps.bias")?,
                }),
            };
            let wo_bias = match cfg.family.out_bias {
                true => Some(floats("attn_output.bias")?),
                false => None,
            };
            let sinks = match cfg.family.attn_sinks {
                true => Some(floats("attn_sinks.weight")?),
                false => None,
            };
            let mut weight = |n: &str| raw(&format!("blk.{i}.{n}.weight"));
            let ffn = match (cfg.experts, cfg.family.experts) {
                (Some(e), Some(gating)) => Ffn::Experts(Box::new(Experts::new(
                    weight("ffn_gate_inp")?,
                    [
                        weight("ffn_gate_exps")?,
                        weight("ffn_up_exps")?,
                        weight("ffn_down_exps")?,
                    ],
                    biases,
                    e,
                    gating,
                    cfg.family.activation,
                    host,
                )?)),
                _ => {
                    let gate_up = match cfg.family.fused_gate_up {
                        true => {
                            let up = weight("ffn_up")?;
                            // `check_shapes` proved it `[2·ff, hidden]`.
                            let ff = up.dims[0] / 2;
                            Group::fused(up, vec![ff, ff], host)?
                        }
                        false => Group::new(vec![weight("ffn_gate")?, weight("ffn_up")?], host)?,
                    };
                    Ffn::Dense {
                        gate_up,
                        down: Linear::new(weight("ffn_down")?, host)?,
                    }
                }
            };
            let bias = match cfg.family.qkv_bias {
                false => None,
                true => {
                    let mut b = |n: &str| -> Result<Tensor> {
                        let t = raw(&format!("blk.{i}.{n}.bias"))?.qtensor()?;
                        Ok(t.dequantize(device)?)
                    };
                    let (q, k, v) = (b("attn_q")?, b("attn_k")?, b("attn_v")?);
                    let on_host = match host {
                        true => Tensor::cat(&[&q, &k, &v], 0)?.to_vec1()?,
                        false => Vec::new(),
                    };
                    Some(Bias {
                        host: on_host,
                        q,
                        k,
                        v,
                    })
                }
            };
            // Every norm of the layer, by its tensor's name.
            let mut norm = |n: &str| -> Result<Norm> {
                Norm::new(
                    raw(&format!("blk.{i}.{n}.weight"))?.qtensor()?,
                    cfg.rms_eps,
                    host,
                    cfg.family.llama_cpp_rounding,
                )
            };
            let (attn_norm, ffn_norm) = (norm("attn_norm")?, norm(cfg.family.ffn_norm)?);
            let qk_norm = match cfg.family.qk_norm {
                false => None,
                true => Some((norm("attn_q_norm")?, norm("attn_k_norm")?)),
            };
            let post_norms = match cfg.family.post_norms {
                false => None,
                true => Some((norm("post_attention_norm")?, norm("post_ffw_norm")?)),
            };
            let window = cfg.windows[i];
            layers.push(Layer {
                qkv,
                bias,
                qk_norm,
                wo,
                wo_bias,
                sinks,
                ffn,
                post_norms,
                rope: match window {
                    Some(_) => ropes.len() - 1,
                    None => 0,
                },
                window,
                attn_norm,
                ffn_norm,
            });
        }
        // Layer by layer, the output last: popped from the end, the first layer's come first.
        let mut pending_panels: Vec<_> = output.later().into_iter().collect();
        for l in layers.iter().rev() {
            if let Ffn::Dense { gate_up, down } = &l.ffn {
                pending_panels.extend(down.later());
                pending_panels.extend(gate_up.later());
            }
            pending_panels.extend(l.wo.later());
            pending_panels.extend(l.qkv.later());
        }
        Ok(Llama {
            cfg,
            embed,
            layers,
            norm,
            output,
            ropes,
            rope_dim,
            host,
            kv_type: KvType::F16,
            device: device.clone(),
            workspace: Default::default(),
            pending_panels,
            locked: Vec::new(),
        })
    }

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

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Bytes of KV cache a sequence of `positions` positions takes at most: every position in
    /// a full layer, a windowed layer's window and margins (`kv.rs`).
    pub fn kv_bytes(&self, positions: usize) -> usize {
        super::kv::kv_bytes(&self.cfg.windows, positions, self.kv_bytes_per_layer())
    }

    /// Bytes of weights a decode step reads, as the model holds them (our kernels' layouts),
    /// and as the file stores them: every layer's matrices and the output projection, not the
    /// embedding rows it looks up (nor the norms and biases, a few KB). What bounds decode: a
    /// step reads them all; of a mixture of experts, the router and the `k` experts one row
    /// goes through (at their average size).
    pub fn step_weight_bytes(&self) -> (usize, usize) {
        let add = |(a, b): (usize, usize), (x, y): (usize, usize)| (a + x, b + y);
        self.layers
            .iter()
            .flat_map(|l| [l.qkv.bytes(), l.wo.bytes(), l.ffn.step_bytes()])
            .fold(self.output.bytes(), add)
    }

    /// Bytes of weights read where they lie in the memory-mapped file (a mixture's experts: their
    /// pages are the page cache's, shared, and resident only once read), not held in memory
    /// of the model's own.
    pub fn mapped_weight_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.ffn {
                Ffn::Experts(e) => e.mapped_bytes(),
                Ffn::Dense { gate_up, down } => gate_up.mapped_bytes() + down.mapped_bytes(),
            })
            .sum()
    }

    /// Bytes one position costs in one layer (keys and values): the [`KvType`]'s on the host,
    /// f32 in candle's tensors.
    fn kv_bytes_per_layer(&self) -> usize {
        let width = self.cfg.n_kv_head * self.cfg.head_dim;
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
        if !kind.fits(self.cfg.head_dim) {
            return Err(Error::param(
                "kv_cache",
                format!(
                    "a {} KV cache needs heads of a multiple of 32 values; this model's have {}",
                    kind.name(),
                    self.cfg.head_dim
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
        if self.host {
            return self.forward_host(&ids, batch, &spans, &out_rows, outs, None);
        }
        // candle's attention (GPU) takes RoPE and mask tables per sequence, made once per step.
        let tables = batch
            .iter()
            .map(|(tokens, cache)| self.device_tables(tokens.len(), cache))
            .collect::<Result<Vec<_>>>()?;

        let mut x = self.embed(&ids)?;
        if cfg.family.embed_scale {
            x = (x * (cfg.hidden as f32).sqrt() as f64)?;
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward(&x)?;
            let y = self.attend_device(li, layer, &h, batch, &spans, &tables)?;
            let mut y = layer.wo.forward(&y)?;
            if let Some((post, _)) = &layer.post_norms {
                y = post.forward(&y)?;
            }
            x = (x + y)?;

            let h = layer.ffn_norm.forward(&x)?;
            let mut y = match &layer.ffn {
                Ffn::Experts(e) => e.forward(&h)?,
                Ffn::Dense { gate_up, down } => {
                    let [gate, up]: [Tensor; 2] = gate_up
                        .forward(&h)?
                        .try_into()
                        .map_err(|_| Error::Candle(candle_core::Error::Msg("gate, up".into())))?;
                    let gate = match cfg.family.activation {
                        Activation::Silu => gate.silu()?,
                        // candle's `gelu` is the tanh approximation.
                        Activation::GeluTanh => gate.gelu()?,
                        // Only gpt-oss's experts use it, and they run on the host.
                        Activation::SwigluOai => {
                            return Err(Error::param(
                                "device",
                                "the clamped SwiGLU runs on the CPU only",
                            ))
                        }
                    };
                    down.forward(&(gate * up)?)?
                }
            };
            if let Some((_, post)) = &layer.post_norms {
                y = post.forward(&y)?;
            }
            x = (x + y)?;
        }
        for (tokens, cache) in batch.iter_mut() {
            cache.advance(tokens.len());
        }

        // Only the rows asked for are projected to the vocabulary.
        let rows: Vec<u32> = out_rows.iter().map(|&r| r as u32).collect();
        let last = x.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
        let mut logits = self
            .output
            .forward(&self.norm.forward(&last)?)?
            .to_dtype(DType::F32)?;
        if let Some(c) = cfg.final_softcap {
            logits = ((logits * (1.0 / c) as f64)?.tanh()? * c as f64)?;
        }
        Ok(per_sequence(logits.flatten_all()?.to_vec1()?, outs))
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
