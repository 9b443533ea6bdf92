//! The vision transformer (ViT) of a projector file: llama.cpp's `clip_graph::build_vit` for
//! the SigLIP family — patches embedded by a convolution (a matrix over each patch's pixels),
//! learned position embeddings added, then pre-norm blocks of attention among all patches
//! (both ways: an image has no order) and a feed-forward, LayerNorm with biases, and a final
//! norm.
//!
//! The arithmetic follows ggml's CPU backend where it rounds: LayerNorm's sums in f64, the
//! GELU through its f16 table, and queries, keys and values rounded to f16 before attention
//! (llama.cpp runs the encoder's attention as flash attention, which casts them so).

use half::f16;

use super::config::{ClipConfig, VitActivation};
use super::matrix::{blocked_product, Matrix};
use super::Weights;
use crate::kernels::Isa;
use crate::model::attention;
use crate::model::ops;

/// LayerNorm's weights and bias.
pub(crate) struct Norm {
    pub(crate) w: Vec<f32>,
    pub(crate) b: Option<Vec<f32>>,
}

/// A matrix with its optional bias.
pub(crate) struct Affine {
    m: Matrix,
    b: Option<Vec<f32>>,
}

impl Affine {
    /// Matrix `{name}.weight` of `n_out` rows of `k`, and its bias `{name}.bias` where the file
    /// has one.
    pub(crate) fn load(
        t: &mut Weights,
        name: &str,
        n_out: usize,
        k: usize,
    ) -> Result<Affine, String> {
        Ok(Affine {
            m: t.matrix(&format!("{name}.weight"), n_out, k)?,
            b: t.vector(&format!("{name}.bias"), n_out, false)?,
        })
    }

    pub(crate) fn run(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        self.m.affine(x, rows, self.b.as_deref())
    }
}

struct Layer {
    ln1: Norm,
    q: Affine,
    k: Affine,
    v: Affine,
    out: Affine,
    ln2: Norm,
    up: Affine,
    down: Affine,
}

/// The encoder: pixels in, one row of `width` per patch out.
pub(crate) struct Vit {
    cfg: ClipConfig,
    patch: Affine,
    position: Option<Vec<f32>>,
    pre_ln: Option<Norm>,
    layers: Vec<Layer>,
    post_ln: Option<Norm>,
}

