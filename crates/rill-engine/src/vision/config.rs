//! A projector file's hyper-parameters (`clip.*` metadata, the keys llama.cpp's converter
//! writes: `tools/mtmd/clip-impl.h`), read and checked against each other before a weight is
//! read, so a file whose numbers disagree is a named error, never an index out of bounds
//! while an image is encoded.

use candle_core::quantized::gguf_file::Value;

use crate::gguf::Header;

/// The projector types Rill runs. llama.cpp knows some forty (`clip.projector_type`); the
/// others are refused by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectorKind {
    /// Gemma 3's SigLIP: the patches average-pooled `merge` × `merge`, RMS-normalised and
    /// projected (`mm.soft_emb_norm`, `mm.input_projection`).
    Gemma3,
    /// Qwen2.5-VL's vision transformer (`qwen2.5vl_merger`): images at their own aspect ratio
    /// in patches merged 2 × 2, 2-D M-RoPE, window attention but on every `n_wa_pattern`-th
    /// layer, RMS norms, a SwiGLU feed-forward, and an MLP merger (`qwen.rs`).
    Qwen25Vl,
    /// Qwen2-VL's (`qwen2vl_merger`): Qwen2.5-VL's without windows (every layer attends over
    /// the whole picture), with LayerNorms and a plain feed-forward (GELU's quick form).
    Qwen2Vl,
    /// Qwen3-VL's and Qwen3.5's (`qwen3vl_merger`): Qwen2-VL's shape with a patch bias,
    /// learned position embeddings, a fused q/k/v, GELU, and "deepstack" mergers after some
    /// layers whose rows the text model adds after its first layers (`qwen3.rs`).
    Qwen3Vl,
    /// Gemma 4's (`gemma4v`): images at their own aspect ratio, learned position embeddings
    /// by column and row, 2-D RoPE, q/k norms and unscaled scores, post-norms, the patches
    /// average-pooled `merge` × `merge`, then a norm and a projection (`gemma4.rs`).
    Gemma4,
}

/// The encoder's feed-forward activation (`clip.use_gelu`, `clip.use_silu`; neither: GELU's
/// quick form, as llama.cpp takes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VitActivation {
    Gelu,
    GeluQuick,
    Silu,
}

/// Hyper-parameters of a vision projector file.
#[derive(Clone, Debug)]
pub struct ClipConfig {
    pub kind: ProjectorKind,
    /// The side of the square image the encoder reads, and of its patches, in pixels.
    pub image_size: usize,
    pub patch_size: usize,
    /// The encoder's width, feed-forward width, layers and heads.
    pub width: usize,
    pub ff: usize,
    pub layers: usize,
    pub heads: usize,
    pub eps: f32,
    pub activation: VitActivation,
    /// The text model's width, which the image rows are projected to.
    pub text_width: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Patches pooled (Gemma 3) or merged (Qwen-VL) per side into one image token.
    pub merge: usize,
    /// Qwen2.5-VL: every `window_pattern`-th layer attends over the whole image, the others
    /// within windows of `window` pixels a side (`clip.vision.n_wa_pattern`; llama.cpp's 112).
    pub window_pattern: usize,
    pub window: usize,
}

/// Largest numbers a file may give: past any real encoder (SigLIP 400M: 1,152 wide, 4,304 in
/// its feed-forward, 27 layers, 896-pixel images).
const MAX_WIDTH: usize = 16_384;
const MAX_LAYERS: usize = 256;
const MAX_IMAGE: usize = 4_096;

impl ClipConfig {
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Image tokens a square image of `image_size` becomes (Gemma 3: every image).
    pub fn tokens_per_image(&self) -> usize {
        let side = self.patches_per_side() / self.merge;
        side * side
    }

    /// Whether images keep their aspect ratio and size (Qwen-VL, Gemma 4), rather than being
    /// fitted into the square of `image_size` (Gemma 3).
    pub fn dynamic_size(&self) -> bool {
        !matches!(self.kind, ProjectorKind::Gemma3)
    }

    /// The fewest and most image tokens a picture of its own size becomes (llama.cpp's
    /// `set_limit_image_tokens` per projector type).
    pub fn token_limits(&self) -> (usize, usize) {
        match self.kind {
            ProjectorKind::Gemma4 => (70, 1120),
            _ => (8, 4096),
        }
    }

