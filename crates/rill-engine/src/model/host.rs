//! The forward pass on the host (CPU models): row-major `f32` buffers from the embedding to
//! the logits, our kernels (`kernels/`) and our attention (`attention.rs`), the family's steps
//! on the way. Its buffers are kept between steps in a [`Workspace`]: a step of a 1B model
//! would otherwise take fresh memory for every layer and fault its pages in, which cost a
//! Qwen2 file a fifth of its prefill speed (measured; llama's allocations happened to reuse
//! the allocator's memory).

use half::f16;

use super::attention::{self, Scores, Span};
use super::experts::{ExpertSpace, Route};
use super::llama::{Ffn, KvCache, Layer, Llama};
use super::ops;
use crate::error::{Error, Result};

/// The host forward pass's buffers, grown to the largest step and reused by every layer.
#[derive(Default)]
pub(super) struct Workspace {
    /// A norm's output.
    h: Vec<f32>,
    /// `[rows][q | k | v]`.
    qkv: Vec<f32>,
    /// Attention's output.
    att: Vec<f32>,
    /// A block's output, before the residual add.
    y: Vec<f32>,
    /// `[rows][gate | up]`.
    gate_up: Vec<f32>,
    /// The gated activation.
    act: Vec<f32>,
    /// A mixture of experts' buffers.
    experts: ExpertSpace,
}