impl Vit {
    /// The encoder's tensors (`v.*`), every shape checked against `cfg`.
    pub(crate) fn load(cfg: &ClipConfig, t: &mut Weights) -> Result<Vit, String> {
        let (d, ff) = (cfg.width, cfg.ff);
        let n = cfg.patches_per_side() * cfg.patches_per_side();
        let pixels = 3 * cfg.patch_size * cfg.patch_size;
        let norm = |t: &mut Weights, name: &str| -> Result<Option<Norm>, String> {
            match t.vector(&format!("{name}.weight"), d, false)? {
                Some(w) => Ok(Some(Norm {
                    w,
                    b: t.vector(&format!("{name}.bias"), d, false)?,
                })),
                None => Ok(None),
            }
        };
        let need = |t: &mut Weights, name: &str| {
            norm(t, name)?.ok_or_else(|| format!("tensor `{name}.weight` is missing"))
        };
        let affine = Affine::load;
        let patch = Affine {
            m: t.patch_matrix("v.patch_embd.weight", d, cfg.patch_size)?,
            b: t.vector("v.patch_embd.bias", d, false)?,
        };
        let position = t.vector("v.position_embd.weight", n * d, false)?;
        let pre_ln = norm(t, "v.pre_ln")?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = format!("v.blk.{i}");
            let (up, down) = ffn_names(t, &p, d, ff);
            layers.push(Layer {
                ln1: need(t, &format!("{p}.ln1"))?,
                q: affine(t, &format!("{p}.attn_q"), d, d)?,
                k: affine(t, &format!("{p}.attn_k"), d, d)?,
                v: affine(t, &format!("{p}.attn_v"), d, d)?,
                out: affine(t, &format!("{p}.attn_out"), d, d)?,
                ln2: need(t, &format!("{p}.ln2"))?,
                up: affine(t, &format!("{p}.{up}"), ff, d)?,
                down: affine(t, &format!("{p}.{down}"), d, ff)?,
            });
        }
        let post_ln = norm(t, "v.post_ln")?;
        debug_assert_eq!(pixels, 3 * cfg.patch_size * cfg.patch_size);
        Ok(Vit {
            cfg: cfg.clone(),
            patch,
            position,
            pre_ln,
            layers,
            post_ln,
        })
    }

    /// The encoder's output for an image of `cfg.image_size` pixels a side (planar RGB,
    /// normalised): `[patches][width]`, patches row by row.
    pub(crate) fn forward(&self, pixels: &[f32]) -> candle_core::Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (p, side, d) = (cfg.patch_size, cfg.image_size, cfg.width);
        let per_side = cfg.patches_per_side();
        let n = per_side * per_side;
        if pixels.len() != 3 * side * side {
            candle_core::bail!("{} pixel values for a {side}-pixel square", pixels.len());
        }
        // Each patch's pixels in the convolution kernel's order: channel, row, column.
        let k = 3 * p * p;
        let mut patches = vec![0f32; n * k];
        for (i, row) in patches.chunks_exact_mut(k).enumerate() {
            let (py, px) = (i / per_side, i % per_side);
            for c in 0..3 {
                for y in 0..p {
                    let from = c * side * side + (py * p + y) * side + px * p;
                    row[c * p * p + y * p..][..p].copy_from_slice(&pixels[from..from + p]);
                }
            }
        }
        let mut x = self.patch.run(&patches, n)?;
        if let Some(pos) = &self.position {
            ops::add(&mut x, pos);
        }
        if let Some(norm) = &self.pre_ln {
            layer_norm(&mut x, norm, cfg.eps);
        }
        let mut h = vec![0f32; n * d];
        for layer in &self.layers {
            h.copy_from_slice(&x);
            layer_norm(&mut h, &layer.ln1, cfg.eps);
            let attn = self.attention(layer, &h, n)?;
            let o = layer.out.run(&attn, n)?;
            ops::add(&mut x, &o);
            h.copy_from_slice(&x);
            layer_norm(&mut h, &layer.ln2, cfg.eps);
            let mut f = layer.up.run(&h, n)?;
            match cfg.activation {
                VitActivation::Gelu => ops::gelu(&mut f),
                VitActivation::GeluQuick => ops::gelu_quick(&mut f),
                VitActivation::Silu => ops::silu(&mut f),
            }
            let f = layer.down.run(&f, n)?;
            ops::add(&mut x, &f);
        }
        if let Some(norm) = &self.post_ln {
            layer_norm(&mut x, norm, cfg.eps);
        }
        Ok(x)
    }

    /// Attention among all `n` rows, head by head: `softmax(q·kᵀ/√head_dim)·v`.
    fn attention(&self, layer: &Layer, h: &[f32], n: usize) -> candle_core::Result<Vec<f32>> {
        let rounded = |a: &Affine| -> candle_core::Result<Vec<f32>> {
            let mut v = a.run(h, n)?;
            v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
            Ok(v)
        };
        let (q, k, v) = (rounded(&layer.q)?, rounded(&layer.k)?, rounded(&layer.v)?);
        let scale = 1.0 / (self.cfg.head_dim() as f32).sqrt();
        attend(&q, &k, &v, n, self.cfg.heads, &[(0, n)], scale)
    }
}

/// Queries whose scores are made at once: a block of 512 × 16,384 keys (a large Qwen-VL
/// picture's patches) is 32 MB.
const QUERY_BLOCK: usize = 512;

