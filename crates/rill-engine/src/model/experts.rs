//! A mixture of experts' feed-forward (issue 18): a router picks, for each row, the `k` experts
//! it goes through out of many, and the row's output is their SwiGLUs' outputs weighed by the
//! router's probabilities. llama.cpp's `build_moe_ffn` (`llama-graph.cpp`) is the graph this
//! follows: the router's logits (plus its bias, gpt-oss), the `k` likeliest (llama.cpp's
//! `ffn_moe_topk`) and their weights — Qwen3's softmax over every expert renormalised over the
//! chosen, or gpt-oss's softmax over the chosen logits alone ([`Gating`]) — each expert's output
//! (its projections' biases added, gpt-oss) multiplied by its weight and the `k` products added
//! likeliest first.
//!
//! The file holds each projection of all experts as one tensor (`ffn_gate_exps`: `[experts,
//! ff, width]`); each expert's slab becomes a matrix of its own on our kernels
//! ([`RawTensor::split`]), so a step reads only the experts its rows chose. A batch of rows
//! groups its work by expert: every row routed to an expert goes through it in one product, so
//! its weights are read once per step however many rows chose it (what batching buys a
//! mixture). A row's output depends only on that row: the products are row-independent, and
//! each row's `k` outputs are added in the row's own order.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::config::ExpertsConfig;
use super::family::{Activation, Gating};
use super::ops;
use super::parts::{Group, Linear};
use super::tensors::RawTensor;
use crate::error::{Error, Result};
use crate::kernels::{Isa, TensorType};

/// One expert: a gated feed-forward of its own.
struct Expert {
    /// gate, up.
    gate_up: Group,
    down: Linear,
    /// Its projections' biases (gpt-oss): `[gate | up]`, and down's.
    bias: Option<(Vec<f32>, Vec<f32>)>,
}

/// The biases of a mixture whose family has them (gpt-oss), as f32 rows: the router's (one per
/// expert), and each expert's gate, up and down (`[experts][width]`).
pub(super) struct ExpertBiases {
    pub(super) router: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) down: Vec<f32>,
}

/// A layer's mixture of experts.
pub(super) struct Experts {
    /// `ffn_gate_inp`: one logit per expert.
    router: Router,
    /// Added to the router's logits (gpt-oss).
    router_bias: Option<Vec<f32>>,
    experts: Vec<Expert>,
    cfg: ExpertsConfig,
    gating: Gating,
    activation: Activation,
    /// Each expert's output multiplied by its own scale (Gemma 4's `ffn_down_exps.scale`).
    scales: Option<Vec<f32>>,
}

/// The router's matrix. Converted files keep it in f32; its products are then made on the host,
/// row by row in a fixed order, so that a row's route never depends on the rows beside it
/// (candle's f32 GEMM blocks its sums by the batch's size, and a route that flips changes the
/// answer), and candle's path (GPUs) routes with the same arithmetic as ours (its rows come to
/// the host for the route anyway). Other formats run on our kernels, row-independent too, and
/// on candle's on a GPU.
enum Router {
    Host { w: Vec<f32>, cols: usize },
    Linear(Linear),
}

impl Router {
    fn new(t: RawTensor, host: bool) -> Result<Router> {
        match (t.dtype, t.dims.as_slice()) {
            (TensorType::Ggml(GgmlDType::F32), &[_, cols]) => Ok(Router::Host {
                w: t.bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                cols,
            }),
            _ => Ok(Router::Linear(Linear::new(t, host)?)),
        }
    }

    fn bytes(&self) -> (usize, usize) {
        match self {
            Router::Host { w, .. } => (w.len() * 4, w.len() * 4),
            Router::Linear(l) => l.bytes(),
        }
    }

    /// Weights in its matrix.
    fn weights(&self) -> usize {
        match self {
            Router::Host { w, .. } => w.len(),
            Router::Linear(l) => l.weights(),
        }
    }

    /// The logits of `m` rows of `h`, `m × experts`, into `out`.
    fn forward_host_into(&self, h: &[f32], m: usize, out: &mut Vec<f32>) -> Result<()> {
        let (w, cols) = match self {
            Router::Linear(l) => return l.forward_host_into(h, m, out),
            Router::Host { w, cols } => (w, *cols),
        };
        out.clear();
        for row in h.chunks_exact(cols) {
            out.extend(w.chunks_exact(cols).map(|e| dot(row, e)));
        }
        Ok(())
    }

