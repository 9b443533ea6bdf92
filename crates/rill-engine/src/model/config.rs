//! A llama-family model's hyper-parameters, read from the GGUF metadata (`llama.*`) and checked
//! against each other and against every weight's shape before any weight is loaded, so a file
//! whose header disagrees with its tensors fails at load with a message naming the tensor
//! (issue 13), never with an index out of bounds on the first token.

use std::path::Path;

use crate::gguf::Header;

use super::family::{Family, Mrope, QueryScale};
pub use super::hybrid::DeltaConfig;
use super::hybrid::{hybrid, layer_flags};
use crate::error::{candle_message, Error, Result};

/// Hyper-parameters read from the GGUF metadata (`<arch>.*`), and the family's description.
#[derive(Clone, Debug)]
pub struct DecoderConfig {
    pub family: Family,
    pub n_layer: usize,
    /// The first layer's heads (every layer's but in Gemma 4: [`heads`](Self::heads)).
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Each layer's attention heads (`heads.rs`).
    pub heads: Vec<super::heads::Heads>,
    pub hidden: usize,
    pub rms_eps: f64,
    pub rope_base: f32,
    /// Positions are multiplied by this in the global layers' RoPE (`1 / rope.scaling.factor`,
    /// linear scaling; 1 without).
    pub rope_scale: f32,
    /// Per layer: the window of positions it attends over (`None`: all of them).
    pub windows: Vec<Option<usize>>,
    /// The windowed layers' RoPE base and position scale.
    pub rope_base_swa: f32,
    pub rope_scale_swa: f32,
    /// Attention scores' and logits' soft-caps.
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// Queries are multiplied by this before their scores (instead of scaling the scores by
    /// `1/√head_dim`).
    pub query_prescale: Option<f32>,
    /// RoPE's cos and sin are multiplied by this (`rope.scaling.attn_factor`: Phi-3's long
    /// context models), so the rotated part of each score by its square.
    pub rope_attn_factor: f32,
    /// Which per-pair RoPE frequency divisors apply, if the file has them: `rope_freqs`
    /// (Llama 3.1), else Phi-3's `rope_factors_long` when this engine's context runs past the
    /// trained one (`rope.scaling.original_context_length`), `rope_factors_short` otherwise.
    pub rope_factors: Option<String>,
    /// Positions the model can attend over in this engine (the trained context, possibly capped).
    pub context_length: usize,
    /// YaRN's RoPE scaling, where the file asks for it (`rope.scaling.type = yarn`).
    pub yarn: Option<Yarn>,
    /// A mixture of experts' sizes, for a family whose feed-forward is one.
    pub experts: Option<ExpertsConfig>,
    /// The Gated DeltaNet layers' sizes, for a hybrid family (Qwen3.5).
    pub delta: Option<DeltaConfig>,
    /// Per layer: whether it is a recurrent (Gated DeltaNet) layer instead of attention.
    pub recurrent: Vec<bool>,
    /// M-RoPE's sections (`rope.dimension_sections`): on text every section turns by the
    /// token's position, but pairs the interleaved sections leave to the fourth (extra)
    /// position, which text holds at 0, do not turn.
    pub rope_sections: Option<[usize; 4]>,
    /// Per layer: the layer whose keys and values its queries read, itself but in the last
    /// layers of Gemma 4's E2B and E4B (`attention.shared_kv_layers`, `heads.rs`).
    pub kv_layer: Vec<usize>,
    /// The width of each layer's own embedding of the token (Gemma 4's E2B and E4B:
    /// `embedding_length_per_layer_input`); 0 without.
    pub per_layer_input: usize,
    /// Qwen3-VL's "deepstack" layers (`n_deepstack_layers`): an image row carries one more
    /// row of the model's width per such layer, added to the residual stream after each of
    /// the first ones; 0 without.
    pub deepstack: usize,
}

/// YaRN's RoPE scaling as llama.cpp applies it (ggml's `rope_yarn`, and the attention factor
/// `llama_context` derives): each pair's angle blends the interpolated angle (the position
/// times `freq_scale`) and the original one, by a ramp over the pairs between the correction
/// dimensions of `beta_fast` and `beta_slow`; cos and sin are multiplied by `mscale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `1 / rope.scaling.factor`.
    pub freq_scale: f32,
    /// `rope.scaling.original_context_length` (the trained context without it).
    pub original_context: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// How much of the ramp applies (`rope.scaling.yarn_ext_factor`; 1 without).
    pub ext_factor: f32,
    /// cos and sin are multiplied by this.
    pub mscale: f32,
}

