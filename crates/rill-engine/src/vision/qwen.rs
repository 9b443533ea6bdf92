//! Qwen2.5-VL's vision encoder (`clip.projector_type = qwen2.5vl_merger`) and Qwen2-VL's
//! (`qwen2vl_merger`), after llama.cpp's `tools/mtmd/models/qwen2vl.cpp` and the inputs
//! `clip.cpp` gives it:
//!
//! - the image keeps its aspect ratio (`Picture::fit` to a size of whole 28-pixel units), cut
//!   into 14-pixel patches, each embedded by the file's two kernels (a video's two frames; a
//!   still image is read by both) and summed;
//! - patches are taken 2 × 2 unit by unit, and units grouped window by window (8 × 8
//!   patches), so a window is a run of rows;
//! - each block: RMS norm, attention with 2-D M-RoPE (a head's first quarter of pairs turn by
//!   the patch's row, the second by its column), among all patches on every
//!   `n_wa_pattern`-th layer and within its window on the others; RMS norm, SwiGLU;
//! - a final RMS norm, each unit's four patch rows side by side through the merger (a GELU
//!   MLP) to one row of the text model's width, put back in reading order.
//!
//! Qwen2-VL's is the same without windows (every layer attends over the whole picture, taken
//! unit by unit in reading order), with LayerNorms (with biases) and a plain feed-forward
//! (GELU's quick form).
//!
//! Rounding follows ggml's CPU backend as `vit.rs` does: RMS norm's sum in f64, queries, keys
//! and values rounded to f16 before attention (flash attention), GELU through its f16 table.

use half::f16;

use super::config::{ClipConfig, ProjectorKind, VitActivation};
use super::matrix::Matrix;
use super::picture::Pixels;
use super::vit::{attend, ffn_names, layer_norm, Affine, Norm};
use super::Weights;
use crate::model::ops;

struct Layer {
    ln1: Norm,
    q: Affine,
    k: Affine,
    v: Affine,
    out: Affine,
    ln2: Norm,
    /// Qwen2.5-VL's SwiGLU gate; Qwen2-VL has none.
    gate: Option<Affine>,
    up: Affine,
    down: Affine,
}

/// The encoder and its merger.
pub(crate) struct QwenVit {
    cfg: ClipConfig,
    /// The two frames' patch kernels.
    patch: [Matrix; 2],
    layers: Vec<Layer>,
    post_ln: Norm,
    /// RMS norms (Qwen2.5-VL) rather than LayerNorms (Qwen2-VL).
    rms: bool,
    /// Attention within windows on the layers between full ones (Qwen2.5-VL).
    windowed: bool,
    merge_up: Affine,
    merge_down: Affine,
}