    /// The logits of the rows of `x` (candle's path), on the host: the route is made there.
    fn logits(&self, x: &Tensor) -> Result<Vec<f32>> {
        let on_host = |t: Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        match self {
            Router::Linear(l) => on_host(l.forward(x)?),
            Router::Host { .. } => {
                let (m, _) = x.dims2()?;
                let mut out = Vec::new();
                self.forward_host_into(&on_host(x.clone())?, m, &mut out)?;
                Ok(out)
            }
        }
    }
}

/// `a · b` in eight lanes, then the lanes pairwise: the same order for every row.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let quads = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quads[0] + quads[2]) + (quads[1] + quads[3]) + tail
}

/// The experts a row goes through and their weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// The smallest sum of chosen probabilities divided by (llama.cpp clamps it to f16's smallest
/// normal number, so that a row whose chosen experts all have probability 0 divides by no 0).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// Row `logits`' route as `gating` makes it: `k` experts, the likeliest first (ties to the lower
/// index), into `out` (cleared first).
pub fn route(logits: &[f32], k: usize, gating: Gating, scale: f32, out: &mut Vec<Route>) {
    out.clear();
    match gating {
        Gating::SoftmaxTopK => {
            // ggml's softmax: exponentials of the logits less their largest, summed in f64, the
            // sum's inverse rounded to f32 and multiplied in.
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
            let inv = (1.0 / sum) as f32;
            for _ in 0..k.min(logits.len()) {
                let Some(e) = likeliest(logits, out) else {
                    break;
                };
                out.push(Route {
                    expert: e,
                    weight: (logits[e] - max).exp() * inv,
                });
            }
            let chosen: f32 = out.iter().map(|r| r.weight).sum();
            let by = chosen.max(MIN_WEIGHT_SUM);
            for r in out.iter_mut() {
                r.weight /= by;
            }
        }
        Gating::TopKSoftmax => {
            // The `k` largest logits, then ggml's softmax over them alone (as above: f64 sum,
            // its inverse in f32), in place of the logits.
            for _ in 0..k.min(logits.len()) {
                let Some(e) = likeliest(logits, out) else {
                    break;
                };
                out.push(Route {
                    expert: e,
                    weight: logits[e],
                });
            }
            let max = out
                .iter()
                .map(|r| r.weight)
                .fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = out.iter().map(|r| f64::from((r.weight - max).exp())).sum();
            let inv = (1.0 / sum) as f32;
            for r in out.iter_mut() {
                r.weight = (r.weight - max).exp() * inv;
            }
        }
    }
    if scale != 1.0 {
        out.iter_mut().for_each(|r| r.weight *= scale);
    }
}

/// gpt-oss's mixture (biases, the clamped SwiGLU) runs on our kernels only; `Decoder::from_gguf`
/// refuses the family on candle's path, so this is never reached from a loaded model.
fn cpu_only() -> Error {
    Error::param("device", "this mixture of experts runs on the CPU only")
}

/// The expert of the largest logit not in `out` yet (ties to the lower index).
fn likeliest(logits: &[f32], out: &[Route]) -> Option<usize> {
    (0..logits.len())
        .filter(|e| !out.iter().any(|r| r.expert == *e))
        .fold(None, |best: Option<usize>, e| match best {
            Some(b) if logits[b] >= logits[e] => Some(b),
            _ => Some(e),
        })
}

/// `t`'s `n` experts, each a matrix of its own.
fn split<'a>(t: RawTensor<'a>, n: usize, name: &str) -> Result<Vec<RawTensor<'a>>> {
    t.split(n).ok_or_else(|| {
        Error::Candle(candle_core::Error::Msg(format!(
            "`{name}` does not split into {n} experts"
        )))
    })
}

/// The buffers of a mixture's step on the host, kept between steps.
#[derive(Default)]
pub(super) struct ExpertSpace {
    logits: Vec<f32>,
    /// Row `r`'s routes at `r·k ..`.
    routes: Vec<Route>,
    /// Per expert: the slots (`row·k + j`) routed to it this step.
    slots_of: Vec<Vec<usize>>,
    /// Each slot's expert output, `[row·k + j][width]`.
    slots: Vec<f32>,
}

