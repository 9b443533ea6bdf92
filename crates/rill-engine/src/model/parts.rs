//! The weights a block is made of, each runnable on our kernels (CPU, plain host buffers) or
//! on candle's tensors (GPUs): linear layers, groups of them that read the same input, RMS
//! norms, the embedding table, q/k/v biases.

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use candle_transformers::quantized_nn::RmsNorm;

use super::ops;
use super::tensors::RawTensor;
use crate::error::Result;

/// A linear layer: our kernels where they run the format (CPU; Q4_0, Q4_1, Q5_0, Q8_0, Q4_K,
/// Q6_K), else candle's.
pub(super) enum Linear {
    Ours(crate::kernels::QLinear),
    Candle(QMatMul),
}

impl Linear {
    /// Our kernels when `host` (a CPU model on Rill's own path) and they read the format.
    pub(super) fn new(t: RawTensor, host: bool) -> Result<Linear> {
        if host {
            if let Some(l) = ours(&t) {
                return Ok(Linear::Ours(l));
            }
        }
        Ok(Linear::Candle(QMatMul::from_qtensor(t.qtensor()?)?))
    }

    /// Bytes of weights one product reads, and the bytes they take in the file.
    pub(super) fn bytes(&self) -> (usize, usize) {
        match self {
            Linear::Ours(l) => (l.bytes(), l.file_bytes()),
            Linear::Candle(m) => (matmul_bytes(m), matmul_bytes(m)),
        }
    }

    /// Weights in its matrix: the multiply-adds one row's product takes.
    pub(super) fn weights(&self) -> usize {
        match self {
            Linear::Ours(l) => l.n_out() * l.k,
            Linear::Candle(m) => matmul_weights(m),
        }
    }

    /// Its matrix, when its panels are still to be made (`kernels/later.rs`).
    pub(super) fn later(&self) -> Option<std::sync::Arc<crate::kernels::Later>> {
        match self {
            Linear::Ours(l) => l.later(),
            Linear::Candle(_) => None,
        }
    }

    /// Bytes of its weights read in the file's map rather than held.
    pub(super) fn mapped_bytes(&self) -> usize {
        match self {
            Linear::Ours(l) => l.mapped_bytes(),
            Linear::Candle(_) => 0,
        }
    }

    /// Its output's width.
    pub(super) fn n_out(&self) -> usize {
        match self {
            Linear::Ours(l) => l.n_out(),
            Linear::Candle(m) => matmul_rows(m),
        }
    }

    /// Its matrix, when our kernels run it.
    pub(super) fn ours(&self) -> Option<&crate::kernels::QLinear> {
        match self {
            Linear::Ours(l) => Some(l),
            Linear::Candle(_) => None,
        }
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Linear::Ours(l) => l.forward(x)?,
            Linear::Candle(m) => m.forward(x)?,
        })
    }

    /// `x · wᵀ` for `m` row-major rows on the host.
    pub(super) fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.forward_host_into(x, m, &mut out)?;
        Ok(out)
    }

    /// [`forward_host`](Self::forward_host) into `out` (resized to fit): a buffer kept
    /// between steps allocates nothing.
    pub(super) fn forward_host_into(&self, x: &[f32], m: usize, out: &mut Vec<f32>) -> Result<()> {
        match self {
            Linear::Ours(l) => product_into(l, x, m, out),
            Linear::Candle(q) => candle_into(q, x, m, out)?,
        }
        Ok(())
    }
}

/// The matrix on our kernels, made from the file's bytes (or read in the file's map, for a
/// format they run as it lies: MXFP4, a mixture's experts, and a K-quant matrix until its
/// panels are made), where they run its format.
fn ours(t: &RawTensor) -> Option<crate::kernels::QLinear> {
    let isa = crate::kernels::Isa::detect();
    crate::kernels::QLinear::from_raw_in(t.dtype, &t.dims, &t.bytes, isa, t.map(), t.expert)
}

/// Bytes of a candle matrix's weights.
fn matmul_bytes(m: &QMatMul) -> usize {
    match m {
        QMatMul::QTensor(t) => t.storage_size_in_bytes(),
        QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.elem_count() * t.dtype().size_in_bytes(),
    }
}

/// Rows of a candle matrix (its output's width).
fn matmul_rows(m: &QMatMul) -> usize {
    match m {
        QMatMul::QTensor(t) => t.shape().dims().first().copied().unwrap_or(0),
        QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims().first().copied().unwrap_or(0),
    }
}

/// Weights in a candle matrix.
fn matmul_weights(m: &QMatMul) -> usize {
    match m {
        QMatMul::QTensor(t) => t.shape().elem_count(),
        QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.elem_count(),
    }
}

/// `x · wᵀ` on our kernels into `out`, which they overwrite whole.
fn product_into(l: &crate::kernels::QLinear, x: &[f32], m: usize, out: &mut Vec<f32>) {
    out.resize(m * l.n_out(), 0.0);
    l.matmul(x, m, out);
}

