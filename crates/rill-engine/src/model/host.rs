//! The decoder's block on the host (CPU models): row-major `f32` buffers from the embedding to
//! the logits, our kernels (`kernels/`) and our attention (`attention.rs`), no candle tensors
//! on the way (their worker thread spins after each operation, taking a core from ours).
//!
//! Its buffers come from the model's `Workspace` (`workspace.rs`) and go back to it: a step of
//! a 1B model would otherwise take fresh memory for every layer and fault its pages in, which
//! cost a Qwen2 file a fifth of its prefill speed (measured; llama's allocations happened to
//! reuse the allocator's memory). A buffer is taken for an output of its own length where one
//! is spare, so after the first step nothing is allocated, resized or cleared.

use std::sync::MutexGuard;

use half::f16;

use super::attention::{self, Scores, Span};
use super::backend::{Attention, Backend, Parts};
use super::delta::DeltaNet;
use super::experts::{Experts, Route};
use super::family::Activation;
use super::kv::KvCache;
use super::ops;
use super::parts::{Bias, Group, Linear, Norm, PerLayerInputs, PerLayerStep, SharedExpert};
use super::positions::Pos3;
use super::workspace::Workspace;
use crate::error::{Error, Result};
use crate::kernels::Isa;

/// The model's workspace, or one of this pass's own when another thread runs the model.
enum Space<'a> {
    Kept(MutexGuard<'a, Workspace>),
    Own(Workspace),
}

/// One forward pass of `m` rows on the host.
pub(super) struct Host<'a> {
    d: Parts<'a>,
    m: usize,
    isa: Isa,
    space: Space<'a>,
    /// Receives each mixture-of-experts layer's routes of every row, when given.
    routes: Option<&'a mut Vec<Vec<Route>>>,
    /// Per sequence: runs of its rows that attend to each other both ways (`inject.rs`).
    both_ways: &'a [Vec<(usize, usize)>],
    positions: Option<Vec<Vec<Pos3>>>,
}

impl<'a> Host<'a> {
    pub(super) fn new(d: Parts<'a>, m: usize, routes: Option<&'a mut Vec<Vec<Route>>>) -> Self {
        let space = match d.workspace.try_lock() {
            Ok(w) => Space::Kept(w),
            // Another thread runs this model (tests do): a workspace of its own.
            Err(_) => Space::Own(Workspace::default()),
        };
        Host {
            d,
            m,
            isa: Isa::detect(),
            space,
            routes,
            both_ways: &[],
            positions: None,
        }
    }

    /// The pass with runs of rows that attend both ways, per sequence.
    pub(super) fn with_both_ways(self, both_ways: &'a [Vec<(usize, usize)>]) -> Self {
        Host { both_ways, ..self }
    }

    /// Each sequence's rows' M-RoPE positions (`positions.rs`), where they are not the rows'
    /// slots.
    pub(super) fn with_positions(self, positions: Option<Vec<Vec<Pos3>>>) -> Self {
        Host { positions, ..self }
    }

    fn space(&mut self) -> &mut Workspace {
        match &mut self.space {
            Space::Kept(w) => w,
            Space::Own(w) => w,
        }
    }

    /// A buffer of `len` values (contents unspecified): a spare one of that length if there is
    /// one, else the longest.
    fn take(&mut self, len: usize) -> Vec<f32> {
        let spare = &mut self.space().spare;
        let at = spare
            .iter()
            .position(|v| v.len() == len)
            .or_else(|| (0..spare.len()).max_by_key(|&i| spare[i].capacity()));
        let mut v = at.map(|i| spare.swap_remove(i)).unwrap_or_default();
        v.resize(len, 0.0);
        v
    }

    fn give(&mut self, v: Vec<f32>) {
        self.space().spare.push(v);
    }
}