    /// Reads and checks the metadata; the text says what is wrong.
    pub fn from_header(ct: &Header) -> Result<ClipConfig, String> {
        let arch = string(ct, "general.architecture")?;
        if arch != "clip" {
            return Err(format!(
                "`general.architecture` is `{arch}`, not `clip`: this is not a projector file"
            ));
        }
        if !matches!(
            ct.metadata.get("clip.has_vision_encoder"),
            Some(Value::Bool(true))
        ) {
            return Err(
                "the file has no vision encoder (`clip.has_vision_encoder`): an audio \
                        projector, which Rill does not run"
                    .into(),
            );
        }
        let kind = match ct.metadata.get("clip.projector_type") {
            Some(_) => string(ct, "clip.projector_type")?,
            None => string(ct, "clip.vision.projector_type")?,
        };
        let kind = match kind.as_str() {
            "gemma3" => ProjectorKind::Gemma3,
            "qwen2.5vl_merger" => ProjectorKind::Qwen25Vl,
            "qwen2vl_merger" => ProjectorKind::Qwen2Vl,
            "gemma4v" => ProjectorKind::Gemma4,
            "qwen3vl_merger" => ProjectorKind::Qwen3Vl,
            other => {
                return Err(format!(
                    "projector type `{other}` is not one Rill runs yet (it runs `gemma3`, \
                     `gemma4v`, `qwen2vl_merger`, `qwen2.5vl_merger` and `qwen3vl_merger`)"
                ))
            }
        };
        let n = |key: &str, max: usize| -> Result<usize, String> {
            let v = uint(ct, key)?;
            match v {
                1.. if v <= max => Ok(v),
                _ => Err(format!("`{key}` is {v}; it must be 1 to {max}")),
            }
        };
        let image_size = n("clip.vision.image_size", MAX_IMAGE)?;
        let patch_size = n("clip.vision.patch_size", image_size)?;
        let width = n("clip.vision.embedding_length", MAX_WIDTH)?;
        let ff = n("clip.vision.feed_forward_length", 4 * MAX_WIDTH)?;
        let layers = n("clip.vision.block_count", MAX_LAYERS)?;
        let heads = n("clip.vision.attention.head_count", width)?;
        let text_width = n("clip.vision.projection_dim", MAX_WIDTH)?;
        let eps = float(ct, "clip.vision.attention.layer_norm_epsilon")?;
        if !(eps > 0.0 && eps < 1.0) {
            return Err(format!(
                "`clip.vision.attention.layer_norm_epsilon` is {eps}; it must be in (0, 1)"
            ));
        }
        if !width.is_multiple_of(heads) {
            return Err(format!(
                "the encoder's width {width} is not a whole number of its {heads} heads"
            ));
        }
        if let Some(kv) = ct.metadata.get("clip.vision.attention.head_count_kv") {
            if kv.to_u32().ok() != Some(heads as u32) {
                return Err(
                    "the encoder's key/value heads differ from its heads: not a \
                            projector Rill runs"
                        .into(),
                );
            }
        }
        if !image_size.is_multiple_of(patch_size) {
            return Err(format!(
                "the image side {image_size} is not a whole number of {patch_size}-pixel patches"
            ));
        }
        let flag = |key: &str| matches!(ct.metadata.get(key), Some(Value::Bool(true)));
        let activation = match (flag("clip.use_gelu"), flag("clip.use_silu")) {
            (true, true) => return Err("both `clip.use_gelu` and `clip.use_silu` are set".into()),
            (true, false) => VitActivation::Gelu,
            (false, true) => VitActivation::Silu,
            (false, false) => VitActivation::GeluQuick,
        };
        let mean = triple(ct, "clip.vision.image_mean")?;
        let std = triple(ct, "clip.vision.image_std")?;
        if std.iter().any(|s| !(s.is_finite() && *s > 0.0)) || mean.iter().any(|m| !m.is_finite()) {
            return Err(format!(
                "the image normalisation (mean {mean:?}, std {std:?}) is not finite and positive"
            ));
        }
        let (mut merge, mut window_pattern) = (4, 0);
        let scale_factor = "clip.vision.projector.scale_factor";
        match kind {
            // Gemma 3 pools 4 × 4 unless the file says otherwise (llama.cpp's default).
            ProjectorKind::Gemma3 => {
                if ct.metadata.contains_key(scale_factor) {
                    merge = n(scale_factor, image_size)?;
                }
                let side = image_size / patch_size;
                if !side.is_multiple_of(merge) {
                    return Err(format!(
                        "{side} patches a side do not pool {merge} × {merge} into whole tokens"
                    ));
                }
            }
            // Qwen2-VL and 2.5-VL merge 2 × 2 (the only merge llama.cpp's graph builds);
            // 2.5-VL needs its window pattern, 2-VL has none (every layer attends over all).
            ProjectorKind::Qwen25Vl | ProjectorKind::Qwen2Vl | ProjectorKind::Qwen3Vl => {
                merge = 2;
                if ct.metadata.contains_key("clip.vision.spatial_merge_size") {
                    let m = n("clip.vision.spatial_merge_size", 16)?;
                    if m != 2 {
                        return Err(format!(
                            "`clip.vision.spatial_merge_size` is {m}; Qwen2.5-VL merges 2 × 2"
                        ));
                    }
                }
                window_pattern = match kind {
                    ProjectorKind::Qwen25Vl => n("clip.vision.n_wa_pattern", MAX_LAYERS)?,
                    _ => 1,
                };
                if !(width / heads).is_multiple_of(4) {
                    return Err(format!(
                        "heads of {} values do not split into M-RoPE's four sections",
                        width / heads
                    ));
                }
            }
            // Gemma 4 pools 3 × 3 unless the file says otherwise; a picture's size is whole
            // pooling windows, so any factor divides it. Its RoPE turns half a head by the
            // column and half by the row, each half in pairs.
            ProjectorKind::Gemma4 => {
                merge = 3;
                if ct.metadata.contains_key(scale_factor) {
                    merge = n(scale_factor, 16)?;
                }
                if !(width / heads).is_multiple_of(4) {
                    return Err(format!(
                        "heads of {} values do not split into 2-D RoPE's halves of pairs",
                        width / heads
                    ));
                }
            }
        }
        Ok(ClipConfig {
            kind,
            image_size,
            patch_size,
            width,
            ff,
            layers,
            heads,
            eps,
            activation,
            text_width,
            mean,
            std,
            merge,
            window_pattern,
            // llama.cpp's `attn_window_size` for Qwen2.5-VL (its file does not say).
            window: 112,
        })
    }
}

