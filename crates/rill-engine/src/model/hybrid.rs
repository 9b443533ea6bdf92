//! A hybrid model's recurrent layers as its file describes them (Qwen3.5): the Gated DeltaNet
//! sizes (`ssm.*`) and which layers are recurrent, read as llama.cpp reads them and checked so
//! that a crafted header cannot size a state beyond bounds.

use std::path::Path;

use super::family::Family;
use crate::error::{candle_message, Error, Result};
use crate::gguf::Header;

/// A Gated DeltaNet layer's sizes (llama.cpp's `ssm.*` keys): `k_heads` key (and query)
/// heads and `v_heads` value heads, all `head` wide, a causal convolution of `conv_kernel`
/// taps over the queries, keys and values, and a `head × head` state per value head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaConfig {
    /// `ssm.conv_kernel`.
    pub conv_kernel: usize,
    /// `ssm.state_size`: a head's width.
    pub head: usize,
    /// `ssm.group_count`.
    pub k_heads: usize,
    /// `ssm.time_step_rank`.
    pub v_heads: usize,
}

impl DeltaConfig {
    /// The queries' (or keys') width.
    pub fn key_width(&self) -> usize {
        self.k_heads * self.head
    }

    /// The values' width (and the gate's, and the output's).
    pub fn value_width(&self) -> usize {
        self.v_heads * self.head
    }

    /// The convolution's channels: queries, keys, values.
    pub fn conv_width(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Floats of a layer's recurrent state: the convolution's last `conv_kernel − 1` inputs
    /// and each value head's `head × head` matrix.
    pub fn state_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_width() + self.v_heads * self.head * self.head
    }
}

/// The most floats a Gated DeltaNet layer's state may take (1 GiB): a header that claims
/// more is refused rather than allocated.
const MAX_STATE_FLOATS: usize = 1 << 28;

/// A hybrid family's Gated DeltaNet sizes and which of the `n_layer` layers are recurrent
/// (of `blocks`, the prediction layers included): `attention.recurrent_layers` (a flag per
/// block) where the file lists them, else every layer but each `full_attention_interval`-th
/// (4 without the key), as llama.cpp reads them. Every size is checked, so a crafted header
/// cannot make a state of unbounded size.
pub(super) fn hybrid(
    ct: &Header,
    family: Family,
    blocks: usize,
    n_layer: usize,
    path: &Path,
) -> Result<(Option<DeltaConfig>, Vec<bool>)> {
    if !family.delta_net {
        return Ok((None, vec![false; n_layer]));
    }
    let arch = family.arch;
    let get = |key: &str| ct.metadata.get(&format!("{arch}.{key}"));
    let u = |key: &str| -> Result<usize> {
        get(key)
            .ok_or_else(|| Error::model_file(path, format!("metadata `{arch}.{key}` is missing")))?
            .to_u32()
            .map(|v| v as usize)
            .map_err(|e| Error::model_file(path, format!("`{arch}.{key}`: {}", candle_message(&e))))
    };
    let d = DeltaConfig {
        conv_kernel: u("ssm.conv_kernel")?,
        head: u("ssm.state_size")?,
        k_heads: u("ssm.group_count")?,
        v_heads: u("ssm.time_step_rank")?,
    };
    let inner = u("ssm.inner_size")?;
    let sane = (1..=16).contains(&d.conv_kernel)
        && (1..=1024).contains(&d.head)
        && (1..=1024).contains(&d.k_heads)
        && (1..=1024).contains(&d.v_heads)
        && d.v_heads.is_multiple_of(d.k_heads)
        && d.state_floats() <= MAX_STATE_FLOATS;
    if !sane || inner != d.value_width() {
        return Err(Error::model_file(
            path,
            format!(
                "Gated DeltaNet sizes Rill cannot run: a convolution of {} taps, {} key and {} \
                 value heads {} wide, inner width {inner} (value heads must be a multiple of \
                 key heads, and as wide)",
                d.conv_kernel, d.k_heads, d.v_heads, d.head
            ),
        ));
    }
    let listed = layer_flags(
        ct,
        &format!("{arch}.attention.recurrent_layers"),
        blocks,
        path,
    )?;
    let recurrent: Vec<bool> = match listed {
        Some(flags) => flags.into_iter().take(n_layer).collect(),
        _ => {
            let every = match get("full_attention_interval") {
                Some(_) => u("full_attention_interval")?,
                None => 4,
            };
            if every == 0 {
                return Err(Error::model_file(path, "a full-attention interval of 0"));
            }
            (0..n_layer).map(|i| (i + 1) % every != 0).collect()
        }
    };
    Ok((Some(d), recurrent))
}

/// A flag per layer that metadata `key` lists (an array of `count` booleans), `None` where it
/// is not an array.
pub(super) fn layer_flags(
    ct: &Header,
    key: &str,
    count: usize,
    path: &Path,
) -> Result<Option<Vec<bool>>> {
    let Some(candle_core::quantized::gguf_file::Value::Array(items)) = ct.metadata.get(key) else {
        return Ok(None);
    };
    if items.len() != count {
        return Err(Error::model_file(
            path,
            format!("`{key}` has {} flags for {count} layers", items.len()),
        ));
    }
    Ok(Some(
        items.iter().map(|v| v.to_bool().unwrap_or(false)).collect(),
    ))
}