/// `x · wᵀ` on candle's kernels (formats ours do not read), copied into `out`.
fn candle_into(q: &QMatMul, x: &[f32], m: usize, out: &mut Vec<f32>) -> Result<()> {
    let x = Tensor::from_slice(x, (m, x.len() / m.max(1)), &Device::Cpu)?;
    let y = q.forward(&x)?.to_dtype(DType::F32)?.flatten_all()?;
    out.clear();
    out.extend_from_slice(&y.to_vec1::<f32>()?);
    Ok(())
}

/// An RMS norm's weights: candle's module (GPU) and the same weights on the host.
pub(super) struct Norm {
    pub(super) candle: RmsNorm,
    pub(super) weight: Vec<f32>,
    pub(super) eps: f32,
    /// On the host, llama.cpp's arithmetic ([`ops::rms_norm_like_ggml`]) instead of candle's.
    pub(super) like_ggml: bool,
}

impl Norm {
    /// The host copy is only made for a CPU model (`host`).
    pub(super) fn new(t: QTensor, eps: f64, host: bool, like_ggml: bool) -> Result<Norm> {
        let weight = match host {
            true => t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?,
            false => Vec::new(),
        };
        Ok(Norm {
            candle: RmsNorm::from_qtensor(t, eps)?,
            weight,
            eps: eps as f32,
            like_ggml,
        })
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.candle.forward(x)?)
    }

    pub(super) fn forward_host(&self, x: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        self.forward_host_into(x, &mut out);
        out
    }

    /// [`forward_host`](Self::forward_host) into `out` (resized to fit).
    pub(super) fn forward_host_into(&self, x: &[f32], out: &mut Vec<f32>) {
        out.resize(x.len(), 0.0);
        self.apply(x, out);
    }

    /// Each row of `x` (rows of the weights' width) normalised into `out`.
    pub(super) fn apply(&self, x: &[f32], out: &mut [f32]) {
        match self.like_ggml {
            true => ops::rms_norm_like_ggml(x, &self.weight, self.eps, out),
            false => ops::rms_norm(x, &self.weight, self.eps, out),
        }
    }
}

/// The token embedding table.
pub(super) enum Embedding {
    /// In f32 (formats our kernels do not read, GPUs).
    Table(Tensor),
    /// Quantised, rows dequantised on lookup.
    Quantized(crate::kernels::QLinear),
    /// The output projection's matrix, rows dequantised on lookup.
    Tied,
}

/// Linear layers that read the same input (q, k, v; gate, up): one stacked matmul when our
/// kernels take them all, else each on its own; or one tensor the file fused them into.
pub(super) enum Group {
    Stacked(crate::kernels::QLinear, Vec<usize>),
    Apart(Vec<Linear>),
    /// A fused tensor on candle's kernels, its output cut into parts of these widths.
    Fused(QMatMul, Vec<usize>),
}