fn get<'a>(ct: &'a Header, key: &str) -> Result<&'a Value, String> {
    ct.metadata
        .get(key)
        .ok_or_else(|| format!("`{key}` is missing"))
}

fn string(ct: &Header, key: &str) -> Result<String, String> {
    match get(ct, key)? {
        Value::String(s) => Ok(s.clone()),
        _ => Err(format!("`{key}` is not a string")),
    }
}

fn uint(ct: &Header, key: &str) -> Result<usize, String> {
    let v = get(ct, key)?;
    v.to_u32()
        .map(|v| v as usize)
        .or_else(|_| v.to_u64().map(|v| usize::try_from(v).unwrap_or(usize::MAX)))
        .or_else(|_| {
            v.to_i32()
                .map_err(|_| ())
                .and_then(|v| usize::try_from(v).map_err(|_| ()))
        })
        .map_err(|_| format!("`{key}` is not a whole number"))
}

fn float(ct: &Header, key: &str) -> Result<f32, String> {
    get(ct, key)?
        .to_f32()
        .map_err(|_| format!("`{key}` is not a number"))
}

/// The first three values of an array of numbers (llama.cpp reads three, one per channel).
fn triple(ct: &Header, key: &str) -> Result<[f32; 3], String> {
    let Value::Array(items) = get(ct, key)? else {
        return Err(format!("`{key}` is not an array"));
    };
    let values: Vec<f32> = items.iter().filter_map(|v| v.to_f32().ok()).collect();
    match values.as_slice() {
        [a, b, c, ..] if values.len() == items.len() => Ok([*a, *b, *c]),
        _ => Err(format!("`{key}` must hold at least three numbers")),
    }
}