impl Yarn {
    /// llama.cpp's numbers for a file's keys: the attention factor `get_mscale(factor)` (over
    /// `get_mscale(factor, yarn_log_multiplier)` where the file has one), cancelled against
    /// `rope_yarn`'s own `1 + 0.1·ln factor` and multiplied back by it, times the file's
    /// `rope.scaling.attn_factor`.
    fn new(factor: f32, original_context: usize, f: impl Fn(&str) -> Option<f32>) -> Yarn {
        let get_mscale = |s: f32, m: f32| match s <= 1.0 {
            true => 1.0,
            false => 0.1 * m * s.ln() + 1.0,
        };
        let freq_scale = 1.0 / factor;
        let ext_factor = f("rope.scaling.yarn_ext_factor")
            .filter(|e| e.is_finite() && *e >= 0.0)
            .unwrap_or(1.0);
        let mut attn = f("rope.scaling.attn_factor")
            .filter(|a| a.is_finite() && *a > 0.0)
            .unwrap_or(1.0);
        if ext_factor != 0.0 {
            let log_mul = f("rope.scaling.yarn_log_multiplier").unwrap_or(0.0);
            let base = match log_mul != 0.0 {
                true => get_mscale(factor, 1.0) / get_mscale(factor, log_mul),
                false => get_mscale(factor, 1.0),
            };
            attn *= base * (1.0 / (1.0 + 0.1 * factor.ln()));
            attn *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
        }
        Yarn {
            freq_scale,
            original_context,
            beta_fast: f("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
            beta_slow: f("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
            ext_factor,
            mscale: attn,
        }
    }

    /// `(cos, sin)` of pair `i` (of `rope_dim / 2`) for RoPE base `base`, whose unscaled angle
    /// at the position is `theta_extrap` (the position times the pair's frequency).
    pub fn cos_sin(&self, rope_dim: usize, base: f32, i: usize, theta_extrap: f32) -> (f32, f32) {
        // ggml_rope_yarn_corr_dims.
        let corr = |beta: f32| {
            rope_dim as f32
                * (self.original_context as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = corr(self.beta_fast).floor().max(0.0);
        let high = corr(self.beta_slow).ceil().min(rope_dim as f32 - 1.0);
        let y = (i as f32 - low) / (high - low).max(0.001);
        let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        let theta_interp = self.freq_scale * theta_extrap;
        let theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
        (theta.cos() * self.mscale, theta.sin() * self.mscale)
    }
}

/// How many experts a mixture has, how many a row goes through, and how wide each is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertsConfig {
    /// `expert_count`.
    pub count: usize,
    /// `expert_used_count`: the `k` of the top-k routing.
    pub used: usize,
    /// Each expert's feed-forward width (`expert_feed_forward_length`; without it,
    /// `feed_forward_length / expert_used_count`, as llama.cpp falls back).
    pub ff: usize,
    /// The shared expert's feed-forward width, for a family that has one
    /// (`expert_shared_feed_forward_length`, else `feed_forward_length`); 0 without.
    pub shared_ff: usize,
    /// The chosen experts' weights are multiplied by this (`expert_weights_scale`; 1 without).
    pub scale: f32,
}

/// The most experts a mixture may have (llama.cpp's `LLAMA_MAX_EXPERTS`).
const MAX_EXPERTS: usize = 512;

impl DecoderConfig {
    /// Floats per position in layer `layer`'s own KV cache: none where it reads another's.
    pub fn kv_width(&self, layer: usize) -> usize {
        match self.kv_layer.get(layer) {
            Some(&from) if from != layer => 0,
            _ => self.heads.get(layer).map_or(0, |h| h.kv_width()),
        }
    }

    /// The hyper-parameters of a llama-family GGUF and its RoPE width, checked against each
    /// other and against every weight's shape (nothing is loaded).
    pub(crate) fn read(
        ct: &Header,
        family: Family,
        context_cap: Option<usize>,
        path: &Path,
    ) -> Result<(DecoderConfig, usize)> {
        let arch = family.arch;
        let md = |key: &str| {
            ct.metadata.get(&format!("{arch}.{key}")).ok_or_else(|| {
                Error::model_file(path, format!("metadata `{arch}.{key}` is missing"))
            })
        };
        let u = |key: &str| -> Result<usize> {
            md(key)?.to_u32().map(|v| v as usize).map_err(|e| {
                Error::model_file(path, format!("`{arch}.{key}`: {}", candle_message(&e)))
            })
        };
        let hidden = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_kv_head = u("attention.head_count_kv").unwrap_or(n_head);
        let trained_ctx = u("context_length").unwrap_or(4096);
        let context_length = context_cap
            .map_or(trained_ctx, |c| c.min(trained_ctx))
            .clamp(1, MAX_CONTEXT);
        // A head's width: `attention.key_length` where the file gives it (Qwen3's heads are
        // wider than `embedding_length / head_count`), else the even split.
        let key_length = u("attention.key_length").ok();
        let head_dim = key_length.unwrap_or(hidden.checked_div(n_head).unwrap_or(0));
        let split_ok = key_length.is_some() || (n_head > 0 && hidden % n_head == 0);
        if n_head == 0 || n_kv_head == 0 || head_dim == 0 || !split_ok || n_head % n_kv_head != 0 {
            return Err(Error::model_file(
                path,
                format!("inconsistent heads: {n_head} heads, {n_kv_head} kv heads, width {hidden}"),
            ));
        }
        if let Ok(v) = u("attention.value_length") {
            if v != head_dim {
                return Err(Error::model_file(
                    path,
                    format!("keys {head_dim} wide and values {v}: Rill needs them equal"),
                ));
            }
        }
        let rope_dim = u("rope.dimension_count").unwrap_or(head_dim);
        if rope_dim == 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(Error::model_file(
                path,
                format!("`{arch}.rope.dimension_count` is {rope_dim}; heads are {head_dim} wide"),
            ));
        }
        // Multi-token-prediction blocks (`nextn_predict_layers`) follow the model's own: they
        // are skipped, as llama.cpp's main pass skips them.
        let blocks = u("block_count")?;
        let nextn = u("nextn_predict_layers").unwrap_or(0);
        let n_layer = blocks.checked_sub(nextn).ok_or_else(|| {
            Error::model_file(
                path,
                format!("{nextn} prediction layers of {blocks} blocks"),
            )
        })?;
        // Every layer has tensors of its own: a block count beyond the file's tensors is a
        // damaged header, refused before anything is sized by it.
        if blocks > ct.tensor_infos.len() {
            return Err(Error::model_file(
                path,
                format!(
                    "{blocks} layers, but the file holds {} tensors",
                    ct.tensor_infos.len()
                ),
            ));
        }
        let (delta, recurrent) = hybrid(ct, family, blocks, n_layer, path)?;
        let windows = windows(ct, family, n_layer, path)?;
        let per_layer_input = match family.swa_heads {
            true => u("embedding_length_per_layer_input").unwrap_or(0),
            false => 0,
        };
        let global = super::heads::Heads {
            n_head,
            n_kv_head,
            head_dim,
            rope_dim,
        };
        let heads = super::heads::per_layer(ct, &family, global, &windows, path)?;
        let kv_layer = super::heads::kv_layers(ct, &family, &heads, &windows, path)?;
        let deepstack = match family.arch {
            "qwen3vl" | "qwen3vlmoe" => u("n_deepstack_layers").unwrap_or(0),
            _ => 0,
        };
        if deepstack > n_layer {
            return Err(Error::model_file(
                path,
                format!("{deepstack} deepstack layers in a model of {n_layer}"),
            ));
        }
        let rope_sections = match ct.metadata.get(&format!("{arch}.rope.dimension_sections")) {
            Some(candle_core::quantized::gguf_file::Value::Array(items)) => {
                let mut s = [0usize; 4];
                for (i, v) in items.iter().take(4).enumerate() {
                    let signed = v.to_i32().ok().map(|v| v.max(0) as usize);
                    s[i] = signed
                        .or_else(|| v.to_u32().ok().map(|v| v as usize))
                        .unwrap_or(0);
                }
                (s.iter().sum::<usize>() > 0).then_some(s)
            }
            _ => None,
        };
        // A mixture beside the MLP is there where the file has one (Gemma 4 26B-A4B).
        let absent = family.experts_beside_mlp && md("expert_count").is_err();
        let experts = match family.experts {
            None => None,
            Some(_) if absent => None,
            Some(_) => {
                let count = u("expert_count")?;
                let used = u("expert_used_count")?;
                if count == 0 || count > MAX_EXPERTS || used == 0 || used > count {
                    return Err(Error::model_file(
                        path,
                        format!(
                            "a mixture of {count} experts of which {used} are used: Rill needs \
                             1 to {MAX_EXPERTS} experts and 1 to all of them used"
                        ),
                    ));
                }
                let ff = match u("expert_feed_forward_length") {
                    Ok(ff) => ff,
                    Err(_) => u("feed_forward_length")? / used,
                };
                let scale = md("expert_weights_scale")
                    .ok()
                    .and_then(|v| v.to_f32().ok())
                    .filter(|s| s.is_finite() && *s != 0.0)
                    .unwrap_or(1.0);
                let shared_ff = match family.shared_expert {
                    false => 0,
                    true => u("expert_shared_feed_forward_length")
                        .or_else(|_| u("feed_forward_length"))?,
                };
                Some(ExpertsConfig {
                    count,
                    used,
                    ff,
                    shared_ff,
                    scale,
                })
            }
        };
        let widths: Vec<super::table::Widths> = heads
            .iter()
            .map(|h| super::table::Widths {
                hidden,
                q: h.q_width(),
                kv: h.kv_width(),
                head: h.head_dim,
                per_layer: per_layer_input,
            })
            .collect();
        super::table::check_shapes(
            ct,
            path,
            family,
            &widths,
            rope_dim,
            experts,
            (delta, &recurrent, &kv_layer),
        )?;
        let f = |key: &str| md(key).ok().and_then(|v| v.to_f32().ok());
        let rope_base = f("rope.freq_base").unwrap_or(10_000.0);
        // Linear RoPE scaling (positions divided by the factor), or YaRN's (`Yarn`); frequency
        // factors (Llama 3.1, Phi-3) are `rope_factors` below.
        let scaling = md("rope.scaling.type")
            .ok()
            .and_then(|v| v.to_string().ok().cloned());
        let rope_scale = match (scaling.as_deref(), f("rope.scaling.factor")) {
            (None | Some("linear"), Some(factor)) if factor > 0.0 => 1.0 / factor,
            _ => 1.0,
        };
        let original_context = md("rope.scaling.original_context_length")
            .ok()
            .and_then(|v| v.to_u32().ok())
            .map_or(trained_ctx, |v| v as usize);
        let yarn = match (scaling.as_deref(), f("rope.scaling.factor")) {
            (Some("yarn"), Some(factor)) if factor.is_finite() && factor > 0.0 => {
                Some(Yarn::new(factor, original_context.max(1), f))
            }
            _ => None,
        };
        if delta.is_some() && windows.iter().any(Option::is_some) {
            return Err(Error::model_file(
                path,
                "sliding windows beside recurrent layers: Rill runs one or the other",
            ));
        }
        let (rope_base_swa, rope_scale_swa) = match family.sliding_window {
            Some(sw) => match (f("rope.freq_base_swa"), sw.default_base) {
                (Some(b), Some(_)) => (b, 1.0),
                (Some(b), None) => (b, rope_scale),
                (None, Some(b)) => (b, 1.0),
                (None, None) => (rope_base, rope_scale),
            },
            None => (rope_base, rope_scale),
        };
        let cap = |key: &str, default: Option<f32>| match family.softcap_keys {
            true => f(key).or(default).filter(|c| *c > 0.0),
            false => None,
        };
        let query_prescale = match family.query_scale {
            QueryScale::HeadDim => None,
            QueryScale::One => Some(1.0),
            QueryScale::QueriesByHeadDim => Some(1.0 / (head_dim as f32).sqrt()),
            QueryScale::Gemma { layers_27b } if n_layer == layers_27b => {
                Some(1.0 / ((hidden / n_head) as f32).sqrt())
            }
            QueryScale::Gemma { .. } => Some(1.0 / (head_dim as f32).sqrt()),
        };
        let cfg = DecoderConfig {
            family,
            n_layer,
            n_head: heads.first().map_or(n_head, |h| h.n_head),
            n_kv_head: heads.first().map_or(n_kv_head, |h| h.n_kv_head),
            head_dim: heads.first().map_or(head_dim, |h| h.head_dim),
            heads,
            hidden,
            rms_eps: md("attention.layer_norm_rms_epsilon")
                .and_then(|v| v.to_f32().map_err(Error::Candle))
                .unwrap_or(1e-5) as f64,
            rope_base,
            rope_scale,
            windows,
            rope_base_swa,
            rope_scale_swa,
            attn_softcap: family
                .attn_softcap
                .and_then(|d| cap("attn_logit_softcapping", Some(d))),
            final_softcap: cap("final_logit_softcapping", family.final_softcap),
            query_prescale,
            rope_attn_factor: f("rope.scaling.attn_factor")
                .filter(|a| a.is_finite() && *a > 0.0)
                .unwrap_or(1.0),
            rope_factors: rope_factors(ct, context_length, original_context),
            context_length,
            yarn,
            experts,
            delta,
            recurrent,
            rope_sections,
            kv_layer,
            per_layer_input,
            deepstack,
        };
        Ok((cfg, rope_dim))
    }
}

/// Which of a token's four positions (time, height, width, extra) turns RoPE pair `pair`
/// under M-RoPE's `sections`: with [`Mrope::Interleaved`] (ggml's `IMROPE`, Qwen3-VL and
/// Qwen3.5) pairs cycle through the time, height and width sections, each taking its turn
/// while it has pairs left, and fall to the extra position otherwise; with
/// [`Mrope::Sectioned`] (`MROPE`, Qwen2-VL and Qwen2.5-VL) each section is a run of pairs.
pub fn section_of(sections: [usize; 4], style: Mrope, pair: usize) -> usize {
    let all: usize = sections.iter().sum();
    let sector = pair % all.max(1);
    match style {
        Mrope::Interleaved => (0..3)
            .find(|&s| sector % 3 == s && sector < 3 * sections[s])
            .unwrap_or(3),
        Mrope::Sectioned => {
            let mut end = 0;
            (0..3)
                .find(|&s| {
                    end += sections[s];
                    sector < end
                })
                .unwrap_or(3)
        }
    }
}

/// Whether RoPE pair `pair` turns by a text token's position: a text token holds the extra
/// position at 0 and the others at its position.
pub fn text_turns(sections: [usize; 4], style: Mrope, pair: usize) -> bool {
    section_of(sections, style, pair) < 3
}

/// The RoPE frequency factors' tensor a file has, as llama.cpp picks it: `rope_freqs`, else the
/// long factors when the context is past the original one, else the short ones.
fn rope_factors(ct: &Header, context: usize, original: usize) -> Option<String> {
    let has = |n: &str| ct.tensor_infos.contains_key(n).then(|| n.to_string());
    has("rope_freqs.weight").or_else(|| match context > original {
        true => has("rope_factors_long.weight"),
        false => has("rope_factors_short.weight"),
    })
}

/// Which layers attend over a window, and its size: `attention.sliding_window`, and the
/// pattern (`attention.sliding_window_pattern`: a cycle length, or one flag per layer), as
/// llama.cpp reads them.
fn windows(ct: &Header, family: Family, n_layer: usize, path: &Path) -> Result<Vec<Option<usize>>> {
    let Some(sw) = family.sliding_window else {
        return Ok(vec![None; n_layer]);
    };
    let key = |k: &str| ct.metadata.get(&format!("{}.{k}", family.arch));
    let window = match key("attention.sliding_window") {
        Some(v) => v.to_u32().map(|w| w as usize).map_err(|e| {
            Error::model_file(
                path,
                format!("`attention.sliding_window`: {}", candle_message(&e)),
            )
        })?,
        None => match sw.default_window {
            Some(w) => w,
            None => return Ok(vec![None; n_layer]),
        },
    };
    if window == 0 {
        return Ok(vec![None; n_layer]);
    }
    let pattern = format!("{}.attention.sliding_window_pattern", family.arch);
    let flags: Vec<bool> = match layer_flags(ct, &pattern, n_layer, path)? {
        Some(flags) => flags,
        None => {
            let pattern = key("attention.sliding_window_pattern")
                .and_then(|v| v.to_u32().ok())
                .map_or(sw.pattern, |p| p as usize);
            // llama.cpp's `set_swa_pattern`: in each cycle, every layer but the last.
            (0..n_layer)
                .map(|il| pattern == 0 || il % pattern < pattern - 1)
                .collect()
        }
    };
    Ok(flags.into_iter().map(|w| w.then_some(window)).collect())
}

/// Longest context a model is loaded with when the caller sets no cap: the RoPE tables cover
/// every position, so a header claiming billions must not allocate them.
const MAX_CONTEXT: usize = 1 << 20;
