//! Gemma 4's vision encoder (`clip.projector_type = gemma4v`), after llama.cpp's
//! `tools/mtmd/models/gemma4v.cpp`, its `build_vit` and the inputs `clip.cpp` gives it:
//!
//! - the picture keeps its aspect ratio, resized (bicubic) to whole pooling windows of patches
//!   (16-pixel patches pooled 3 × 3: 48-pixel units), 70 to 1,120 image tokens; its normalised
//!   values are stretched to `2·v − 1`;
//! - each patch embedded by the file's kernel (no bias), then a learned embedding of its column
//!   and one of its row added (`v.position_embd`: two tables);
//! - each block: RMS norm, queries, keys and values, queries and keys RMS-normalised per head
//!   and turned by 2-D RoPE (base 100; the first half of a head by the column, the second by
//!   the row, each half in NeoX pairs), values RMS-normalised without weights, attention among
//!   all patches with unscaled scores (the norms set their size), a norm after the attention;
//!   RMS norm, GeGLU feed-forward, a norm after it, and the block's output scaled
//!   (`out_scale`);
//! - the patches average-pooled `merge` × `merge`, scaled by `√width`, standardised where the
//!   file has `v.std_bias`/`v.std_scale`, RMS-normalised and projected to the text model's
//!   width (`mm.input_projection`).
//!
//! Each matrix is Gemma 4's "clippable" linear: where the file gives `*.input_min/max` and
//! `*.output_min/max` scalars, its input and output are clamped to them.
//!
//! Rounding follows ggml's CPU backend as `vit.rs` does: RMS norms' sums in f64, queries, keys
//! and values rounded to f16 before attention (flash attention), GELU through its f16 table.

use half::f16;

use super::config::{ClipConfig, VitActivation};
use super::matrix::Matrix;
use super::picture::Pixels;
use super::vit::attend;
use super::Weights;
use crate::model::ops;

/// Gemma 4's RoPE base for the encoder (llama.cpp's `rope_theta` for `gemma4v`).
const ROPE_BASE: f32 = 100.0;

/// A matrix with its optional bias, its input and output clamped where the file says
/// (Gemma 4's `ClippableLinear`).
struct Linear {
    m: Matrix,
    b: Option<Vec<f32>>,
    /// Input (min, max) and output (min, max).
    clamp: Option<[(f32, f32); 2]>,
}

impl Linear {
    /// `{name}.weight` (`n_out` rows of `k`), `{name}.bias` and the clamp's four scalars where
    /// the file has them.
    fn load(t: &mut Weights, name: &str, n_out: usize, k: usize) -> Result<Linear, String> {
        let mut scalar = |part: &str| -> Result<Option<f32>, String> {
            Ok(t.vector(&format!("{name}.{part}"), 1, false)?.map(|v| v[0]))
        };
        let bounds = [
            scalar("input_min")?,
            scalar("input_max")?,
            scalar("output_min")?,
            scalar("output_max")?,
        ];
        let clamp = match bounds.iter().any(Option::is_some) {
            false => None,
            true => {
                let [a, b, c, d] = bounds;
                let pair = |lo: Option<f32>, hi: Option<f32>| {
                    (lo.unwrap_or(f32::MIN), hi.unwrap_or(f32::MAX))
                };
                let c = [pair(a, b), pair(c, d)];
                if c.iter().any(|(lo, hi)| lo > hi) {
                    return Err(format!("`{name}`'s clamp bounds are the wrong way round"));
                }
                Some(c)
            }
        };
        Ok(Linear {
            m: t.matrix(&format!("{name}.weight"), n_out, k)?,
            b: t.vector(&format!("{name}.bias"), n_out, false)?,
            clamp,
        })
    }

    fn run(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let Some([(in_lo, in_hi), (out_lo, out_hi)]) = self.clamp else {
            return self.m.affine(x, rows, self.b.as_deref());
        };
        let clamped: Vec<f32> = x.iter().map(|v| v.clamp(in_lo, in_hi)).collect();
        let mut y = self.m.product(&clamped, rows)?;
        y.iter_mut().for_each(|v| *v = v.clamp(out_lo, out_hi));
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(b.len()) {
                ops::add(row, b);
            }
        }
        Ok(y)
    }
}