impl Backend for Host<'_> {
    type Rows = Vec<f32>;
    /// `[rows][q | k | v]`.
    type Qkv = Vec<f32>;

    fn embed(&mut self, rows: candle_core::Tensor, scale: Option<f32>) -> Result<Vec<f32>> {
        let mut x = rows.flatten_all()?.to_vec1::<f32>()?;
        if let Some(s) = scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        Ok(x)
    }

    fn inject(&mut self, x: &mut Vec<f32>, row: usize, values: &[f32], add: bool) -> Result<()> {
        let n = values.len();
        match x.get_mut(row * n..(row + 1) * n) {
            Some(dst) if add => {
                super::ops::add(dst, values);
                Ok(())
            }
            Some(dst) => {
                dst.copy_from_slice(values);
                Ok(())
            }
            None => Err(Error::param("image", "an image row outside the step")),
        }
    }

    fn norm(&mut self, norm: &Norm, x: &Vec<f32>) -> Result<Vec<f32>> {
        let mut out = self.take(x.len());
        norm.apply(x, &mut out);
        Ok(out)
    }

    fn renorm(&mut self, norm: &Norm, y: &mut Vec<f32>) -> Result<()> {
        let out = self.norm(norm, y)?;
        let old = std::mem::replace(y, out);
        self.give(old);
        Ok(())
    }

    fn linear(&mut self, w: &Linear, x: Vec<f32>) -> Result<Vec<f32>> {
        let mut out = self.take(self.m * w.n_out());
        w.forward_host_into(&x, self.m, &mut out)?;
        self.give(x);
        Ok(out)
    }

    fn add_bias(&mut self, y: &mut Vec<f32>, bias: &[f32]) -> Result<()> {
        y.chunks_exact_mut(bias.len())
            .for_each(|r| ops::add(r, bias));
        Ok(())
    }

    fn residual(&mut self, x: &mut Vec<f32>, y: Vec<f32>) -> Result<()> {
        ops::add(x, &y);
        self.give(y);
        Ok(())
    }

    fn qkv(&mut self, w: &Group, h: Vec<f32>) -> Result<Vec<f32>> {
        let mut out = self.take(self.m * w.n_out());
        w.forward_host_into(&h, self.m, &mut out)?;
        self.give(h);
        Ok(out)
    }

    fn qkv_bias(&mut self, qkv: &mut Vec<f32>, bias: &Bias) -> Result<()> {
        for row in qkv.chunks_exact_mut(bias.host.len()) {
            ops::add(row, &bias.host);
        }
        Ok(())
    }

    fn qk_norm(
        &mut self,
        qkv: &mut Vec<f32>,
        layer: usize,
        qn: &Norm,
        kn: Option<&Norm>,
    ) -> Result<()> {
        let h = self.d.cfg.heads[layer];
        let (qw, kw) = (h.q_width(), h.kv_width());
        let stride = match kn {
            Some(_) => qw + 2 * kw,
            None => qw,
        };
        let mut tmp = vec![0f32; qw.max(kw)];
        for row in qkv.chunks_exact_mut(stride) {
            let (q, rest) = row.split_at_mut(qw);
            let out = &mut tmp[..qw];
            qn.apply(q, out);
            q.copy_from_slice(out);
            if let Some(kn) = kn {
                let (k, out) = (&mut rest[..kw], &mut tmp[..kw]);
                kn.apply(k, out);
                k.copy_from_slice(out);
            }
        }
        Ok(())
    }

    fn keys_as_values(&mut self, qkv: &mut Vec<f32>, layer: usize) -> Result<()> {
        let h = self.d.cfg.heads[layer];
        let (qw, kw) = (h.q_width(), h.kv_width());
        let rows = qkv.len() / (qw + kw);
        let mut out = self.take(rows * (qw + 2 * kw));
        for (from, to) in qkv
            .chunks_exact(qw + kw)
            .zip(out.chunks_exact_mut(qw + 2 * kw))
        {
            to[..qw + kw].copy_from_slice(from);
            to[qw + kw..].copy_from_slice(&from[qw..]);
        }
        let old = std::mem::replace(qkv, out);
        self.give(old);
        Ok(())
    }

    fn v_norm(&mut self, qkv: &mut Vec<f32>, layer: usize) -> Result<()> {
        let h = self.d.cfg.heads[layer];
        let (qw, kw) = (h.q_width(), h.kv_width());
        let (ones, eps) = (vec![1f32; h.head_dim], self.d.cfg.rms_eps as f32);
        let mut tmp = vec![0f32; kw];
        for row in qkv.chunks_exact_mut(qw + 2 * kw) {
            let v = &mut row[qw + kw..];
            ops::rms_norm_like_ggml(v, &ones, eps, &mut tmp);
            v.copy_from_slice(&tmp);
        }
        Ok(())
    }

    fn per_layer_inputs(
        &mut self,
        p: &PerLayerInputs,
        x: &Vec<f32>,
        table: candle_core::Tensor,
    ) -> Result<Vec<f32>> {
        let mut h = self.take(x.len());
        h.copy_from_slice(x);
        let mut proj = self.linear(&p.proj, h)?;
        let by = 1.0 / (self.d.cfg.hidden as f32).sqrt();
        proj.iter_mut().for_each(|v| *v *= by);
        // The norm's weights are one layer's width: each layer's part is normalised alone.
        self.renorm(&p.norm, &mut proj)?;
        let rows = table.flatten_all()?.to_vec1::<f32>()?;
        if rows.len() != proj.len() {
            return Err(Error::Candle(candle_core::Error::Msg(
                "per-layer embedding rows of another width than their projection".into(),
            )));
        }
        let (a, b) = ((p.width as f32).sqrt(), std::f32::consts::FRAC_1_SQRT_2);
        for (y, t) in proj.iter_mut().zip(&rows) {
            *y = (*y + *t * a) * b;
        }
        Ok(proj)
    }

    fn per_layer(
        &mut self,
        step: &PerLayerStep,
        layer: usize,
        inputs: &Vec<f32>,
        x: &mut Vec<f32>,
    ) -> Result<()> {
        let (m, width) = (self.m, step.gate.n_out());
        let all = inputs.len() / m.max(1);
        let mut h = self.take(x.len());
        h.copy_from_slice(x);
        let gate = self.linear(&step.gate, h)?;
        // `[gelu's input | what it multiplies]` per row, as the gated feed-forward reads them.
        let mut gate_in = self.take(m * 2 * width);
        for ((to, g), i) in gate_in
            .chunks_exact_mut(2 * width)
            .zip(gate.chunks_exact(width))
            .zip(inputs.chunks_exact(all))
        {
            to[..width].copy_from_slice(g);
            to[width..].copy_from_slice(&i[layer * width..][..width]);
        }
        self.give(gate);
        let mut a = self.take(m * width);
        ops::gated(&gate_in, width, Activation::GeluTanh, self.isa, &mut a);
        self.give(gate_in);
        let mut y = self.linear(&step.proj, a)?;
        self.renorm(&step.norm, &mut y)?;
        self.residual(x, y)
    }

    fn scale(&mut self, x: &mut Vec<f32>, s: f32) -> Result<()> {
        x.iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn attend(
        &mut self,
        how: &Attention<'_>,
        mut qkv: Vec<f32>,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let h = self.d.cfg.heads[how.layer];
        let shape = attention::Shape {
            n_head: h.n_head,
            n_kv_head: h.n_kv_head,
            head_dim: h.head_dim,
        };
        let rope = self.d.ropes[how.rope]
            .host
            .as_ref()
            .ok_or_else(|| Error::Candle(candle_core::Error::Msg("no host RoPE table".into())))?;
        let hd = shape.head_dim;
        let (qw, kw) = (shape.n_head * hd, shape.kv_width());
        // A layer that reads an earlier layer's keys and values has queries only.
        let own_kv = how.kv_layer == how.layer;
        let stride = if own_kv { qw + 2 * kw } else { qw };
        // Under M-RoPE with images, each pair's section and each row's positions.
        let sections: Vec<usize> = match (&self.positions, self.d.cfg.rope_sections) {
            (Some(_), Some(s)) => (0..rope.pairs)
                .map(|k| super::config::section_of(s, self.d.cfg.family.mrope, k))
                .collect(),
            _ => Vec::new(),
        };
        let positions = self.positions.as_ref().filter(|_| !sections.is_empty());
        for (si, ((_, cache), &(row, t))) in batch.iter_mut().zip(spans).enumerate() {
            let len = cache.len();
            let turn = |x: &mut [f32], i: usize| match positions.and_then(|p| p.get(si)?.get(i)) {
                Some(&pos) => rope.apply_sections(x, hd, pos, &sections),
                None => rope.apply(x, hd, len + i),
            };
            for i in 0..t {
                let r = &mut qkv[(row + i) * stride..][..stride];
                let (q, kv) = r.split_at_mut(qw);
                turn(q, i);
                if let Some(s) = how.prescale {
                    q.iter_mut().for_each(|v| *v *= s);
                }
                // The queries meet f16 keys at f16 precision, as in llama.cpp (whose dot
                // product with an f16 cache converts them): measured closer to its answers
                // (219 of 224 teacher-forced steps agree instead of 215).
                for v in q.iter_mut() {
                    *v = f16::from_f32(*v).to_f32();
                }
                if own_kv {
                    turn(&mut kv[..kw], i);
                    cache.push_host(how.layer, i, &kv[..kw], &kv[kw..]);
                }
            }
        }
        let mut seqs = Vec::with_capacity(batch.len());
        let runs = self.both_ways;
        for (si, (tokens, cache)) in batch.iter().enumerate() {
            let kv = cache.host_layer(how.kv_layer).ok_or_else(|| {
                Error::Candle(candle_core::Error::Msg(
                    "a GPU KV cache on a CPU model".into(),
                ))
            })?;
            seqs.push(Span {
                t: tokens.len(),
                pos: cache.len(),
                kv,
                both_ways: runs.get(si).map_or(&[], |r| r.as_slice()),
            });
        }
        let scores = Scores {
            scale: match how.prescale {
                Some(_) => 1.0,
                None => 1.0 / (hd as f32).sqrt(),
            },
            softcap: how.softcap,
            window: how.window,
            f16_weights: how.f16_weights,
            sinks: how.sinks,
        };
        let rows = qkv.len() / stride;
        let mut out = self.take(rows * qw);
        attention::attend(shape, scores, &qkv, stride, &seqs, &mut out, self.isa);
        drop(seqs);
        self.give(qkv);
        Ok(out)
    }

    fn dense(
        &mut self,
        gate_up: &Group,
        down: &Linear,
        act: Activation,
        h: Vec<f32>,
    ) -> Result<Vec<f32>> {
        let m = self.m;
        let gu = self.qkv(gate_up, h)?;
        let mut a = self.take(gu.len() / 2);
        ops::gated(&gu, gu.len() / m / 2, act, self.isa, &mut a);
        self.give(gu);
        self.linear(down, a)
    }

    fn experts(
        &mut self,
        experts: &Experts,
        h: Vec<f32>,
        route_by: Option<Vec<f32>>,
    ) -> Result<Vec<f32>> {
        let (m, isa) = (self.m, self.isa);
        let mut y = self.take(m * self.d.cfg.hidden);
        let ws = match &mut self.space {
            Space::Kept(w) => &mut **w,
            Space::Own(w) => w,
        };
        let by = route_by.as_deref();
        experts.forward_host_into(&h, by, m, isa, &mut ws.experts, &mut y)?;
        if let Some(r) = self.routes.as_deref_mut() {
            r.push(ws.experts.routes().to_vec());
        }
        self.give(h);
        if let Some(by) = route_by {
            self.give(by);
        }
        Ok(y)
    }

    fn shared_expert(&mut self, s: &SharedExpert, h: Vec<f32>) -> Result<Vec<f32>> {
        let width = s.gate.len();
        let scales: Vec<f32> = h
            .chunks_exact(width)
            .map(|row| {
                let logit: f32 = row.iter().zip(&s.gate).map(|(x, w)| x * w).sum();
                1.0 / (1.0 + (-logit).exp())
            })
            .collect();
        let mut y = self.dense(&s.gate_up, &s.down, Activation::Silu, h)?;
        let hidden = y.len() / scales.len().max(1);
        for (row, scale) in y.chunks_exact_mut(hidden).zip(&scales) {
            row.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(y)
    }

    fn split_gate(&mut self, qkv: &mut Vec<f32>, layer: usize) -> Result<Vec<f32>> {
        let h = self.d.cfg.heads[layer];
        let (hd, qw, kw) = (h.head_dim, h.q_width(), h.kv_width());
        let (wide, narrow) = (2 * qw + 2 * kw, qw + 2 * kw);
        let rows = qkv.len() / wide;
        let mut gate = self.take(rows * qw);
        let mut out = self.take(rows * narrow);
        for ((from, to), g) in qkv
            .chunks_exact(wide)
            .zip(out.chunks_exact_mut(narrow))
            .zip(gate.chunks_exact_mut(qw))
        {
            let (q, kv) = from.split_at(2 * qw);
            for ((pair, q_to), g_to) in q
                .chunks_exact(2 * hd)
                .zip(to[..qw].chunks_exact_mut(hd))
                .zip(g.chunks_exact_mut(hd))
            {
                q_to.copy_from_slice(&pair[..hd]);
                g_to.copy_from_slice(&pair[hd..]);
            }
            to[qw..].copy_from_slice(kv);
        }
        let old = std::mem::replace(qkv, out);
        self.give(old);
        Ok(gate)
    }

    fn gate(&mut self, y: &mut Vec<f32>, gate: Vec<f32>) -> Result<()> {
        for (y, g) in y.iter_mut().zip(&gate) {
            *y *= 1.0 / (1.0 + (-*g).exp());
        }
        self.give(gate);
        Ok(())
    }

    fn delta_net(
        &mut self,
        w: &Group,
        net: &DeltaNet,
        layer: usize,
        h: Vec<f32>,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let proj = self.qkv(w, h)?;
        let mut out = self.take(self.m * net.cfg.value_width());
        net.forward_host(layer, &proj, batch, spans, &mut out, self.isa)?;
        self.give(proj);
        Ok(out)
    }

    fn logits(
        &mut self,
        x: Vec<f32>,
        rows: &[usize],
        norm: &Norm,
        output: &Linear,
        softcap: Option<f32>,
    ) -> Result<Vec<f32>> {
        let hidden = self.d.cfg.hidden;
        let mut last = Vec::with_capacity(rows.len() * hidden);
        for row in rows {
            last.extend_from_slice(&x[row * hidden..][..hidden]);
        }
        let mut logits = output.forward_host(&norm.forward_host(&last), rows.len())?;
        if let Some(c) = softcap {
            let inv = 1.0 / c;
            logits.iter_mut().for_each(|v| *v = (*v * inv).tanh() * c);
        }
        Ok(logits)
    }
}