impl Group {
    pub(super) fn new(parts: Vec<RawTensor>, host: bool) -> Result<Group> {
        if host {
            let ours: Option<Vec<_>> = parts.iter().map(ours).collect();
            if let Some(ours) = ours {
                let widths = ours.iter().map(|l| l.n_out()).collect();
                if !crate::kernels::QLinear::stackable(&ours) {
                    // Formats that differ (Q4_K_M's Q4_K q and k beside a Q6_K v): apart, as
                    // made, not made again.
                    return Ok(Group::Apart(ours.into_iter().map(Linear::Ours).collect()));
                }
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

    /// One tensor holding the parts (`widths` of output each, in order): Phi-3's `attn_qkv`
    /// and gate-up `ffn_up`. On our kernels it is a stacked group as it lies.
    pub(super) fn fused(t: RawTensor, widths: Vec<usize>, host: bool) -> Result<Group> {
        if host {
            if let Some(l) = ours(&t) {
                return Ok(Group::Stacked(l, widths));
            }
        }
        Ok(Group::Fused(QMatMul::from_qtensor(t.qtensor()?)?, widths))
    }

    /// Bytes of weights one product of the group reads, and the bytes they take in the file.
    pub(super) fn bytes(&self) -> (usize, usize) {
        match self {
            Group::Stacked(l, _) => (l.bytes(), l.file_bytes()),
            Group::Apart(ls) => ls
                .iter()
                .map(Linear::bytes)
                .fold((0, 0), |(a, b), (x, y)| (a + x, b + y)),
            Group::Fused(m, _) => (matmul_bytes(m), matmul_bytes(m)),
        }
    }

    /// Weights in the group's matrices: the multiply-adds one row's products take.
    pub(super) fn weights(&self) -> usize {
        match self {
            Group::Stacked(l, _) => l.n_out() * l.k,
            Group::Apart(ls) => ls.iter().map(Linear::weights).sum(),
            Group::Fused(m, _) => matmul_weights(m),
        }
    }

    /// Its matrices that our kernels run.
    pub(super) fn ours(&self) -> Vec<&crate::kernels::QLinear> {
        match self {
            Group::Stacked(l, _) => vec![l],
            Group::Apart(ls) => ls.iter().filter_map(Linear::ours).collect(),
            Group::Fused(..) => Vec::new(),
        }
    }

    /// Its matrices whose panels are still to be made (`kernels/later.rs`).
    pub(super) fn later(&self) -> Vec<std::sync::Arc<crate::kernels::Later>> {
        match self {
            Group::Stacked(l, _) => l.later().into_iter().collect(),
            Group::Apart(ls) => ls.iter().filter_map(Linear::later).collect(),
            Group::Fused(..) => Vec::new(),
        }
    }

    /// Bytes of its weights read in the file's map rather than held.
    pub(super) fn mapped_bytes(&self) -> usize {
        match self {
            Group::Stacked(l, _) => l.mapped_bytes(),
            Group::Apart(ls) => ls.iter().map(Linear::mapped_bytes).sum(),
            Group::Fused(..) => 0,
        }
    }

    /// The outputs' widths together.
    pub(super) fn n_out(&self) -> usize {
        match self {
            Group::Stacked(_, widths) | Group::Fused(_, widths) => widths.iter().sum(),
            Group::Apart(ls) => ls.iter().map(Linear::n_out).sum(),
        }
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        Ok(match self {
            Group::Stacked(l, widths) => l.forward_parts(x, widths)?,
            Group::Apart(ls) => ls.iter().map(|l| l.forward(x)).collect::<Result<_>>()?,
            Group::Fused(m, widths) => {
                let whole = m.forward(x)?;
                let mut from = 0;
                let mut parts = Vec::with_capacity(widths.len());
                for &w in widths {
                    parts.push(whole.narrow(1, from, w)?.contiguous()?);
                    from += w;
                }
                parts
            }
        })
    }

    /// The outputs side by side for `m` rows on the host, row-major (`[rows][q | k | v]`), into
    /// `out` (resized to fit).
    pub(super) fn forward_host_into(&self, x: &[f32], m: usize, out: &mut Vec<f32>) -> Result<()> {
        match self {
            Group::Stacked(l, _) => product_into(l, x, m, out),
            Group::Fused(q, _) => candle_into(q, x, m, out)?,
            Group::Apart(ls) => {
                let parts = ls
                    .iter()
                    .map(|l| l.forward_host(x, m))
                    .collect::<Result<Vec<_>>>()?;
                out.clear();
                for r in 0..m {
                    for p in &parts {
                        let w = p.len() / m.max(1);
                        out.extend_from_slice(&p[r * w..(r + 1) * w]);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The q/k/v biases of a layer (Qwen2): `[q | k | v]` on the host, one tensor each for candle.
pub(super) struct Bias {
    pub(super) host: Vec<f32>,
    pub(super) q: Tensor,
    pub(super) k: Tensor,
    pub(super) v: Tensor,
}

/// A mixture's shared expert: one SwiGLU every row goes through, its output multiplied by the
/// sigmoid of the row's dot product with `gate` (llama.cpp's `ffn_gate_inp_shexp`).
pub(super) struct SharedExpert {
    /// gate, up.
    pub(super) gate_up: Group,
    pub(super) down: Linear,
    pub(super) gate: Vec<f32>,
}

impl SharedExpert {
    pub(super) fn bytes(&self) -> (usize, usize) {
        let ((a, b), (c, d)) = (self.gate_up.bytes(), self.down.bytes());
        (a + c, b + d)
    }

    pub(super) fn weights(&self) -> usize {
        self.gate_up.weights() + self.down.weights()
    }
}

/// Gemma 4's per-layer embeddings (E2B, E4B): every layer's own embedding of each token, one
/// row of `n_layer · width` per token (`per_layer_token_embd`, read in the file's map and
/// looked up as the model's embedding is), and the projection of the embedded residual
/// stream to the same widths with its norm (`per_layer_model_proj`, `per_layer_proj_norm`).
pub(super) struct PerLayerInputs {
    pub(super) table: crate::kernels::QLinear,
    pub(super) proj: Linear,
    pub(super) norm: Norm,
    /// One layer's width.
    pub(super) width: usize,
}

impl PerLayerInputs {
    /// The table's rows of `ids`, `[ids][n_layer · width]`.
    pub(super) fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        match self.table.rows(ids) {
            Some(r) => Ok(r?),
            None => Err(crate::error::Error::param(
                "prompt",
                "a token id is outside the model's per-layer embedding table",
            )),
        }
    }
}

/// A layer's per-layer embedding step (Gemma 4's E2B and E4B): `x + norm(proj(gelu(gate(x)) ·
/// input))`, `input` the layer's part of the token's per-layer inputs.
pub(super) struct PerLayerStep {
    pub(super) gate: Linear,
    pub(super) proj: Linear,
    pub(super) norm: Norm,
}

impl PerLayerStep {
    pub(super) fn bytes(&self) -> (usize, usize) {
        let ((a, b), (c, d)) = (self.gate.bytes(), self.proj.bytes());
        (a + c, b + d)
    }

    pub(super) fn weights(&self) -> usize {
        self.gate.weights() + self.proj.weights()
    }
}