struct Layer {
    ln1: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    /// Per head (a head's width) or over the whole row (the encoder's).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    out: Linear,
    attn_post: Option<Vec<f32>>,
    ln2: Vec<f32>,
    gate: Option<Linear>,
    up: Linear,
    down: Linear,
    ffn_post: Option<Vec<f32>>,
    /// The block's output scale: one value, or one per column.
    out_scale: Option<Vec<f32>>,
}

/// The encoder, its pooling and projection.
pub(crate) struct Gemma4Vit {
    cfg: ClipConfig,
    patch: Matrix,
    /// `[2][table][width]`: an embedding per column, then one per row.
    position: Vec<f32>,
    table: usize,
    pre_ln: Option<Vec<f32>>,
    layers: Vec<Layer>,
    post_ln: Option<Vec<f32>>,
    /// `(x − bias) · scale` after pooling.
    standardise: Option<(Vec<f32>, Vec<f32>)>,
    proj: Linear,
    /// RMS norm's weights where it has none.
    ones: Vec<f32>,
}

impl Gemma4Vit {
    /// The encoder's tensors, every shape checked against `cfg`.
    pub(crate) fn load(cfg: &ClipConfig, t: &mut Weights) -> Result<Gemma4Vit, String> {
        let (d, ff, hd) = (cfg.width, cfg.ff, cfg.head_dim());
        let norm = |t: &mut Weights, name: &str, required: bool| -> Result<_, String> {
            if t.dims(&format!("{name}.bias")).is_some() {
                return Err(format!(
                    "`{name}` has a bias: Gemma 4's norms are RMS norms"
                ));
            }
            t.vector(&format!("{name}.weight"), d, required)
        };
        let need =
            |t: &mut Weights, name: &str| Ok::<_, String>(norm(t, name, true)?.unwrap_or_default());
        let head_norm = |t: &mut Weights, name: &str| -> Result<Option<Vec<f32>>, String> {
            let n = match t.dims(name).map(|d| d.iter().product::<usize>()) {
                None => return Ok(None),
                Some(n) if n == hd || n == d => n,
                Some(n) => {
                    return Err(format!(
                        "tensor `{name}` has {n} values: neither a head's {hd} nor the row's {d}"
                    ))
                }
            };
            t.vector(name, n, true)
        };
        if t.dims("v.patch_embd.bias").is_some() {
            return Err("Gemma 4's patch embedding has no bias".into());
        }
        let patch = t.patch_matrix("v.patch_embd.weight", d, cfg.patch_size)?;
        let table = match t.dims("v.position_embd.weight") {
            Some(&[2, n, w]) if w == d && n > 0 => n,
            Some(dims) => {
                return Err(format!(
                    "tensor `v.position_embd.weight` is {dims:?}; Gemma 4's is [2, positions, {d}]"
                ))
            }
            None => return Err("tensor `v.position_embd.weight` is missing".into()),
        };
        let position = t
            .vector("v.position_embd.weight", 2 * table * d, true)?
            .unwrap_or_default();
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = format!("v.blk.{i}");
            let lin = |t: &mut Weights, part: &str, n_out, k| {
                Linear::load(t, &format!("{p}.{part}"), n_out, k)
            };
            let out_scale = match t.dims(&format!("{p}.out_scale.weight")) {
                None => None,
                Some(dims) => {
                    let n = dims.iter().product::<usize>();
                    if n != 1 && n != d {
                        return Err(format!(
                            "tensor `{p}.out_scale.weight` has {n} values: 1 or {d} belong"
                        ));
                    }
                    t.vector(&format!("{p}.out_scale.weight"), n, true)?
                }
            };
            layers.push(Layer {
                ln1: need(t, &format!("{p}.ln1"))?,
                q: lin(t, "attn_q", d, d)?,
                k: lin(t, "attn_k", d, d)?,
                v: lin(t, "attn_v", d, d)?,
                q_norm: head_norm(t, &format!("{p}.attn_q_norm.weight"))?,
                k_norm: head_norm(t, &format!("{p}.attn_k_norm.weight"))?,
                out: lin(t, "attn_out", d, d)?,
                attn_post: norm(t, &format!("{p}.attn_post_norm"), false)?,
                ln2: need(t, &format!("{p}.ln2"))?,
                gate: match t.dims(&format!("{p}.ffn_gate.weight")) {
                    Some(_) => Some(lin(t, "ffn_gate", ff, d)?),
                    None => None,
                },
                up: lin(t, "ffn_up", ff, d)?,
                down: lin(t, "ffn_down", d, ff)?,
                ffn_post: norm(t, &format!("{p}.ffn_post_norm"), false)?,
                out_scale,
            });
        }
        let standardise = match (
            t.vector("v.std_bias", d, false)?,
            t.vector("v.std_scale", d, false)?,
        ) {
            (Some(b), Some(s)) => Some((b, s)),
            (None, None) => None,
            _ => return Err("the file has one of `v.std_bias` and `v.std_scale`".into()),
        };
        Ok(Gemma4Vit {
            cfg: cfg.clone(),
            patch,
            position,
            table,
            pre_ln: norm(t, "v.pre_ln", false)?,
            layers,
            post_ln: norm(t, "v.post_ln", false)?,
            standardise,
            proj: Linear::load(t, "mm.input_projection", cfg.text_width, d)?,
            ones: vec![1.0; d],
        })
    }

    /// The encoder's output for `pixels` (normalised, a size of whole pooling windows): its rows
    /// of the text model's width, one per pooling window, in reading order.
    pub(crate) fn forward(&self, pixels: &Pixels) -> candle_core::Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (p, d, m) = (cfg.patch_size, cfg.width, cfg.merge);
        let (nx, ny) = pixels.units(p * m)?;
        let (px_n, py_n) = (nx * m, ny * m);
        if px_n > self.table || py_n > self.table {
            candle_core::bail!(
                "a picture {px_n} × {py_n} patches is past the encoder's {} positions a side",
                self.table
            );
        }
        let n = px_n * py_n;
        // The patches in reading order, their values stretched to `2·v − 1`.
        let place: Vec<(usize, usize)> = (0..n).map(|i| (i / px_n, i % px_n)).collect();
        let mut patches = pixels.patches(p, &place);
        patches.iter_mut().for_each(|v| *v = *v * 2.0 - 1.0);
        let mut x = self.patch.product(&patches, n)?;
        drop(patches);
        let (by_column, by_row) = self.position.split_at(self.table * d);
        for (i, row) in x.chunks_exact_mut(d).enumerate() {
            let (py, px) = (i / px_n, i % px_n);
            ops::add(row, &by_column[px * d..][..d]);
            ops::add(row, &by_row[py * d..][..d]);
        }
        let eps = cfg.eps;
        let rms = |x: &mut Vec<f32>, w: &[f32]| {
            let mut out = vec![0f32; x.len()];
            ops::rms_norm_like_ggml(x, w, eps, &mut out);
            *x = out;
        };
        if let Some(w) = &self.pre_ln {
            rms(&mut x, w);
        }
        let rope = Rope2d::new(cfg.head_dim(), px_n);
        let mut h = vec![0f32; n * d];
        for layer in &self.layers {
            ops::rms_norm_like_ggml(&x, &layer.ln1, eps, &mut h);
            let (mut q, mut k, mut v) = (
                layer.q.run(&h, n)?,
                layer.k.run(&h, n)?,
                layer.v.run(&h, n)?,
            );
            if let Some(w) = &layer.q_norm {
                rms(&mut q, w);
            }
            if let Some(w) = &layer.k_norm {
                rms(&mut k, w);
            }
            rope.apply(&mut q, cfg.heads);
            rope.apply(&mut k, cfg.heads);
            rms(&mut v, &self.ones[..cfg.head_dim()]);
            for t in [&mut q, &mut k, &mut v] {
                t.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
            }
            let a = attend(&q, &k, &v, n, cfg.heads, &[(0, n)], 1.0)?;
            let mut o = layer.out.run(&a, n)?;
            if let Some(w) = &layer.attn_post {
                rms(&mut o, w);
            }
            ops::add(&mut x, &o);
            ops::rms_norm_like_ggml(&x, &layer.ln2, eps, &mut h);
            let mut f = match &layer.gate {
                Some(gate) => gate.run(&h, n)?,
                None => layer.up.run(&h, n)?,
            };
            match cfg.activation {
                VitActivation::Gelu => ops::gelu(&mut f),
                VitActivation::GeluQuick => ops::gelu_quick(&mut f),
                VitActivation::Silu => ops::silu(&mut f),
            }
            if layer.gate.is_some() {
                ops::mul(&mut f, &layer.up.run(&h, n)?);
            }
            let mut f = layer.down.run(&f, n)?;
            if let Some(w) = &layer.ffn_post {
                rms(&mut f, w);
            }
            ops::add(&mut x, &f);
            if let Some(s) = &layer.out_scale {
                for row in x.chunks_exact_mut(d) {
                    match s.as_slice() {
                        [one] => row.iter_mut().for_each(|v| *v *= one),
                        each => ops::mul(row, each),
                    }
                }
            }
        }
        if let Some(w) = &self.post_ln {
            rms(&mut x, w);
        }
        let mut pooled = super::pool(&x, px_n, py_n, m, d);
        let root = (d as f32).sqrt();
        pooled.iter_mut().for_each(|v| *v *= root);
        if let Some((bias, scale)) = &self.standardise {
            for row in pooled.chunks_exact_mut(d) {
                for ((v, b), s) in row.iter_mut().zip(bias).zip(scale) {
                    *v = (*v - b) * s;
                }
            }
        }
        rms(&mut pooled, &self.ones);
        let values = self.proj.run(&pooled, nx * ny)?;
        Ok(values)
    }
}

