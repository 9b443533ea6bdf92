//! A llama-family model's hyper-parameters, read from the GGUF metadata (`llama.*`) and checked
//! against each other and against every weight's shape before any weight is loaded, so a file
//! whose header disagrees with its tensors fails at load with a message naming the tensor
//! (issue 13), never with an index out of bounds on the first token.

use std::path::Path;

use candle_core::quantized::gguf_file;

use super::family::Family;
use crate::error::{candle_message, Error, Result};

/// Hyper-parameters read from the GGUF metadata (`<arch>.*`), and the family's description.
#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub family: Family,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub rms_eps: f64,
    pub rope_base: f32,
    /// Positions the model can attend over in this engine (the trained context, possibly capped).
    pub context_length: usize,
}

impl LlamaConfig {
    /// The hyper-parameters of a llama-family GGUF and its RoPE width, checked against each
    /// other and against every weight's shape (nothing is loaded).
    pub(crate) fn read(
        ct: &gguf_file::Content,
        family: Family,
        context_cap: Option<usize>,
        path: &Path,
    ) -> Result<(LlamaConfig, usize)> {
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
        let n_layer = u("block_count")?;
        check_shapes(
            ct,
            path,
            family,
            n_layer,
            Widths {
                hidden,
                q: n_head * head_dim,
                kv: n_kv_head * head_dim,
                head: head_dim,
            },
        )?;
        let cfg = LlamaConfig {
            family,
            n_layer,
            n_head,
            n_kv_head,
            head_dim,
            hidden,
            rms_eps: md("attention.layer_norm_rms_epsilon")
                .and_then(|v| v.to_f32().map_err(Error::Candle))
                .unwrap_or(1e-5) as f64,
            rope_base: md("rope.freq_base")
                .and_then(|v| v.to_f32().map_err(Error::Candle))
                .unwrap_or(10_000.0),
            context_length,
        };
        Ok((cfg, rope_dim))
    }
}

/// The widths a layer's tensors follow.
#[derive(Clone, Copy)]
struct Widths {
    hidden: usize,
    /// Of all query heads (`n_head · head_dim`).
    q: usize,
    /// Of all key (or value) heads.
    kv: usize,
    head: usize,
}

/// Checks every weight's shape against the metadata before anything is loaded, so a file whose
/// header disagrees with its tensors (a wrong head count, a truncated layer) fails here with a
/// message, not with an index out of bounds on the first forward pass (issue 13). Shapes are
/// candle's: `[rows, columns]`, a linear layer being `[out, in]`.
fn check_shapes(
    ct: &gguf_file::Content,
    path: &Path,
    family: Family,
    n_layer: usize,
    widths: Widths,
) -> Result<()> {
    let Widths {
        hidden,
        q: q_width,
        kv: kv_width,
        head,
    } = widths;
    let dims = |name: &str| -> Result<&[usize]> {
        ct.tensor_infos
            .get(name)
            .map(|t| t.shape.dims())
            .ok_or_else(|| Error::model_file(path, format!("tensor `{name}` is missing")))
    };
    let expect = |name: &str, want: &[usize]| -> Result<()> {
        let got = dims(name)?;
        if got == want {
            return Ok(());
        }
        Err(Error::model_file(
            path,
            format!(
                "tensor `{name}` has shape {got:?}, but the metadata (width {hidden}, \
                 query width {q_width}, key/value width {kv_width}) needs {want:?}"
            ),
        ))
    };
    let vocab = match dims("token_embd.weight")? {
        [v, h] if *v > 0 && *h == hidden => *v,
        other => {
            return Err(Error::model_file(
                path,
                format!("tensor `token_embd.weight` has shape {other:?}; the width is {hidden}"),
            ))
        }
    };
    if ct.tensor_infos.contains_key("output.weight") {
        expect("output.weight", &[vocab, hidden])?;
    }
    expect("output_norm.weight", &[hidden])?;
    if n_layer == 0 {
        return Err(Error::model_file(path, "the model has no layers"));
    }
    for i in 0..n_layer {
        let name = |n: &str| format!("blk.{i}.{n}.weight");
        expect(&name("attn_norm"), &[hidden])?;
        expect(&name("ffn_norm"), &[hidden])?;
        expect(&name("attn_q"), &[q_width, hidden])?;
        expect(&name("attn_k"), &[kv_width, hidden])?;
        expect(&name("attn_v"), &[kv_width, hidden])?;
        expect(&name("attn_output"), &[hidden, q_width])?;
        if family.qkv_bias {
            let bias = |n: &str| format!("blk.{i}.{n}.bias");
            expect(&bias("attn_q"), &[q_width])?;
            expect(&bias("attn_k"), &[kv_width])?;
            expect(&bias("attn_v"), &[kv_width])?;
        }
        if family.qk_norm {
            expect(&name("attn_q_norm"), &[head])?;
            expect(&name("attn_k_norm"), &[head])?;
        }
        let ff = match dims(&name("ffn_gate"))? {
            [ff, h] if *ff > 0 && *h == hidden => *ff,
            other => {
                return Err(Error::model_file(
                    path,
                    format!(
                        "tensor `{}` has shape {other:?}; the width is {hidden}",
                        name("ffn_gate")
                    ),
                ))
            }
        };
        expect(&name("ffn_up"), &[ff, hidden])?;
        expect(&name("ffn_down"), &[hidden, ff])?;
    }
    Ok(())
}

/// Longest context a model is loaded with when the caller sets no cap: the RoPE tables cover
/// every position, so a header claiming billions must not allocate them.
const MAX_CONTEXT: usize = 1 << 20;