impl Llama {
    /// How layer `layer`'s scores are made on the host: scaled by `1/√head_dim` unless the
    /// queries were scaled already, soft-capped, over the layer's window.
    fn scores<'a>(&self, layer: &'a Layer) -> Scores<'a> {
        Scores {
            scale: match self.cfg.query_prescale {
                Some(_) => 1.0,
                None => 1.0 / (self.cfg.head_dim as f32).sqrt(),
            },
            softcap: self.cfg.attn_softcap,
            window: layer.window,
            f16_weights: self.cfg.family.llama_cpp_rounding,
            sinks: layer.sinks.as_deref(),
        }
    }

    /// Attention on the host for one layer: RoPE in place on the new rows' queries and keys,
    /// keys and values appended to each cache, then every query over its cache
    /// (`attention.rs`). `qkv` is `[rows][q | k | v]`; `out` receives
    /// `[rows][n_head·head_dim]`.
    fn attend_host(
        &self,
        li: usize,
        shape: attention::Shape,
        qkv: &mut [f32],
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let layer = &self.layers[li];
        let rope = self.ropes[layer.rope]
            .host
            .as_ref()
            .ok_or_else(|| Error::Candle(candle_core::Error::Msg("no host RoPE table".into())))?;
        let hd = shape.head_dim;
        let (qw, kw) = (shape.n_head * hd, shape.kv_width());
        let stride = qw + 2 * kw;
        for ((_, cache), &(row, t)) in batch.iter_mut().zip(spans) {
            for i in 0..t {
                let r = &mut qkv[(row + i) * stride..][..stride];
                let (q, kv) = r.split_at_mut(qw);
                rope.apply(q, hd, cache.len() + i);
                if let Some(s) = self.cfg.query_prescale {
                    q.iter_mut().for_each(|v| *v *= s);
                }
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
        out.resize(rows * qw, 0.0);
        attention::attend(
            shape,
            self.scores(layer),
            qkv,
            stride,
            &seqs,
            out,
            crate::kernels::Isa::detect(),
        );
        Ok(())
    }

    /// [`forward_batch`](Self::forward_batch) on the host (CPU models): row-major `f32`
    /// buffers from the embedding to the logits, our kernels and attention, no candle tensors
    /// on the way (their worker thread spins after each operation, taking a core from ours).
    /// `routes`, when given, receives each mixture-of-experts layer's routes of every row.
    pub(super) fn forward_host(
        &self,
        ids: &[u32],
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
        out_rows: &[usize],
        outs: &[usize],
        mut routes: Option<&mut Vec<Vec<Route>>>,
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
        if cfg.family.embed_scale {
            let s = (cfg.hidden as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= s);
        }
        // Kept between steps: fresh buffers would fault their pages in at every layer.
        let mut kept = self.workspace.try_lock();
        let mut own = Workspace::default();
        let w = match kept.as_deref_mut() {
            Ok(w) => w,
            // Another thread runs this model (tests do): a workspace of its own.
            Err(_) => &mut own,
        };
        for (li, layer) in self.layers.iter().enumerate() {
            layer.attn_norm.forward_host_into(&x, &mut w.h);
            layer.qkv.forward_host_into(&w.h, m, &mut w.qkv)?;
            self.shape_qkv_host(layer, &mut w.qkv);
            self.attend_host(li, shape, &mut w.qkv, batch, spans, &mut w.att)?;
            layer.wo.forward_host_into(&w.att, m, &mut w.y)?;
            if let Some(b) = &layer.wo_bias {
                w.y.chunks_exact_mut(cfg.hidden)
                    .for_each(|r| ops::add(r, b));
            }
            if let Some((post, _)) = &layer.post_norms {
                post.forward_host_into(&w.y, &mut w.h);
                std::mem::swap(&mut w.h, &mut w.y);
            }
            ops::add(&mut x, &w.y);

            layer.ffn_norm.forward_host_into(&x, &mut w.h);
            match &layer.ffn {
                Ffn::Dense { gate_up, down } => {
                    gate_up.forward_host_into(&w.h, m, &mut w.gate_up)?;
                    let width = w.gate_up.len() / m / 2;
                    ops::gated(&w.gate_up, width, cfg.family.activation, isa, &mut w.act);
                    down.forward_host_into(&w.act, m, &mut w.y)?;
                }
                Ffn::Experts(e) => {
                    e.forward_host_into(&w.h, m, isa, &mut w.experts, &mut w.y)?;
                    if let Some(r) = routes.as_deref_mut() {
                        r.push(w.experts.routes().to_vec());
                    }
                }
            }
            if let Some((_, post)) = &layer.post_norms {
                post.forward_host_into(&w.y, &mut w.h);
                std::mem::swap(&mut w.h, &mut w.y);
            }
            ops::add(&mut x, &w.y);
        }
        for (tokens, cache) in batch.iter_mut() {
            cache.advance(tokens.len());
        }
        // Only the rows asked for are projected to the vocabulary.
        let mut last = Vec::with_capacity(out_rows.len() * cfg.hidden);
        for row in out_rows {
            last.extend_from_slice(&x[row * cfg.hidden..][..cfg.hidden]);
        }
        let mut logits = self
            .output
            .forward_host(&self.norm.forward_host(&last), out_rows.len())?;
        if let Some(c) = cfg.final_softcap {
            let inv = 1.0 / c;
            logits.iter_mut().for_each(|v| *v = (*v * inv).tanh() * c);
        }
        Ok(super::llama::per_sequence(logits, outs))
    }

    /// Runs `tokens` as [`forward`](Self::forward) does (on the host: a CPU model on our
    /// kernels) and also returns, for each mixture-of-experts layer in order, the experts each
    /// token went through and their weights (`tokens.len() · k` routes, token by token):
    /// llama.cpp's `ffn_moe_topk` and `ffn_moe_weights_norm`, to compare routing with it.
    pub fn forward_routes(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<(Vec<f32>, Vec<Vec<Route>>)> {
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
        let mut batch = [(tokens, cache)];
        let mut logits = self.forward_host(
            tokens,
            &mut batch,
            &[(0, tokens.len())],
            &[tokens.len() - 1],
            &[1],
            Some(&mut routes),
        )?;
        Ok((logits.pop().unwrap_or_default(), routes))
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
                    norm.apply(part, out);
                    part.copy_from_slice(out);
                }
            }
        }
    }
}