/// Gemma 4's 2-D RoPE: a head's first half turned by the patch's column, its second half by
/// its row, each half as ggml's NeoX RoPE over `hd/2` values (pair `i` is (`i`, `i + hd/4`)),
/// the angle of pair `i` the position times `base^(−4i/hd)`, multiplied up in f32 as ggml does.
struct Rope2d {
    hd: usize,
    /// Patches a row of the picture.
    columns: usize,
    scale: f32,
}

impl Rope2d {
    fn new(hd: usize, columns: usize) -> Rope2d {
        let scale = ROPE_BASE.powf(-2.0 / (hd / 2) as f32);
        Rope2d { hd, columns, scale }
    }

    /// `(cos, sin)` of each pair's angle at position `pos`, as ggml's cache makes them.
    fn turns(&self, pos: usize) -> Vec<(f32, f32)> {
        let mut theta = pos as f32;
        (0..self.hd / 4)
            .map(|_| {
                let t = (theta.cos(), theta.sin());
                theta *= self.scale;
                t
            })
            .collect()
    }

    /// Turns every head of each row (patches in reading order) in place.
    fn apply(&self, x: &mut [f32], heads: usize) {
        let (hd, half, quarter) = (self.hd, self.hd / 2, self.hd / 4);
        for (i, row) in x.chunks_exact_mut(heads * hd).enumerate() {
            let (by_column, by_row) = (self.turns(i % self.columns), self.turns(i / self.columns));
            for head in row.chunks_exact_mut(hd) {
                for (off, turns) in [(0, &by_column), (half, &by_row)] {
                    let part = &mut head[off..off + half];
                    for (k, &(c, s)) in turns.iter().enumerate() {
                        let (a, b) = (part[k], part[k + quarter]);
                        part[k] = a * c - b * s;
                        part[k + quarter] = a * s + b * c;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_turns_the_first_half_by_column_and_the_second_by_row() {
        // Heads of 8: pairs (0,2), (1,3) by the column, (4,6), (5,7) by the row; 3 columns.
        let rope = Rope2d::new(8, 3);
        let mut x = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0].repeat(5);
        rope.apply(&mut x, 1);
        let f1 = 100f32.powf(-0.5);
        // Patch 4: column 1, row 1.
        let p = &x[32..40];
        assert!((p[0] - 1f32.cos()).abs() < 1e-6 && (p[2] - 1f32.sin()).abs() < 1e-6);
        assert!((p[1] - f1.cos()).abs() < 1e-6 && (p[3] - f1.sin()).abs() < 1e-6);
        assert!((p[4] - 1f32.cos()).abs() < 1e-6);
        // Patch 2: column 2, row 0: the second half does not turn.
        let p = &x[16..24];
        assert!((p[0] - 2f32.cos()).abs() < 1e-6);
        assert_eq!(&p[4..], &[1.0, 1.0, 0.0, 0.0]);
    }
}
