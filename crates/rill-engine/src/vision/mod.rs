//! Images in the prompt (issue 42): a vision projector file (`mmproj-*.gguf`, llama.cpp's `clip`
//! architecture) turns a picture into rows of the text model's width, which take the place of
//! tokens in the prompt.
//!
//! ```text
//! bytes ──Picture::decode──► Picture ──fit──► Pixels ──encoder──► image rows
//!        (picture.rs: JPEG,      (resize, pad,       (Gemma 3: vit.rs, then pool, norm, project;
//!         PNG, WebP, limits)      normalise)          Qwen2-VL, 2.5-VL: qwen.rs; Qwen3-VL,
//!                                                     Qwen3.5: qwen3.rs; Gemma 4: gemma4.rs;
//!                                                     these three at the picture's own size)
//! ```
//!
//! [`Projector::load`] reads the file as strictly as a model file (`gguf.rs`'s header checks,
//! then [`config`]'s numbers against each other and every tensor's shape against them), so a
//! bad file is a named error at load. Its matrices run on our kernels (`matrix.rs`), read from
//! a map of the file as a model's are. The reference is llama.cpp's `tools/mtmd/` (`clip.cpp`,
//! `models/siglip.cpp`, `mtmd-image.cpp`); `scripts/record-reference-images.py` records its
//! embeddings on the test projectors, and `tests/vision.rs` holds ours to them.

mod config;
mod gemma4;
mod matrix;
pub mod picture;
mod prompt;
mod qwen;
mod qwen3;
mod resample;
mod vit;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;

pub use config::{ClipConfig, ProjectorKind};
use gemma4::Gemma4Vit;
use matrix::Matrix;
pub use picture::{ImageError, Picture};
pub use prompt::{beside, is_projector, PromptImage, Vision};
use qwen::QwenVit;
use qwen3::Qwen3Vit;
use vit::Vit;

use crate::error::{Error, Result};
use crate::gguf::Header;
use crate::kernels::{Isa, TensorType};
use crate::model::tensors::{raw_tensor, RawTensor, TensorSource};

/// A loaded vision projector: its encoder and the head that maps the encoder's rows to the
/// text model's.
pub struct Projector {
    cfg: ClipConfig,
    encoder: Encoder,
    path: PathBuf,
}

/// The encoder and what follows it, per projector type.
enum Encoder {
    /// Gemma 3: SigLIP, then average pooling `merge` × `merge`, RMS norm (`mm.soft_emb_norm`,
    /// Gemma's +1 already in the file's weights), projection (`mm.input_projection`, stored
    /// transposed).
    Gemma3 {
        vit: Vit,
        norm: Vec<f32>,
        proj: Matrix,
    },
    /// Qwen2-VL and Qwen2.5-VL: their encoder and merger (`qwen.rs`).
    Qwen(QwenVit),
    /// Qwen3-VL and Qwen3.5: their encoder, merger and deepstack mergers (`qwen3.rs`).
    Qwen3(Qwen3Vit),
    /// Gemma 4: its encoder, pooling and projection (`gemma4.rs`).
    Gemma4(Gemma4Vit),
}

/// An image as rows of the text model's width: what takes its place in the prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageRows {
    /// `rows × width` values, row-major.
    pub values: Arc<Vec<f32>>,
    pub rows: usize,
    pub width: usize,
    /// The picture's identity ([`Picture::id`]).
    pub id: u64,
    /// The rows as a grid, `nx` a row (Qwen-VL's M-RoPE positions read it).
    pub nx: usize,
    pub ny: usize,
}