/// Attention of `n` rows of `heads` heads (`q`, `k`, `v`: row-major, each row every head's
/// values, already rounded to f16 as llama.cpp's flash attention rounds them):
/// `softmax(scale·q·kᵀ)·v` head by head (`scale`: `1/√head_dim` but where q/k norms set it), each run of rows `ranges` (first, count; in
/// order, covering every row) attending within itself only, both ways (an image has no
/// order). The products are blocked matrix products (the `gemm` crate, as candle's CPU
/// matmul), a block of queries at a time, each block's scores in one reused buffer; the
/// softmax is the text model's attention's (`model/attention.rs`).
pub(crate) fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    heads: usize,
    ranges: &[(usize, usize)],
    scale: f32,
) -> candle_core::Result<Vec<f32>> {
    use rayon::prelude::*;
    let width = q.len() / n.max(1);
    let hd = width / heads.max(1);
    let covered = ranges
        .iter()
        .try_fold(0, |at, &(first, count)| (first == at).then_some(at + count));
    if covered != Some(n) || hd * heads != width || k.len() != q.len() || v.len() != q.len() {
        candle_core::bail!("attention runs that do not cover {n} rows of {heads} heads in order");
    }
    let isa = Isa::detect();
    let mut out = vec![0f32; n * width];
    let mut scores = Vec::new();
    let w = width as isize;
    for &(first, count) in ranges {
        for h in 0..heads {
            let col = first * width + h * hd;
            for qb in (0..count).step_by(QUERY_BLOCK) {
                let rows = QUERY_BLOCK.min(count - qb);
                scores.resize(rows * count, 0f32);
                let at = col + qb * width;
                // SAFETY: every index the products read or write is inside its slice: the
                // queries' rows `first + qb..first + qb + rows` and the run's keys and values
                // `first..first + count` are rows of `n`, each `width` wide, of which this
                // head's `hd` columns from `h·hd`; the scores are `rows × count`; the output
                // has the queries' shape. The products only read `q`, `k`, `v` and the scores
                // (after writing them), and write the scores, then `out`.
                unsafe {
                    // scores = scale · q_block · kᵀ
                    blocked_product(
                        (rows, count, hd),
                        (scores.as_mut_ptr(), count as isize),
                        (q.as_ptr().add(at), 1, w),
                        (k.as_ptr().add(col), w, 1),
                        scale,
                    );
                }
                scores
                    .par_chunks_mut(count)
                    .for_each(|row| attention::softmax_in_place(row, isa));
                // SAFETY: as above.
                unsafe {
                    // out_block = p · v
                    blocked_product(
                        (rows, hd, count),
                        (out.as_mut_ptr().add(at), w),
                        (scores.as_ptr(), 1, count as isize),
                        (v.as_ptr().add(col), 1, w),
                        1.0,
                    );
                }
            }
        }
    }
    Ok(out)
}

/// The names of block `p`'s feed-forward up and down matrices (`width` → `ff` → `width`):
/// files from an old converter have them under each other's names, which llama.cpp swaps
/// back by shape, as here.
pub(crate) fn ffn_names(
    t: &Weights,
    p: &str,
    width: usize,
    ff: usize,
) -> (&'static str, &'static str) {
    match t.dims(&format!("{p}.ffn_up.weight")) {
        Some([rows, cols]) if (*rows, *cols) == (width, ff) && width != ff => {
            ("ffn_down", "ffn_up")
        }
        _ => ("ffn_up", "ffn_down"),
    }
}

/// LayerNorm in place, as ggml's `norm` then its multiply and add: the mean and the variance
/// summed in f64, `1/√(variance + eps)` in f32.
pub(crate) fn layer_norm(x: &mut [f32], norm: &Norm, eps: f32) {
    use rayon::prelude::*;
    let d = norm.w.len();
    x.par_chunks_exact_mut(d).for_each(|row| {
        let mean = (row.iter().map(|v| f64::from(*v)).sum::<f64>() / d as f64) as f32;
        let mut var = 0f64;
        for v in row.iter_mut() {
            *v -= mean;
            var += f64::from(*v * *v);
        }
        let scale = 1.0 / ((var / d as f64) as f32 + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            *v = *v * scale * norm.w[i] + norm.b.as_ref().map_or(0.0, |b| b[i]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        let norm = Norm {
            w: vec![2.0; 4],
            b: Some(vec![1.0; 4]),
        };
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0];
        layer_norm(&mut x, &norm, 1e-6);
        let s = 1.0 / (1.25f32 + 1e-6).sqrt();
        let want = [-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s].map(|v| v * 2.0 + 1.0);
        for (g, w) in x[..4].iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} {w}");
        }
        assert_eq!(&x[4..], &[1.0; 4]);
    }
}