impl ExpertSpace {
    /// The routes of the last step's rows, row after row (`k` each).
    pub(super) fn routes(&self) -> &[Route] {
        &self.routes
    }
}

impl Experts {
    /// A layer's mixture from its tensors: the router, and the gate and up tensors (or one
    /// tensor of both, the gate first) and down tensor of every expert at once, each split
    /// into one matrix per expert; their biases where the family has them (checked against
    /// these shapes at load: `table.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        router: RawTensor,
        gate_up: Vec<RawTensor>,
        down: RawTensor,
        biases: Option<ExpertBiases>,
        cfg: ExpertsConfig,
        gating: Gating,
        activation: Activation,
        host: bool,
    ) -> Result<Experts> {
        let (n, ff) = (cfg.count, cfg.ff);
        let width = down.dims.get(1).copied().unwrap_or(0);
        let mut gate_up = gate_up.into_iter();
        let groups: Vec<Group> = match (gate_up.next(), gate_up.next()) {
            (Some(gate), Some(up)) => split(gate, n, "gate")?
                .into_iter()
                .zip(split(up, n, "up")?)
                .map(|(g, u)| Group::new(vec![g, u], host))
                .collect::<Result<_>>()?,
            (Some(both), None) => split(both, n, "gate_up")?
                .into_iter()
                .map(|t| Group::fused(t, vec![ff, ff], host))
                .collect::<Result<_>>()?,
            _ => return Err(Error::param("experts", "no gate and up projections")),
        };
        let (downs, b) = (split(down, n, "down")?, biases.as_ref());
        let experts = groups
            .into_iter()
            .zip(downs)
            .enumerate()
            .map(|(e, (gate_up, d))| {
                Ok(Expert {
                    gate_up,
                    down: Linear::new(d, host)?,
                    bias: b.map(|b| {
                        let gate_up = [&b.gate[e * ff..][..ff], &b.up[e * ff..][..ff]].concat();
                        (gate_up, b.down[e * width..][..width].to_vec())
                    }),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Experts {
            router: Router::new(router, host)?,
            router_bias: biases.map(|b| b.router),
            experts,
            cfg,
            gating,
            activation,
            scales: None,
        })
    }

    /// The mixture with each expert's output multiplied by its scale in `scales` (one per
    /// expert, checked at load).
    pub(super) fn with_scales(self, scales: Vec<f32>) -> Experts {
        Experts {
            scales: Some(scales),
            ..self
        }
    }

    /// Bytes of weights held and in the file: the router and every expert.
    pub(super) fn bytes(&self) -> (usize, usize) {
        self.experts
            .iter()
            .flat_map(|e| [e.gate_up.bytes(), e.down.bytes()])
            .fold(self.router.bytes(), |(a, b), (x, y)| (a + x, b + y))
    }

    /// Its matrices that our kernels run: the router's and every expert's.
    pub(super) fn ours(&self) -> Vec<&crate::kernels::QLinear> {
        let router = match &self.router {
            Router::Linear(l) => l.ours(),
            Router::Host { .. } => None,
        };
        let experts = self.experts.iter().flat_map(|e| {
            let mut ours = e.gate_up.ours();
            ours.extend(e.down.ours());
            ours
        });
        router.into_iter().chain(experts).collect()
    }

    /// Bytes of the experts' weights read in the file's map rather than held.
    pub(super) fn mapped_bytes(&self) -> usize {
        self.experts
            .iter()
            .map(|e| e.gate_up.mapped_bytes() + e.down.mapped_bytes())
            .sum()
    }

    /// Bytes a one-row step reads: the router and `used` experts of the average size.
    pub(super) fn step_bytes(&self) -> (usize, usize) {
        let (router, all) = (self.router.bytes(), self.bytes());
        let experts = (all.0 - router.0, all.1 - router.1);
        let (k, n) = (self.cfg.used, self.cfg.count.max(1));
        (router.0 + experts.0 * k / n, router.1 + experts.1 * k / n)
    }

    /// Weights one row goes through (its multiply-adds): the router's and `used` experts' of
    /// the average size.
    pub(super) fn step_weights(&self) -> usize {
        let all: usize = self
            .experts
            .iter()
            .map(|e| e.gate_up.weights() + e.down.weights())
            .sum();
        self.router.weights() + all * self.cfg.used / self.cfg.count.max(1)
    }

    /// Each row's route for the router's `logits` (`rows × experts`), its bias added first.
    fn routes(&self, logits: &mut [f32], into: &mut Vec<Route>) {
        into.clear();
        let mut one = Vec::with_capacity(self.cfg.used);
        for row in logits.chunks_exact_mut(self.cfg.count) {
            if let Some(b) = &self.router_bias {
                ops::add(row, b);
            }
            route(row, self.cfg.used, self.gating, self.cfg.scale, &mut one);
            into.extend_from_slice(&one);
        }
    }

    /// The mixture's output for `m` rows of `h` on the host into `out` (`m × width`), routed
    /// by the router's logits of `route_by`'s rows where given (Gemma 4's), else of `h`'s.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_host_into(
        &self,
        h: &[f32],
        route_by: Option<&[f32]>,
        m: usize,
        isa: Isa,
        w: &mut ExpertSpace,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (k, width, ff) = (self.cfg.used, h.len() / m.max(1), self.cfg.ff);
        self.router
            .forward_host_into(route_by.unwrap_or(h), m, &mut w.logits)?;
        self.routes(&mut w.logits, &mut w.routes);
        w.slots_of.resize_with(self.experts.len(), Vec::new);
        w.slots_of.iter_mut().for_each(Vec::clear);
        for (slot, r) in w.routes.iter().enumerate() {
            w.slots_of[r.expert].push(slot);
        }
        w.slots.resize(m * k * width, 0.0);
        // The chosen experts side by side on the pool (each product splits further where it
        // is large), rather than one after another, each product a parallel section ending in
        // a wait for every thread (measured on the 30B-A3B shape: prefill +14–26%, four
        // streams +20%, one stream's decode the same). Each expert's few buffers are its own
        // (some kB a step).
        let chosen: Vec<(usize, &Expert, &[usize])> = self
            .experts
            .iter()
            .zip(&w.slots_of)
            .enumerate()
            .filter(|(_, (_, s))| !s.is_empty())
            .map(|(i, (e, s))| (i, e, s.as_slice()))
            .collect();
        let activation = self.activation;
        let outs: Vec<Result<Vec<f32>>> = chosen
            .par_iter()
            .map(|&(i, expert, slots)| {
                let mut xs = Vec::with_capacity(slots.len() * width);
                for &slot in slots {
                    xs.extend_from_slice(&h[slot / k * width..][..width]);
                }
                let (mut gate_up, mut act, mut ys) = (Vec::new(), Vec::new(), Vec::new());
                expert
                    .gate_up
                    .forward_host_into(&xs, slots.len(), &mut gate_up)?;
                if let Some((b, _)) = &expert.bias {
                    gate_up
                        .chunks_exact_mut(2 * ff)
                        .for_each(|r| ops::add(r, b));
                }
                ops::gated(&gate_up, ff, activation, isa, &mut act);
                expert.down.forward_host_into(&act, slots.len(), &mut ys)?;
                if let Some(s) = &self.scales {
                    // One scale per expert: `table.rs` checked the tensor's shape.
                    ys.iter_mut().for_each(|v| *v *= s[i]);
                }
                if let Some((_, b)) = &expert.bias {
                    ys.chunks_exact_mut(width).for_each(|r| ops::add(r, b));
                }
                Ok(ys)
            })
            .collect();
        for ((_, _, slots), ys) in chosen.iter().zip(outs) {
            let ys = ys?;
            for (i, &slot) in slots.iter().enumerate() {
                w.slots[slot * width..][..width].copy_from_slice(&ys[i * width..][..width]);
            }
        }
        // Each row: its experts' outputs times their weights, added likeliest first.
        out.clear();
        out.resize(m * width, 0.0);
        for (row, o) in out.chunks_exact_mut(width).enumerate() {
            for j in 0..k {
                let slot = row * k + j;
                let weight = w.routes[slot].weight;
                let y = &w.slots[slot * width..][..width];
                if j == 0 {
                    o.iter_mut().zip(y).for_each(|(o, y)| *o = y * weight);
                } else {
                    o.iter_mut().zip(y).for_each(|(o, y)| *o += y * weight);
                }
            }
        }
        Ok(())
    }

    /// The mixture on candle's tensors (GPUs): the route on the host (of `route_by`'s rows
    /// where given), then each chosen expert over the rows routed to it, weighed and added
    /// into the output.
    pub(super) fn forward(&self, x: &Tensor, route_by: Option<&Tensor>) -> Result<Tensor> {
        let (m, width) = x.dims2()?;
        if self.router_bias.is_some() {
            return Err(cpu_only());
        }
        let mut logits = self.router.logits(route_by.unwrap_or(x))?;
        let mut routes = Vec::new();
        self.routes(&mut logits, &mut routes);
        let k = self.cfg.used;
        let device: &Device = x.device();
        let mut y = Tensor::zeros((m, width), x.dtype(), device)?;
        for (e, expert) in self.experts.iter().enumerate() {
            let (rows, weights): (Vec<u32>, Vec<f32>) = routes
                .iter()
                .enumerate()
                .filter(|(_, r)| r.expert == e)
                .map(|(slot, r)| {
                    let scale = self.scales.as_ref().map_or(1.0, |s| s[e]);
                    ((slot / k) as u32, r.weight * scale)
                })
                .unzip();
            if rows.is_empty() {
                continue;
            }
            let n = rows.len();
            let idx = Tensor::new(rows.as_slice(), device)?;
            let xs = x.index_select(&idx, 0)?;
            let [gate, up]: [Tensor; 2] = expert
                .gate_up
                .forward(&xs)?
                .try_into()
                .map_err(|_| Error::Candle(candle_core::Error::Msg("gate, up".into())))?;
            let gate = match self.activation {
                Activation::Silu => gate.silu()?,
                Activation::GeluTanh => gate.gelu()?,
                Activation::SwigluOai => return Err(cpu_only()),
            };
            let weights = Tensor::from_vec(weights, (n, 1), device)?.to_dtype(x.dtype())?;
            let out = expert
                .down
                .forward(&(gate * up)?)?
                .broadcast_mul(&weights)?;
            y = y.index_add(&idx, &out, 0)?;
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_likeliest_experts_are_chosen_and_their_weights_sum_to_one() {
        let logits = [0.5, 2.0, -1.0, 1.5, 2.0, 0.0];
        let mut out = Vec::new();
        route(&logits, 3, Gating::SoftmaxTopK, 1.0, &mut out);
        let experts: Vec<usize> = out.iter().map(|r| r.expert).collect();
        // Equal logits: the lower index first.
        assert_eq!(experts, [1, 4, 3]);
        let sum: f32 = out.iter().map(|r| r.weight).sum();
        assert!((sum - 1.0).abs() < 1e-6, "{sum}");
        // The weights are the softmax's probabilities renormalised over the chosen: in the
        // ratio of their exponentials.
        let e = |l: f32| f64::from(l).exp();
        let want = e(1.5) / (e(2.0) + e(2.0) + e(1.5));
        assert!((f64::from(out[2].weight) - want).abs() < 1e-6);
        assert_eq!(out[0].weight, out[1].weight);
        // A scale multiplies them; k = all experts keeps them all.
        route(&logits, 6, Gating::SoftmaxTopK, 2.5, &mut out);
        assert_eq!(out.len(), 6);
        let sum: f32 = out.iter().map(|r| r.weight).sum();
        assert!((sum - 2.5).abs() < 1e-5, "{sum}");
    }

    #[test]
    fn experts_that_cannot_be_chosen_still_fill_a_route_without_nan() {
        // Logits of -inf (a masked expert) have probability 0: the route still has k experts,
        // the likely one first with all the weight.
        let mut logits = vec![f32::NEG_INFINITY; 8];
        logits[7] = 0.0;
        let mut out = Vec::new();
        route(&logits, 2, Gating::SoftmaxTopK, 1.0, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].expert, 7);
        assert!(out.iter().all(|r| r.weight.is_finite()), "{out:?}");
        assert!((out[0].weight - 1.0).abs() < 1e-6 && out[1].weight == 0.0);
    }
}