impl Projector {
    /// Loads and checks a projector file.
    pub fn load(path: &Path) -> Result<Projector> {
        let (ct, mut reader, _len) = crate::model::read_header(path, false)?;
        let bad = |m: String| Error::model_file(path, format!("vision projector: {m}"));
        let cfg = ClipConfig::from_header(&ct).map_err(bad)?;
        #[cfg(unix)]
        // SAFETY: the map is only read; see `Model::load_with` for a file changed under it.
        let map = unsafe { memmap2::Mmap::map(reader.get_ref()) }
            .ok()
            .map(Arc::new);
        #[cfg(not(unix))]
        let map: Option<Arc<memmap2::Mmap>> = None;
        let source = match &map {
            Some(map) => TensorSource::Mapped(map),
            None => TensorSource::Read(&mut reader),
        };
        let mut weights = Weights {
            ct: &ct,
            source,
            isa: Isa::detect(),
        };
        let encoder = match cfg.kind {
            ProjectorKind::Gemma3 => Encoder::Gemma3 {
                vit: Vit::load(&cfg, &mut weights).map_err(bad)?,
                norm: weights
                    .vector("mm.soft_emb_norm.weight", cfg.width, true)
                    .map_err(bad)?
                    .unwrap_or_default(),
                proj: weights
                    .transposed("mm.input_projection.weight", cfg.width, cfg.text_width)
                    .map_err(bad)?,
            },
            ProjectorKind::Qwen25Vl | ProjectorKind::Qwen2Vl => {
                Encoder::Qwen(QwenVit::load(&cfg, &mut weights).map_err(bad)?)
            }
            ProjectorKind::Gemma4 => {
                Encoder::Gemma4(Gemma4Vit::load(&cfg, &mut weights).map_err(bad)?)
            }
            ProjectorKind::Qwen3Vl => {
                Encoder::Qwen3(Qwen3Vit::load(&cfg, &mut weights).map_err(bad)?)
            }
        };
        tracing::info!(path = %path.display(), kind = ?cfg.kind, "vision projector loaded");
        Ok(Projector {
            cfg,
            encoder,
            path: path.to_owned(),
        })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.cfg
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The grid of rows (`nx`, `ny`) an image of `width` × `height` pixels becomes: the same
    /// for every image where the encoder reads a fixed square (Gemma 3), the image's own
    /// shape where it keeps it (Qwen-VL, Gemma 4).
    pub fn grid(&self, width: u32, height: u32) -> (usize, usize) {
        let cfg = &self.cfg;
        match cfg.dynamic_size() {
            false => {
                let side = cfg.patches_per_side() / cfg.merge;
                (side, side)
            }
            true => {
                let (w, h) = own_size(cfg, width, height);
                let unit = cfg.patch_size * cfg.merge;
                (w / unit, h / unit)
            }
        }
    }

    /// The text model's width, which its rows are projected to.
    pub fn text_width(&self) -> usize {
        self.cfg.text_width
    }

    /// Deepstack layers (Qwen3-VL): each adds a run of the text model's width to every image
    /// token's row, for the text model to add after one of its first layers; 0 for the others.
    pub fn deepstack(&self) -> usize {
        match &self.encoder {
            Encoder::Qwen3(vit) => vit.deepstack(),
            _ => 0,
        }
    }

    /// The width of each row it makes: the text model's, once more per deepstack layer.
    pub fn row_width(&self) -> usize {
        self.cfg.text_width * (1 + self.deepstack())
    }

    /// The picture as rows of [`row_width`](Self::row_width): the text model's width, and as
    /// much again per deepstack layer.
    pub fn encode(&self, picture: &Picture) -> Result<ImageRows> {
        let cfg = &self.cfg;
        let (nx, ny) = self.grid(picture.width(), picture.height());
        // At its own size (Qwen-VL, Gemma 4): whole units of merged patches, bicubic.
        let own_pixels = || {
            let unit = cfg.patch_size * cfg.merge;
            let filter = picture::Filter::Bicubic;
            picture.fit(nx * unit, ny * unit, filter, cfg.mean, cfg.std)
        };
        let values = match &self.encoder {
            Encoder::Gemma3 { vit, norm, proj } => {
                let pixels = picture.fit_square(cfg.image_size, cfg.mean, cfg.std);
                let patches = vit.forward(&pixels.values)?;
                let side = cfg.patches_per_side();
                let pooled = pool(&patches, side, side, cfg.merge, cfg.width);
                let mut normed = vec![0f32; pooled.len()];
                crate::model::ops::rms_norm_like_ggml(&pooled, norm, cfg.eps, &mut normed);
                proj.product(&normed, nx * ny)?
            }
            Encoder::Qwen(vit) => vit.forward(&own_pixels())?,
            Encoder::Qwen3(vit) => vit.forward(&own_pixels())?,
            Encoder::Gemma4(vit) => vit.forward(&own_pixels())?,
        };
        Ok(ImageRows {
            rows: nx * ny,
            width: self.row_width(),
            values: Arc::new(values),
            id: picture.id(),
            nx,
            ny,
        })
    }
}

/// The size (pixels) an image of `width` × `height` is encoded at where the encoder keeps its
/// shape: its aspect ratio kept, whole units of `merge` × `merge` patches, within the
/// projector's token limits (llama.cpp's `calc_size_preserved_ratio`).
fn own_size(cfg: &ClipConfig, width: u32, height: u32) -> (usize, usize) {
    let unit = cfg.patch_size * cfg.merge;
    let area = unit * unit;
    let (least, most) = cfg.token_limits();
    picture::preserved_ratio(width, height, unit, least * area, most * area)
}

/// Average pooling of a grid of rows (`nx` a row, `ny` rows; `width` values each) over
/// `m` × `m` windows, summed in ggml's order (window rows, then columns) and divided once.
fn pool(rows: &[f32], nx: usize, ny: usize, m: usize, width: usize) -> Vec<f32> {
    let (out_x, out_y) = (nx / m, ny / m);
    let mut out = vec![0f32; out_x * out_y * width];
    for (t, o) in out.chunks_exact_mut(width).enumerate() {
        let (oy, ox) = (t / out_x, t % out_x);
        for dy in 0..m {
            for dx in 0..m {
                let at = ((oy * m + dy) * nx + ox * m + dx) * width;
                for (o, v) in o.iter_mut().zip(&rows[at..at + width]) {
                    *o += v;
                }
            }
        }
        let n = (m * m) as f32;
        o.iter_mut().for_each(|v| *v /= n);
    }
    out
}

/// A projector file's tensors, handed out with their shapes checked.
pub(crate) struct Weights<'a> {
    ct: &'a Header,
    source: TensorSource<'a, BufReader<File>>,
    isa: Isa,
}

