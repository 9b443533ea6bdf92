//! Qwen3-VL's vision encoder (`clip.projector_type = qwen3vl_merger`), which Qwen3.5 uses too,
//! after llama.cpp's `tools/mtmd/models/qwen3vl.cpp` and the inputs `clip.cpp` gives it:
//!
//! - the picture keeps its aspect ratio in whole units of 2 × 2 patches (as Qwen2-VL's:
//!   `vision::own_size`), each patch embedded by the file's two kernels (a video's two frames;
//!   a still picture is read by both), summed, plus the kernel's bias;
//! - a learned position embedding per patch: the file's square table resized to the picture's
//!   patches (bilinear, corners aligned, as ggml's `interpolate`) unless it is that size;
//! - patches taken unit by unit (each unit's four row by row), units in reading order;
//! - each block: LayerNorm, one fused q/k/v projection, 2-D vision RoPE (Qwen2-VL's), attention
//!   over the whole picture, LayerNorm, a GELU feed-forward; after the "deepstack" layers (those
//!   with `v.deepstack.N.*`), the block's output taken a unit at a time through a merger of its
//!   own (LayerNorm over the unit's four rows, GELU MLP) to a row of the text model's width;
//! - a final LayerNorm, each unit's four rows through the merger (`mm.0`, GELU, `mm.2`).
//!
//! Each image token's row is the merger's, then each deepstack layer's: `1 + deepstack` rows of
//! the text model's width side by side, which Qwen3-VL's text model adds after its first layers
//! (`model/decoder.rs`).
//!
//! Rounding follows ggml's CPU backend as `qwen.rs` does.

use half::f16;

use super::config::{ClipConfig, VitActivation};
use super::matrix::Matrix;
use super::picture::Pixels;
use super::qwen::{unit_places, VisionRope};
use super::vit::{attend, layer_norm, Affine, Norm};
use super::Weights;
use crate::model::ops;

/// A deepstack layer's merger: LayerNorm over a unit's four rows, then a GELU MLP.
struct Deepstack {
    norm: Norm,
    fc1: Affine,
    fc2: Affine,
}

struct Layer {
    ln1: Norm,
    qkv: Affine,
    out: Affine,
    ln2: Norm,
    up: Affine,
    down: Affine,
    deepstack: Option<Deepstack>,
}

/// The encoder, its mergers and the learned position table.
pub(crate) struct Qwen3Vit {
    cfg: ClipConfig,
    patch: [Matrix; 2],
    patch_bias: Vec<f32>,
    /// `side × side` rows of the encoder's width.
    position: Vec<f32>,
    side: usize,
    pre_ln: Option<Norm>,
    layers: Vec<Layer>,
    post_ln: Norm,
    merge_up: Affine,
    merge_down: Affine,
}

