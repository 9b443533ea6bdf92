//! The llama-family forward pass (Llama 2/3, Mistral, SmolLM, TinyLlama), with the KV cache
//! passed in.
//!
//! Adapted from the shape of candle-transformers' `quantized_llama.rs`, with one change of
//! design that the flow needs (DESIGN.md, style rule 7): the model holds only weights, and each
//! sequence brings its own [`KvCache`], so one set of weights serves every conversation.
//! The cache grows by doubling into reserved memory, never by concatenating a copy per token.
//! On the CPU, attention is ours (`attention.rs`): RoPE in place, K and V appended in f16, one
//! fused pass per query head over the cache as it lies. On a GPU it stays candle's: the cache is
//! preallocated tensors written with `slice_set`, and grouped-query attention reshapes the
//! queries of a KV group into one matrix instead of repeating K and V per head.

use candle_core::quantized::{gguf_file, QMatMul, QTensor};
use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_transformers::quantized_nn::RmsNorm;
use half::{f16, slice::HalfFloatSliceExt};

use super::attention::{self, LayerKv, Rope, Span};
pub use super::config::LlamaConfig;
use super::ops;
use crate::error::{candle_message, Error, Result};

/// A linear layer: our kernels where they run the format (CPU; Q4_0, Q4_1, Q5_0, Q8_0, Q4_K,
/// Q6_K), else candle's.
enum Linear {
    Ours(crate::kernels::QLinear),
    Candle(QMatMul),
}

impl Linear {
    /// Our kernels when `host` (a CPU model on Rill's own path) and they read the format.
    fn new(t: QTensor, host: bool) -> Result<Linear> {
        if host {
            if let Some(l) =
                crate::kernels::QLinear::from_qtensor(&t, crate::kernels::Isa::detect())
            {
                return Ok(Linear::Ours(l));
            }
        }
        Ok(Linear::Candle(QMatMul::from_qtensor(t)?))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Linear::Ours(l) => l.forward(x)?,
            Linear::Candle(m) => m.forward(x)?,
        })
    }

    /// `x · wᵀ` for `m` row-major rows on the host.
    fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        Ok(match self {
            Linear::Ours(l) => l.product(x, m),
            Linear::Candle(q) => {
                let x = Tensor::from_slice(x, (m, x.len() / m.max(1)), &Device::Cpu)?;
                q.forward(&x)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1()?
            }
        })
    }
}

/// An RMS norm's weights: candle's module (GPU) and the same weights on the host.
struct Norm {
    candle: RmsNorm,
    weight: Vec<f32>,
    eps: f32,
}

impl Norm {
    /// The host copy is only made for a CPU model (`host`).
    fn new(t: QTensor, eps: f64, host: bool) -> Result<Norm> {
        let weight = match host {
            true => t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?,
            false => Vec::new(),
        };
        Ok(Norm {
            candle: RmsNorm::from_qtensor(t, eps)?,
            weight,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.candle.forward(x)?)
    }

    fn forward_host(&self, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        ops::rms_norm(x, &self.weight, self.eps, &mut out);
        out
    }
}

/// The token embedding table.
enum Embedding {
    /// In f32 (formats our kernels do not read, GPUs).
    Table(Tensor),
    /// Quantised, rows dequantised on lookup.
    Quantized(crate::kernels::QLinear),
    /// The output projection's matrix, rows dequantised on lookup.
    Tied,
}

/// Linear layers that read the same input (q, k, v; gate, up): one stacked matmul when our
/// kernels take them all, else each on its own.
enum Group {
    Stacked(crate::kernels::QLinear, Vec<usize>),
    Apart(Vec<Linear>),
}

impl Group {
    fn new(parts: Vec<QTensor>, host: bool) -> Result<Group> {
        if host {
            let isa = crate::kernels::Isa::detect();
            let ours: Option<Vec<_>> = parts
                .iter()
                .map(|t| crate::kernels::QLinear::from_qtensor(t, isa))
                .collect();
            if let Some(ours) = ours {
                let widths = ours.iter().map(|l| l.n_out()).collect();
                if let Some(stacked) = crate::kernels::QLinear::stack(ours) {
                    return Ok(Group::Stacked(stacked, widths));
                }
            }
        }
        Ok(Group::Apart(
            parts
                .into_iter()
                .map(|t| Linear::new(t, host))
                .collect::<Result<_>>()?,
        ))
    }

    fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        Ok(match self {
            Group::Stacked(l, widths) => l.forward_parts(x, widths)?,
            Group::Apart(ls) => ls.iter().map(|l| l.forward(x)).collect::<Result<_>>()?,
        })
    }

    /// The outputs side by side for `m` rows on the host, row-major (`[rows][q | k | v]`).
    fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        match self {
            Group::Stacked(l, _) => Ok(l.product(x, m)),
            Group::Apart(ls) => {
                let parts = ls
                    .iter()
                    .map(|l| l.forward_host(x, m))
                    .collect::<Result<Vec<_>>>()?;
                let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
                for r in 0..m {
                    for p in &parts {
                        let w = p.len() / m.max(1);
                        out.extend_from_slice(&p[r * w..(r + 1) * w]);
                    }
                }
                Ok(out)
            }
        }
    }
}

/// The q/k/v biases of a layer (Qwen2): `[q | k | v]` on the host, one tensor each for candle.
struct Bias {
    host: Vec<f32>,
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

struct Layer {
    attn_norm: Norm,
    /// q, k, v.
    qkv: Group,
    bias: Option<Bias>,
    /// Per-head RMS norms of the queries and keys, before RoPE (Qwen3).
    qk_norm: Option<(Norm, Norm)>,
    wo: Linear,
    ffn_norm: Norm,
    /// gate, up.
    gate_up: Group,
    w_down: Linear,
}

/// The weights of a llama-family model, loaded once and shared by every sequence.
pub struct Llama {
    cfg: LlamaConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Norm,
    output: Linear,
    cos: Tensor,
    sin: Tensor,
    /// The same tables on the host, for our attention (CPU models).
    rope: Option<Rope>,
    device: Device,
}

/// Positions a cache allocates at first; it doubles from there.
pub const KV_MIN_CAPACITY: usize = 256;

/// One sequence's keys and values for every layer, of which the first `len` positions are
/// filled. Memory is reserved ahead (doubling), never grown by a copy per token.
#[derive(Default)]
pub struct KvCache {
    store: Store,
    len: usize,
    capacity: usize,
    /// Floats per position in a host layer (`n_kv_head · head_dim`).
    width: usize,
}

enum Store {
    /// On the host, `[position][kv head][head_dim]` per layer: our attention appends and reads
    /// it in place (`attention.rs`).
    Host(Vec<LayerKv>),
    /// On a GPU, `[1, n_kv_head, capacity, head_dim]` tensors per layer, for candle's attention.
    Device(Vec<(Tensor, Tensor)>),
}

impl Default for Store {
    fn default() -> Self {
        Store::Host(Vec::new())
    }
}

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (capacity, not just what is filled).
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Host(layers) => layers
                .iter()
                .map(|l| (l.k.capacity() + l.v.capacity()) * std::mem::size_of::<f16>())
                .sum(),
            Store::Device(layers) => layers
                .iter()
                .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
                .sum(),
        }
    }

    /// Forgets positions from `len` on (the memory stays for reuse; a host layer drops them
    /// when it is next appended to).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A copy of the first `len` positions with room for a few more: for a preview, which must
    /// leave the kept cache it starts from as it was.
    pub fn copy_prefix(&self, len: usize) -> Result<KvCache> {
        let len = len.min(self.len);
        let capacity = len + 16;
        let store = match &self.store {
            Store::Host(layers) => Store::Host(
                layers
                    .iter()
                    .map(|l| {
                        let width = self.width;
                        let copy = |x: &[f16]| {
                            let mut c = Vec::with_capacity(capacity * width);
                            c.extend_from_slice(&x[..len * width]);
                            c
                        };
                        LayerKv {
                            k: copy(&l.k),
                            v: copy(&l.v),
                        }
                    })
                    .collect(),
            ),
            Store::Device(layers) => {
                let mut copies = Vec::with_capacity(layers.len());
                for (k, v) in layers {
                    let (b, h, _, d) = k.dims4()?;
                    let copy = |t: &Tensor| -> Result<Tensor> {
                        let out = Tensor::zeros((b, h, capacity, d), t.dtype(), t.device())?;
                        if len > 0 {
                            out.slice_set(&t.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                        }
                        Ok(out)
                    };
                    copies.push((copy(k)?, copy(v)?));
                }
                Store::Device(copies)
            }
        };
        Ok(KvCache {
            store,
            len,
            capacity,
            width: self.width,
        })
    }

    /// Makes room for `extra` more positions, doubling the capacity when it runs out.
    /// `host` picks the store our attention reads; else candle's tensors on `device`.
    fn reserve(
        &mut self,
        cfg: &LlamaConfig,
        extra: usize,
        device: &Device,
        host: bool,
    ) -> Result<()> {
        let need = self.len + extra;
        let built = match &self.store {
            Store::Host(l) => host && l.len() == cfg.n_layer,
            Store::Device(l) => !host && l.len() == cfg.n_layer,
        };
        if need <= self.capacity && built {
            return Ok(());
        }
        if !built {
            // A new cache (or, defensively, one built for another model): nothing to keep.
            self.len = 0;
            self.capacity = 0;
        }
        let cap = need
            .max(self.capacity * 2)
            .max(KV_MIN_CAPACITY)
            .min(cfg.context_length.max(need));
        if host {
            let width = cfg.n_kv_head * cfg.head_dim;
            self.width = width;
            if !built {
                self.store = Store::Host((0..cfg.n_layer).map(|_| LayerKv::default()).collect());
            }
            if let Store::Host(layers) = &mut self.store {
                for l in layers {
                    l.k.truncate(self.len * width);
                    l.v.truncate(self.len * width);
                    // Exact, so the doubling above (not Vec's own) decides the memory.
                    l.k.reserve_exact((cap - self.len) * width);
                    l.v.reserve_exact((cap - self.len) * width);
                }
            }
        } else {
            let shape = (1, cfg.n_kv_head, cap, cfg.head_dim);
            let old = match std::mem::take(&mut self.store) {
                Store::Device(old) => old,
                Store::Host(_) => Vec::new(),
            };
            let mut layers = Vec::with_capacity(cfg.n_layer);
            for i in 0..cfg.n_layer {
                let k = Tensor::zeros(shape, DType::F32, device)?;
                let v = Tensor::zeros(shape, DType::F32, device)?;
                if let Some((ok, ov)) = old.get(i) {
                    if self.len > 0 {
                        k.slice_set(&ok.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                        v.slice_set(&ov.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                    }
                }
                layers.push((k, v));
            }
            self.store = Store::Device(layers);
        }
        self.capacity = cap;
        Ok(())
    }

    /// Appends one new position's keys and values (`width` floats each) to host `layer`, after
    /// the filled positions and whatever earlier rows of this step appended.
    /// They are kept in f16, as llama.cpp keeps them: half the memory and half the reads per
    /// step, and the values still carry 11 significant bits.
    fn push_host(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        let at = (self.len + row) * self.width;
        if let Store::Host(layers) = &mut self.store {
            let l = &mut layers[layer];
            l.k.truncate(at);
            l.v.truncate(at);
            for (cache, new) in [(&mut l.k, k), (&mut l.v, v)] {
                cache.resize(at + new.len(), f16::ZERO);
                cache[at..].convert_from_f32_slice(new);
            }
        }
    }

    /// Host `layer`'s keys and values (filled positions and this step's rows).
    fn host_layer(&self, layer: usize) -> Option<&LayerKv> {
        match &self.store {
            Store::Host(layers) => layers.get(layer),
            Store::Device(_) => None,
        }
    }

    /// Writes the new keys/values of `layer` after the filled positions and returns views of
    /// everything so far (GPU store). [`KvCache::advance`] commits the positions once every
    /// layer is done.
    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let Store::Device(layers) = &self.store else {
            return Err(Error::Candle(candle_core::Error::Msg(
                "a host KV cache on a GPU model".into(),
            )));
        };
        let (ck, cv) = &layers[layer];
        let t = k.dim(2)?;
        ck.slice_set(k, 2, self.len)?;
        cv.slice_set(v, 2, self.len)?;
        Ok((
            ck.narrow(2, 0, self.len + t)?,
            cv.narrow(2, 0, self.len + t)?,
        ))
    }

    fn advance(&mut self, t: usize) {
        self.len += t;
    }
}

fn rope_tables(cfg: &LlamaConfig, rope_dim: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let inv_freq: Vec<f32> = (0..rope_dim)
        .step_by(2)
        .map(|i| 1f32 / cfg.rope_base.powf(i as f32 / rope_dim as f32))
        .collect();
    let n = inv_freq.len();
    let inv_freq = Tensor::from_vec(inv_freq, (1, n), device)?;
    let pos = Tensor::arange(0u32, cfg.context_length as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((cfg.context_length, 1))?;
    let freqs = pos.matmul(&inv_freq)?;
    Ok((freqs.cos()?, freqs.sin()?))
}

/// Additive causal mask for a chunk of `t` queries at positions `pos..pos+t`, repeated for the
/// `n_rep` query heads that share a KV head (their rows are stacked, see `forward`).
fn causal_mask(t: usize, pos: usize, n_rep: usize, device: &Device) -> Result<Tensor> {
    let total = pos + t;
    let mut m = Vec::with_capacity(n_rep * t * total);
    for _ in 0..n_rep {
        for i in 0..t {
            m.extend((0..total).map(|j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }));
        }
    }
    Ok(Tensor::from_vec(m, (n_rep * t, total), device)?)
}

impl Llama {
    /// Reads the weights of a llama-family GGUF. `context_length` caps the positions (and so
    /// the RoPE tables and the largest cache).
    pub(crate) fn from_gguf<R: std::io::Read + std::io::Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        device: &Device,
        family: super::family::Family,
        context_cap: Option<usize>,
        path: &Path,
        compute: super::Compute,
    ) -> Result<Self> {
        let (cfg, rope_dim) = LlamaConfig::read(ct, family, context_cap, path)?;
        // Rill's own forward pass (plain buffers, our kernels and attention) on the CPU; else
        // candle's tensors (GPUs, and the CPU when asked, to test that path).
        let host = device.is_cpu() && compute == super::Compute::Ours;
        let (cos, sin) = rope_tables(&cfg, rope_dim, device)?;
        let rope = match host && rope_dim <= cfg.head_dim && rope_dim % 2 == 0 {
            true => Some(Rope {
                cos: cos.flatten_all()?.to_vec1()?,
                sin: sin.flatten_all()?.to_vec1()?,
                pairs: rope_dim / 2,
                neox: cfg.family.rope == super::family::RopeStyle::Neox,
            }),
            false => None,
        };

        let mut tensor = |name: &str| -> Result<QTensor> {
            ct.tensor(reader, name, device).map_err(|e| {
                Error::model_file(path, format!("tensor `{name}`: {}", candle_message(&e)))
            })
        };
        let embed_q = tensor("token_embd.weight")?;
        let tied = !ct.tensor_infos.contains_key("output.weight");
        // The lookup table stays quantised where our kernels read its format: rows are
        // dequantised as tokens come. When the output projection is the same matrix (tied), the
        // output layer's copy serves both.
        let ours = host && crate::kernels::QLinear::supports(&embed_q);
        let embed = match (ours, tied) {
            (true, true) => Embedding::Tied,
            (true, false) => {
                match crate::kernels::QLinear::from_qtensor(&embed_q, crate::kernels::Isa::detect())
                {
                    Some(q) => Embedding::Quantized(q),
                    None => Embedding::Table(embed_q.dequantize(device)?),
                }
            }
            (false, _) => Embedding::Table(embed_q.dequantize(device)?),
        };
        let norm = Norm::new(tensor("output_norm.weight")?, cfg.rms_eps, host)?;
        // Small models tie the output projection to the embedding.
        let output = match tied {
            false => Linear::new(tensor("output.weight")?, host)?,
            true => Linear::new(embed_q, host)?,
        };

        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let mut weight = |n: &str| tensor(&format!("blk.{i}.{n}.weight"));
            let qkv = Group::new(
                vec![weight("attn_q")?, weight("attn_k")?, weight("attn_v")?],
                host,
            )?;
            let gate_up = Group::new(vec![weight("ffn_gate")?, weight("ffn_up")?], host)?;
            let wo = Linear::new(weight("attn_output")?, host)?;
            let w_down = Linear::new(weight("ffn_down")?, host)?;
            let bias = match cfg.family.qkv_bias {
                false => None,
                true => {
                    let mut b = |n: &str| -> Result<Tensor> {
                        Ok(tensor(&format!("blk.{i}.{n}.bias"))?.dequantize(device)?)
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
            let qk_norm = match cfg.family.qk_norm {
                false => None,
                true => {
                    let mut n = |n: &str| -> Result<Norm> {
                        Norm::new(tensor(&format!("blk.{i}.{n}.weight"))?, cfg.rms_eps, host)
                    };
                    Some((n("attn_q_norm")?, n("attn_k_norm")?))
                }
            };
            layers.push(Layer {
                qkv,
                bias,
                qk_norm,
                wo,
                gate_up,
                w_down,
                attn_norm: Norm::new(
                    tensor(&format!("blk.{i}.attn_norm.weight"))?,
                    cfg.rms_eps,
                    host,
                )?,
                ffn_norm: Norm::new(
                    tensor(&format!("blk.{i}.ffn_norm.weight"))?,
                    cfg.rms_eps,
                    host,
                )?,
            });
        }
        Ok(Llama {
            cfg,
            embed,
            layers,
            norm,
            output,
            cos,
            sin,
            rope,
            device: device.clone(),
        })
    }

    /// The embedding rows of `ids`.
    fn embed(&self, ids: &[u32]) -> Result<Tensor> {
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

    /// Bytes of KV cache one position costs (keys and values, every layer): f16 on the host,
    /// f32 in candle's tensors.
    pub fn kv_bytes_per_token(&self) -> usize {
        let elem = match self.rope {
            Some(_) => std::mem::size_of::<f16>(),
            None => DType::F32.size_in_bytes(),
        };
        2 * self.cfg.n_layer * self.cfg.n_kv_head * self.cfg.head_dim * elem
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
        let cfg = &self.cfg;
        if batch.is_empty() {
            return Ok(Vec::new());
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
            cache.reserve(cfg, tokens.len(), &self.device, self.rope.is_some())?;
            ids.extend_from_slice(tokens);
        }
        // Per sequence: its first row in the batch and its number of rows.
        let mut spans = Vec::with_capacity(batch.len());
        let mut row = 0;
        for (tokens, _) in batch.iter() {
            spans.push((row, tokens.len()));
            row += tokens.len();
        }
        if let Some(rope) = &self.rope {
            return self.forward_host(rope, &ids, batch, &spans);
        }
        // candle's attention (GPU) takes RoPE and mask tables per sequence, made once per step.
        let tables = batch
            .iter()
            .map(|(tokens, cache)| self.device_tables(tokens.len(), cache.len()))
            .collect::<Result<Vec<_>>>()?;

        let mut x = self.embed(&ids)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward(&x)?;
            let y = self.attend_device(li, layer, &h, batch, &spans, &tables)?;
            x = (x + layer.wo.forward(&y)?)?;

            let h = layer.ffn_norm.forward(&x)?;
            let [gate, up]: [Tensor; 2] = layer
                .gate_up
                .forward(&h)?
                .try_into()
                .map_err(|_| Error::Candle(candle_core::Error::Msg("gate, up".into())))?;
            x = (x + layer.w_down.forward(&(gate.silu()? * up)?)?)?;
        }
        for (tokens, cache) in batch.iter_mut() {
            cache.advance(tokens.len());
        }

        // Only the last row of each sequence is projected to the vocabulary.
        let last_rows: Vec<u32> = spans.iter().map(|(row, t)| (row + t - 1) as u32).collect();
        let last = x.index_select(&Tensor::new(last_rows.as_slice(), &self.device)?, 0)?;
        let logits = self.output.forward(&self.norm.forward(&last)?)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec2()?)
    }

    /// Attention on the host for one layer: RoPE in place on the new rows' queries and keys,
    /// keys and values appended to each cache, then every query over its cache
    /// (`attention.rs`). `qkv` is `[rows][q | k | v]`; returns `[rows][n_head·head_dim]`.
    fn attend_host(
        &self,
        li: usize,
        rope: &Rope,
        shape: attention::Shape,
        mut qkv: Vec<f32>,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let hd = shape.head_dim;
        let (qw, kw) = (shape.n_head * hd, shape.kv_width());
        let stride = qw + 2 * kw;
        for ((_, cache), &(row, t)) in batch.iter_mut().zip(spans) {
            for i in 0..t {
                let r = &mut qkv[(row + i) * stride..][..stride];
                let (q, kv) = r.split_at_mut(qw);
                rope.apply(q, hd, cache.len() + i);
                // The queries meet f16 keys at f16 precision, as in llama.cpp (whose dot
                // product with an f16 cache converts them): measured closer to its answers
                // (219 of 224 teacher-forced steps agree instead of 215).
                for v in q.iter_mut() {
                    *v = f16::from_f32(*v).to_f32();
                }
                rope.apply(&mut kv[..kw], hd, cache.len() + i);
                cache.push_host(li, i, &kv[..kw], &kv[kw..]);
            }
        }
        let mut seqs = Vec::with_capacity(batch.len());
        for ((tokens, cache), _) in batch.iter().zip(spans) {
            let kv = cache.host_layer(li).ok_or_else(|| {
                Error::Candle(candle_core::Error::Msg(
                    "a GPU KV cache on a CPU model".into(),
                ))
            })?;
            seqs.push(Span {
                t: tokens.len(),
                pos: cache.len(),
                kv,
            });
        }
        let rows = qkv.len() / stride;
        let mut out = vec![0f32; rows * qw];
        attention::attend(
            shape,
            &qkv,
            stride,
            &seqs,
            &mut out,
            crate::kernels::Isa::detect(),
        );
        Ok(out)
    }

    /// [`forward_batch`](Self::forward_batch) on the host (CPU models): row-major `f32`
    /// buffers from the embedding to the logits, our kernels and attention, no candle tensors
    /// on the way (their worker thread spins after each operation, taking a core from ours).
    fn forward_host(
        &self,
        rope: &Rope,
        ids: &[u32],
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Vec<Vec<f32>>> {
        let cfg = &self.cfg;
        let isa = crate::kernels::Isa::detect();
        let shape = attention::Shape {
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
        };
        let m = ids.len();
        let mut x = self.embed(ids)?.flatten_all()?.to_vec1::<f32>()?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward_host(&x);
            let mut qkv = layer.qkv.forward_host(&h, m)?;
            self.shape_qkv_host(layer, &mut qkv);
            let y = self.attend_host(li, rope, shape, qkv, batch, spans)?;
            ops::add(&mut x, &layer.wo.forward_host(&y, m)?);

            let h = layer.ffn_norm.forward_host(&x);
            let gate_up = layer.gate_up.forward_host(&h, m)?;
            let act = ops::swiglu(&gate_up, gate_up.len() / m / 2, isa);
            ops::add(&mut x, &layer.w_down.forward_host(&act, m)?);
        }
        for (tokens, cache) in batch.iter_mut() {
            cache.advance(tokens.len());
        }
        // Only the last row of each sequence is projected to the vocabulary.
        let mut last = Vec::with_capacity(spans.len() * cfg.hidden);
        for (row, t) in spans {
            last.extend_from_slice(&x[(row + t - 1) * cfg.hidden..][..cfg.hidden]);
        }
        let logits = self
            .output
            .forward_host(&self.norm.forward_host(&last), spans.len())?;
        let vocab = logits.len() / spans.len();
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    /// The family's steps between the q/k/v projections and RoPE, on the host rows
    /// `[rows][q | k | v]`: the biases added (Qwen2), each head's query and key RMS-normalised
    /// (Qwen3).
    fn shape_qkv_host(&self, layer: &Layer, qkv: &mut [f32]) {
        let cfg = &self.cfg;
        let (qw, kw) = (cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
        let stride = qw + 2 * kw;
        if let Some(b) = &layer.bias {
            for row in qkv.chunks_exact_mut(stride) {
                ops::add(row, &b.host);
            }
        }
        if let Some((qn, kn)) = &layer.qk_norm {
            let mut tmp = vec![0f32; qw.max(kw)];
            for row in qkv.chunks_exact_mut(stride) {
                let (q, rest) = row.split_at_mut(qw);
                for (part, norm) in [(q, qn), (&mut rest[..kw], kn)] {
                    let out = &mut tmp[..part.len()];
                    ops::rms_norm(part, &norm.weight, norm.eps, out);
                    part.copy_from_slice(out);
                }
            }
        }
    }

    /// RoPE tables and causal mask of a sequence's `t` new rows after `pos` cached positions,
    /// for candle's attention.
    fn device_tables(&self, t: usize, pos: usize) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let n_rep = self.cfg.n_head / self.cfg.n_kv_head;
        let mask = match t > 1 {
            true => Some(causal_mask(t, pos, n_rep, &self.device)?),
            false => None,
        };
        Ok((
            self.cos.narrow(0, pos, t)?,
            self.sin.narrow(0, pos, t)?,
            mask,
        ))
    }

    /// Attention through candle's tensors (GPU models): one layer, each sequence against its
    /// cache. Returns `[rows, n_head·head_dim]`.
    fn attend_device(
        &self,
        li: usize,
        layer: &Layer,
        h: &Tensor,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
        tables: &[(Tensor, Tensor, Option<Tensor>)],
    ) -> Result<Tensor> {
        let (n_head, n_kv, hd) = (self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim);
        let n_rep = n_head / n_kv;
        let scale = 1.0 / (hd as f64).sqrt();
        let [mut q, mut k, mut v]: [Tensor; 3] = layer
            .qkv
            .forward(h)?
            .try_into()
            .map_err(|_| Error::Candle(candle_core::Error::Msg("q, k, v".into())))?;
        if let Some(b) = &layer.bias {
            q = q.broadcast_add(&b.q)?;
            k = k.broadcast_add(&b.k)?;
            v = v.broadcast_add(&b.v)?;
        }
        if let Some((qn, kn)) = &layer.qk_norm {
            let rows = q.dim(0)?;
            q = qn
                .forward(&q.reshape((rows, n_head, hd))?)?
                .reshape((rows, n_head * hd))?;
            k = kn
                .forward(&k.reshape((rows, n_kv, hd))?)?
                .reshape((rows, n_kv * hd))?;
        }
        let rotate = match self.cfg.family.rope {
            super::family::RopeStyle::Normal => candle_nn::rotary_emb::rope_i,
            super::family::RopeStyle::Neox => candle_nn::rotary_emb::rope,
        };
        let mut ys = Vec::with_capacity(batch.len());
        for (((_, cache), &(row, t)), (cos, sin, mask)) in batch.iter_mut().zip(spans).zip(tables) {
            let heads = |m: &Tensor, n: usize| -> Result<Tensor> {
                Ok(m.narrow(0, row, t)?
                    .reshape((1, t, n, hd))?
                    .transpose(1, 2)?
                    .contiguous()?)
            };
            let qs = rotate(&heads(&q, n_head)?, cos, sin)?;
            let ks = rotate(&heads(&k, n_kv)?, cos, sin)?;
            let (ks, vs) = cache.append(li, &ks, &heads(&v, n_kv)?)?;
            // Grouped-query attention without copying K/V: the n_rep query heads that share
            // a KV head are consecutive, so [1, n_head, t, hd] is [1, n_kv, n_rep·t, hd].
            let qs = qs.reshape((1, n_kv, n_rep * t, hd))?;
            let att = (qs.matmul(&ks.t()?)? * scale)?;
            let att = match mask {
                Some(m) => att.broadcast_add(m)?,
                None => att,
            };
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            ys.push(
                att.matmul(&vs)?
                    .reshape((1, n_head, t, hd))?
                    .transpose(1, 2)?
                    .reshape((t, n_head * hd))?,
            );
        }
        Ok(Tensor::cat(&ys, 0)?)
    }
}