impl Weights<'_> {
    /// A tensor's dimensions, row-major, if the file has it.
    pub(crate) fn dims(&self, name: &str) -> Option<&[usize]> {
        self.ct.tensor_infos.get(name).map(|t| t.shape.dims())
    }

    fn raw(&mut self, name: &str) -> Result<RawTensor<'_>, String> {
        raw_tensor(self.ct, &mut self.source, name, &Device::Cpu)
            .map_err(|e| format!("tensor `{name}`: {}", crate::error::candle_message(&e)))
    }

    fn values(raw: &RawTensor, name: &str) -> Result<Vec<f32>, String> {
        let v = || -> candle_core::Result<Vec<f32>> {
            raw.qtensor()?
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()
        };
        let v =
            v().map_err(|e| format!("tensor `{name}`: {}", crate::error::candle_message(&e)))?;
        match v.iter().all(|x| x.is_finite()) {
            true => Ok(v),
            false => Err(format!("tensor `{name}` holds values that are not finite")),
        }
    }

    /// A tensor of `n` values (any shape); `None` when it is absent and not `required`.
    pub(crate) fn vector(
        &mut self,
        name: &str,
        n: usize,
        required: bool,
    ) -> Result<Option<Vec<f32>>, String> {
        let Some(dims) = self.dims(name) else {
            return match required {
                true => Err(format!("tensor `{name}` is missing")),
                false => Ok(None),
            };
        };
        let count: usize = dims.iter().product();
        if count != n {
            return Err(format!(
                "tensor `{name}` has {count} values where {n} belong"
            ));
        }
        let raw = self.raw(name)?;
        Self::values(&raw, name).map(Some)
    }

    /// Matrix `name` of `n_out` rows of `k`.
    pub(crate) fn matrix(&mut self, name: &str, n_out: usize, k: usize) -> Result<Matrix, String> {
        self.matrix_of(name, &[n_out, k], n_out, k)
    }

    /// A convolution's kernel `[n_out, 3, p, p]` over patches of `p` pixels a side, as the
    /// matrix it is over each patch's `3·p·p` values.
    pub(crate) fn patch_matrix(
        &mut self,
        name: &str,
        n_out: usize,
        p: usize,
    ) -> Result<Matrix, String> {
        self.matrix_of(name, &[n_out, 3, p, p], n_out, 3 * p * p)
    }

    fn matrix_of(
        &mut self,
        name: &str,
        dims: &[usize],
        n_out: usize,
        k: usize,
    ) -> Result<Matrix, String> {
        match self.dims(name) {
            None => return Err(format!("tensor `{name}` is missing")),
            Some(d) if d != dims => {
                return Err(format!(
                    "tensor `{name}` is {d:?}; the header's numbers make it {dims:?}"
                ))
            }
            Some(_) => {}
        }
        let isa = self.isa;
        let raw = self.raw(name)?;
        let made = Matrix::from_file(
            raw.dtype,
            n_out,
            k,
            &raw.bytes,
            || Self::values(&raw, name).map_err(candle_core::Error::Msg),
            isa,
        );
        made.map_err(|e| format!("tensor `{name}`: {}", crate::error::candle_message(&e)))
    }

    /// Matrix `name` stored as `[rows, cols]` (the converter's orientation for a projection
    /// used as `x · W`), as the `[cols, rows]` matrix it is for a product.
    pub(crate) fn transposed(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix, String> {
        match self.dims(name) {
            None => return Err(format!("tensor `{name}` is missing")),
            Some(d) if d != [rows, cols] => {
                return Err(format!(
                    "tensor `{name}` is {d:?}; the header's numbers make it [{rows}, {cols}]"
                ))
            }
            Some(_) => {}
        }
        let isa = self.isa;
        let raw = self.raw(name)?;
        let dtype: TensorType = raw.dtype;
        let v = Self::values(&raw, name)?;
        let mut t = vec![0f32; v.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = v[r * cols + c];
            }
        }
        Matrix::from_f32(t, cols, rows, dtype, isa)
            .map_err(|e| format!("tensor `{name}`: {}", crate::error::candle_message(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_averages_each_window() {
        // A 4 × 4 grid of one value each (the row's index), pooled 2 × 2.
        let rows: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let out = pool(&rows, 4, 4, 2, 1);
        assert_eq!(out, vec![2.5, 4.5, 10.5, 12.5]);
        // A 4 × 2 grid: two windows side by side.
        let out = pool(&rows[..8], 4, 2, 2, 1);
        assert_eq!(out, vec![2.5, 4.5]);
    }
}