impl QwenVit {
    /// The encoder's tensors, every shape checked against `cfg`.
    pub(crate) fn load(cfg: &ClipConfig, t: &mut Weights) -> Result<QwenVit, String> {
        let (d, ff) = (cfg.width, cfg.ff);
        let v25 = cfg.kind == ProjectorKind::Qwen25Vl;
        let norm = |t: &mut Weights, name: &str| -> Result<Norm, String> {
            let w = t.vector(&format!("{name}.weight"), d, true)?;
            let b = t.vector(&format!("{name}.bias"), d, false)?;
            if v25 && b.is_some() {
                return Err(format!(
                    "`{name}` has a bias: Qwen2.5-VL's norms are RMS norms without one"
                ));
            }
            Ok(Norm {
                w: w.unwrap_or_default(),
                b,
            })
        };
        if t.dims("v.patch_embd.bias").is_some() || t.dims("v.position_embd.weight").is_some() {
            return Err(
                "a Qwen2.5-VL encoder has no patch bias nor position embeddings \
                        (llama.cpp refuses such a file too)"
                    .into(),
            );
        }
        let patch = [
            t.patch_matrix("v.patch_embd.weight", d, cfg.patch_size)?,
            t.patch_matrix("v.patch_embd.weight.1", d, cfg.patch_size)?,
        ];
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = format!("v.blk.{i}");
            let a = |t: &mut Weights, part: &str, n_out, k| {
                Affine::load(t, &format!("{p}.{part}"), n_out, k)
            };
            let (up, down) = ffn_names(t, &p, d, ff);
            layers.push(Layer {
                ln1: norm(t, &format!("{p}.ln1"))?,
                q: a(t, "attn_q", d, d)?,
                k: a(t, "attn_k", d, d)?,
                v: a(t, "attn_v", d, d)?,
                out: a(t, "attn_out", d, d)?,
                ln2: norm(t, &format!("{p}.ln2"))?,
                gate: match v25 {
                    true => Some(a(t, "ffn_gate", ff, d)?),
                    false => None,
                },
                up: a(t, up, ff, d)?,
                down: a(t, down, d, ff)?,
            });
        }
        let unit = 4 * d;
        Ok(QwenVit {
            cfg: cfg.clone(),
            patch,
            layers,
            post_ln: norm(t, "v.post_ln")?,
            rms: v25,
            windowed: v25,
            merge_up: Affine::load(t, "mm.0", unit, unit)?,
            merge_down: Affine::load(t, "mm.2", cfg.text_width, unit)?,
        })
    }

    /// The encoder's output for `pixels` (a size from `vision::own_size`): its rows of the text
    /// model's width, one per 2 × 2 unit, in reading order.
    pub(crate) fn forward(&self, pixels: &Pixels) -> candle_core::Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (p, d) = (cfg.patch_size, cfg.width);
        let unit = p * 2;
        let (nx, ny) = pixels.units(unit)?;
        // Without windows: one window of the whole picture (units in reading order).
        let side = match self.windowed {
            true => (cfg.window / unit).max(1),
            false => nx.max(ny),
        };
        let windows = Windows::new(nx, ny, side);
        let n = 4 * nx * ny;
        // Patches unit by unit in window order, each unit's four row by row.
        let place = unit_places(&windows.order, nx);
        let patches = pixels.patches(p, &place);
        let mut x = self.patch[0].product(&patches, n)?;
        ops::add(&mut x, &self.patch[1].product(&patches, n)?);
        drop(patches);
        let rope = VisionRope::new(cfg.head_dim());
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        let all = [(0, n)];
        let mut h = vec![0f32; n * d];
        let normed = |x: &[f32], norm: &Norm, out: &mut [f32]| match self.rms {
            true => ops::rms_norm_like_ggml(x, &norm.w, cfg.eps, out),
            false => {
                out.copy_from_slice(x);
                layer_norm(out, norm, cfg.eps);
            }
        };
        for (il, layer) in self.layers.iter().enumerate() {
            normed(&x, &layer.ln1, &mut h);
            let (mut q, mut k, mut v) = (
                layer.q.run(&h, n)?,
                layer.k.run(&h, n)?,
                layer.v.run(&h, n)?,
            );
            rope.apply(&mut q, &place, cfg.heads);
            rope.apply(&mut k, &place, cfg.heads);
            for t in [&mut q, &mut k, &mut v] {
                t.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
            }
            let full = !self.windowed || (il + 1) % cfg.window_pattern == 0;
            let ranges = if full { &all[..] } else { &windows.rows[..] };
            let a = attend(&q, &k, &v, n, cfg.heads, ranges, scale)?;
            ops::add(&mut x, &layer.out.run(&a, n)?);
            normed(&x, &layer.ln2, &mut h);
            let mut f = layer.up.run(&h, n)?;
            match &layer.gate {
                // SwiGLU: silu(gate) · up.
                Some(gate) => {
                    let mut g = gate.run(&h, n)?;
                    ops::silu(&mut g);
                    ops::mul(&mut g, &f);
                    f = g;
                }
                None => match cfg.activation {
                    VitActivation::Gelu => ops::gelu(&mut f),
                    VitActivation::GeluQuick => ops::gelu_quick(&mut f),
                    VitActivation::Silu => ops::silu(&mut f),
                },
            }
            ops::add(&mut x, &layer.down.run(&f, n)?);
        }
        normed(&x, &self.post_ln, &mut h);
        // Four patch rows side by side are one unit's row of 4·width: no copy needed.
        let mut m = self.merge_up.run(&h, n / 4)?;
        ops::gelu(&mut m);
        let merged = self.merge_down.run(&m, n / 4)?;
        // Back to reading order.
        let w = cfg.text_width;
        let mut values = vec![0f32; merged.len()];
        for (i, &u) in windows.order.iter().enumerate() {
            values[u * w..][..w].copy_from_slice(&merged[i * w..][..w]);
        }
        Ok(values)
    }
}