impl Qwen3Vit {
    /// The encoder's tensors, every shape checked against `cfg`.
    pub(crate) fn load(cfg: &ClipConfig, t: &mut Weights) -> Result<Qwen3Vit, String> {
        let (d, ff) = (cfg.width, cfg.ff);
        let unit = 4 * d;
        let norm = |t: &mut Weights, name: &str, n: usize| -> Result<Option<Norm>, String> {
            Ok(match t.vector(&format!("{name}.weight"), n, false)? {
                Some(w) => Some(Norm {
                    w,
                    b: t.vector(&format!("{name}.bias"), n, false)?,
                }),
                None => None,
            })
        };
        let need = |t: &mut Weights, name: &str, n: usize| {
            norm(t, name, n)?.ok_or_else(|| format!("tensor `{name}.weight` is missing"))
        };
        let patch = [
            t.patch_matrix("v.patch_embd.weight", d, cfg.patch_size)?,
            t.patch_matrix("v.patch_embd.weight.1", d, cfg.patch_size)?,
        ];
        let patch_bias = t.vector("v.patch_embd.bias", d, true)?.unwrap_or_default();
        let (side, position) = match t.dims("v.position_embd.weight") {
            Some(&[n, w]) if w == d && n > 0 && n.isqrt() * n.isqrt() == n => {
                let v = t.vector("v.position_embd.weight", n * d, true)?;
                (n.isqrt(), v.unwrap_or_default())
            }
            Some(dims) => {
                return Err(format!(
                    "tensor `v.position_embd.weight` is {dims:?}; Qwen3-VL's is a square \
                     number of rows of {d}"
                ))
            }
            None => return Err("tensor `v.position_embd.weight` is missing".into()),
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = format!("v.blk.{i}");
            let ds = format!("v.deepstack.{i}");
            let deepstack = match t.dims(&format!("{ds}.fc1.weight")) {
                None => None,
                Some(_) => Some(Deepstack {
                    norm: need(t, &format!("{ds}.norm"), unit)?,
                    fc1: Affine::load(t, &format!("{ds}.fc1"), unit, unit)?,
                    fc2: Affine::load(t, &format!("{ds}.fc2"), cfg.text_width, unit)?,
                }),
            };
            layers.push(Layer {
                ln1: need(t, &format!("{p}.ln1"), d)?,
                qkv: Affine::load(t, &format!("{p}.attn_qkv"), 3 * d, d)?,
                out: Affine::load(t, &format!("{p}.attn_out"), d, d)?,
                ln2: need(t, &format!("{p}.ln2"), d)?,
                up: Affine::load(t, &format!("{p}.ffn_up"), ff, d)?,
                down: Affine::load(t, &format!("{p}.ffn_down"), d, ff)?,
                deepstack,
            });
        }
        Ok(Qwen3Vit {
            cfg: cfg.clone(),
            patch,
            patch_bias,
            position,
            side,
            pre_ln: norm(t, "v.pre_ln", d)?,
            layers,
            post_ln: need(t, "v.post_ln", d)?,
            merge_up: Affine::load(t, "mm.0", unit, unit)?,
            merge_down: Affine::load(t, "mm.2", cfg.text_width, unit)?,
        })
    }

    /// Deepstack layers: each adds a row of the text model's width to every image token's.
    pub(crate) fn deepstack(&self) -> usize {
        self.layers.iter().filter(|l| l.deepstack.is_some()).count()
    }

    /// The encoder's output for `pixels` (a size from `vision::own_size`): per 2 × 2 unit in
    /// reading order, the merger's row and then each deepstack layer's.
    pub(crate) fn forward(&self, pixels: &Pixels) -> candle_core::Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (p, d) = (cfg.patch_size, cfg.width);
        let (nx, ny) = pixels.units(p * 2)?;
        let (pw, ph) = (2 * nx, 2 * ny);
        let n = pw * ph;
        // Patches unit by unit in reading order, each unit's four row by row.
        let order: Vec<usize> = (0..nx * ny).collect();
        let place = unit_places(&order, nx);
        let patches = pixels.patches(p, &place);
        let mut x = self.patch[0].product(&patches, n)?;
        ops::add(&mut x, &self.patch[1].product(&patches, n)?);
        drop(patches);
        let table = self.positions(pw, ph);
        for (row, &(py, px)) in x.chunks_exact_mut(d).zip(&place) {
            ops::add(row, &self.patch_bias);
            ops::add(row, &table[(py * pw + px) * d..][..d]);
        }
        if let Some(norm) = &self.pre_ln {
            layer_norm(&mut x, norm, cfg.eps);
        }
        let rope = VisionRope::new(cfg.head_dim());
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        let gelu = |f: &mut [f32]| match cfg.activation {
            VitActivation::Gelu => ops::gelu(f),
            VitActivation::GeluQuick => ops::gelu_quick(f),
            VitActivation::Silu => ops::silu(f),
        };
        let mut stacked = Vec::new();
        for layer in &self.layers {
            let mut h = x.clone();
            layer_norm(&mut h, &layer.ln1, cfg.eps);
            let qkv = layer.qkv.run(&h, n)?;
            let part = |i: usize| -> Vec<f32> {
                qkv.chunks_exact(3 * d)
                    .flat_map(|r| &r[i * d..(i + 1) * d])
                    .copied()
                    .collect()
            };
            let (mut q, mut k, mut v) = (part(0), part(1), part(2));
            drop(qkv);
            rope.apply(&mut q, &place, cfg.heads);
            rope.apply(&mut k, &place, cfg.heads);
            for t in [&mut q, &mut k, &mut v] {
                t.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
            }
            let a = attend(&q, &k, &v, n, cfg.heads, &[(0, n)], scale)?;
            ops::add(&mut x, &layer.out.run(&a, n)?);
            h.copy_from_slice(&x);
            layer_norm(&mut h, &layer.ln2, cfg.eps);
            let mut f = layer.up.run(&h, n)?;
            gelu(&mut f);
            ops::add(&mut x, &layer.down.run(&f, n)?);
            if let Some(ds) = &layer.deepstack {
                // A unit's four rows side by side are its row of 4·width: no copy needed.
                let mut u = x.clone();
                layer_norm(&mut u, &ds.norm, cfg.eps);
                let mut m = ds.fc1.run(&u, n / 4)?;
                ops::gelu(&mut m);
                stacked.push(ds.fc2.run(&m, n / 4)?);
            }
        }
        layer_norm(&mut x, &self.post_ln, cfg.eps);
        let mut m = self.merge_up.run(&x, n / 4)?;
        ops::gelu(&mut m);
        let merged = self.merge_down.run(&m, n / 4)?;
        // Each token's row: the merger's, then each deepstack layer's.
        let w = cfg.text_width;
        let mut values = Vec::with_capacity(merged.len() * (1 + stacked.len()));
        for t in 0..nx * ny {
            values.extend_from_slice(&merged[t * w..][..w]);
            for s in &stacked {
                values.extend_from_slice(&s[t * w..][..w]);
            }
        }
        Ok(values)
    }

    /// The position table at `pw × ph` patches (rows of the encoder's width, reading order):
    /// the file's own where it is that size, else resized bilinearly with the corners aligned,
    /// as ggml's `interpolate` computes it.
    fn positions(&self, pw: usize, ph: usize) -> Vec<f32> {
        let (n, d) = (self.side, self.cfg.width);
        if (pw, ph) == (n, n) {
            return self.position.clone();
        }
        // ggml's scale factors: (out − 1)/(in − 1) with aligned corners, where both exceed 1.
        let factor = |out: usize| match out > 1 && n > 1 {
            true => (out - 1) as f32 / (n - 1) as f32,
            false => out as f32 / n as f32,
        };
        let (sx, sy) = (factor(pw), factor(ph));
        let near = |v: f32| {
            let v0 = (v.floor() as i64).clamp(0, n as i64 - 1) as usize;
            let v1 = (v0 + 1).min(n - 1);
            (v0, v1, (v - v0 as f32).clamp(0.0, 1.0))
        };
        let mut out = vec![0f32; pw * ph * d];
        for i1 in 0..ph {
            let (y0, y1, dy) = near(i1 as f32 / sy);
            for i0 in 0..pw {
                let (x0, x1, dx) = near(i0 as f32 / sx);
                let at = |y: usize, x: usize| &self.position[(y * n + x) * d..][..d];
                let (a, b, c, e) = (at(y0, x0), at(y0, x1), at(y1, x0), at(y1, x1));
                let o = &mut out[(i1 * pw + i0) * d..][..d];
                for ch in 0..d {
                    o[ch] = a[ch] * (1.0 - dx) * (1.0 - dy)
                        + b[ch] * dx * (1.0 - dy)
                        + c[ch] * (1.0 - dx) * dy
                        + e[ch] * dx * dy;
                }
            }
        }
        out
    }
}