/// Each patch's (row, column) where units of 2 × 2 patches (of a grid `nx` units a row) are
/// taken in `order`, each unit's four row by row.
pub(crate) fn unit_places(order: &[usize], nx: usize) -> Vec<(usize, usize)> {
    let mut place = Vec::with_capacity(4 * order.len());
    for &u in order {
        let (uy, ux) = (u / nx, u % nx);
        for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            place.push((2 * uy + dy, 2 * ux + dx));
        }
    }
    place
}

/// The order units are taken in (window by window, each window's units row by row, as
/// llama.cpp's `inv_window_idx`), and each window's rows (4 per unit) as (first, count).
struct Windows {
    order: Vec<usize>,
    rows: Vec<(usize, usize)>,
}

impl Windows {
    fn new(nx: usize, ny: usize, side: usize) -> Windows {
        let mut order = Vec::with_capacity(nx * ny);
        let mut rows = Vec::new();
        for y in (0..ny).step_by(side) {
            for x in (0..nx).step_by(side) {
                let first = order.len();
                for wy in y..(y + side).min(ny) {
                    for wx in x..(x + side).min(nx) {
                        order.push(wy * nx + wx);
                    }
                }
                rows.push((4 * first, 4 * (order.len() - first)));
            }
        }
        Windows { order, rows }
    }
}

/// ggml's vision RoPE (`GGML_ROPE_TYPE_VISION` over a head of `hd`, base 10,000): pair `k`
/// is (`k`, `k + hd/2`); the first `hd/4` pairs turn by the patch's row, the next by its
/// column, each section's frequencies starting again from 1.
pub(crate) struct VisionRope {
    hd: usize,
    /// Per pair of a section: its frequency, as ggml multiplies it up in f32.
    freqs: Vec<f32>,
}

impl VisionRope {
    pub(crate) fn new(hd: usize) -> VisionRope {
        let scale = 10_000f32.powf(-2.0 / (hd / 2) as f32);
        let mut f = 1f32;
        let freqs = (0..hd / 4)
            .map(|_| {
                let now = f;
                f *= scale;
                now
            })
            .collect();
        VisionRope { hd, freqs }
    }

    /// Turns every head of each row (`heads × hd` values) by its patch's (row, column).
    pub(crate) fn apply(&self, x: &mut [f32], place: &[(usize, usize)], heads: usize) {
        let (hd, half, quarter) = (self.hd, self.hd / 2, self.hd / 4);
        for (row, &(py, px)) in x.chunks_exact_mut(heads * hd).zip(place) {
            let turns: Vec<(f32, f32)> = (0..half)
                .map(|k| {
                    let (pos, f) = match k < quarter {
                        true => (py, self.freqs[k]),
                        false => (px, self.freqs[k - quarter]),
                    };
                    let theta = pos as f32 * f;
                    (theta.cos(), theta.sin())
                })
                .collect();
            for head in row.chunks_exact_mut(hd) {
                for (k, &(c, s)) in turns.iter().enumerate() {
                    let (a, b) = (head[k], head[k + half]);
                    head[k] = a * c - b * s;
                    head[k + half] = a * s + b * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_group_units_and_cover_each_once() {
        // 5 × 3 units in windows of 2: (0..2, 0..2), (2..4, 0..2), (4, 0..2), then the last row.
        let w = Windows::new(5, 3, 2);
        assert_eq!(
            w.order,
            vec![0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]
        );
        assert_eq!(
            w.rows,
            vec![(0, 16), (16, 16), (32, 8), (40, 8), (48, 8), (56, 4)]
        );
        let mut seen = w.order.clone();
        seen.sort();
        assert_eq!(seen, (0..15).collect::<Vec<_>>());
    }

    #[test]
    fn vision_rope_turns_by_row_then_column() {
        let rope = VisionRope::new(8);
        // One head of 8: pairs (0,4), (1,5) turn by the row, (2,6), (3,7) by the column.
        let mut x = vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        rope.apply(&mut x, &[(2, 0)], 1);
        let f1 = 10_000f32.powf(-0.5);
        assert!((x[0] - 2f32.cos()).abs() < 1e-6 && (x[4] - 2f32.sin()).abs() < 1e-6);
        assert!((x[1] - (2.0 * f1).cos()).abs() < 1e-6);
        // Column 0: no turn.
        assert_eq!((x[2], x[3], x[6], x[7]), (1.0, 1.0, 0.0, 0.0));
    }
}
