//! Each layer's attention heads: how many query and key/value heads, how wide, and how many of
//! their dimensions RoPE turns. Most families have one shape for every layer; Gemma 4's
//! windowed layers have heads of their own width (`attention.key_length_swa`,
//! `rope.dimension_count_swa`) and its global layers fewer key/value heads (a per-layer
//! `attention.head_count_kv` array), as llama.cpp reads them (`llama-model.cpp`, `gemma4.cpp`).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use super::family::Family;
use crate::error::{Error, Result};
use crate::gguf::Header;

/// One layer's attention heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub n_head: usize,
    pub n_kv_head: usize,
    /// Each head's width (keys and values alike).
    pub head_dim: usize,
    /// The dimensions of each head that RoPE turns (the first).
    pub rope_dim: usize,
}

impl Heads {
    /// The queries' width.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The keys' (or values') width: floats per position in the layer's KV cache.
    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// A head count of layer `layer`: metadata `key` as one number for every layer, or an array of
/// one per layer (of `count`); `default` without the key.
fn count(ct: &Header, key: &str, layer: usize, count: usize, default: usize) -> Option<usize> {
    // Writers store the numbers as u32 or i32.
    let number = |v: &Value| match v.to_u32() {
        Ok(n) => Some(n as usize),
        Err(_) => v.to_i32().ok().and_then(|n| usize::try_from(n).ok()),
    };
    match ct.metadata.get(key) {
        None => Some(default),
        Some(Value::Array(items)) if items.len() == count => items.get(layer).and_then(number),
        Some(Value::Array(_)) => None,
        Some(v) => number(v),
    }
}

/// Every layer's heads: `global`'s shape (the model's `head_count`, `head_count_kv`,
/// `key_length` and `rope.dimension_count`), with per-layer head counts where the file lists
/// them, and where the family has windowed layers of their own width (`windows[i]` set), those
/// layers' `key_length_swa` and `rope.dimension_count_swa`. Each is checked: heads that divide
/// evenly, RoPE over an even number of dimensions no wider than a head.
pub(super) fn per_layer(
    ct: &Header,
    family: &Family,
    global: Heads,
    windows: &[Option<usize>],
    path: &Path,
) -> Result<Vec<Heads>> {
    let arch = family.arch;
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str, default: usize| -> usize {
        ct.metadata
            .get(&key(k))
            .and_then(|v| v.to_u32().ok())
            .map_or(default, |v| v as usize)
    };
    let (swa_dim, swa_rope) = match family.swa_heads {
        true => {
            let dim = u("attention.key_length_swa", global.head_dim);
            (dim, u("rope.dimension_count_swa", dim.min(global.rope_dim)))
        }
        false => (global.head_dim, global.rope_dim),
    };
    let n = windows.len();
    (0..n)
        .map(|i| {
            let heads = |k: &str, default: usize| {
                count(ct, &key(k), i, n, default).ok_or_else(|| {
                    Error::model_file(
                        path,
                        format!("`{arch}.{k}` does not give layer {i}'s heads"),
                    )
                })
            };
            let n_head = heads("attention.head_count", global.n_head)?;
            let n_kv_head = heads("attention.head_count_kv", n_head)?;
            let (head_dim, rope_dim) = match windows[i] {
                Some(_) => (swa_dim, swa_rope),
                None => (global.head_dim, global.rope_dim),
            };
            let h = Heads {
                n_head,
                n_kv_head,
                head_dim,
                rope_dim,
            };
            let even = n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0;
            if !even || head_dim == 0 || rope_dim == 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
                return Err(Error::model_file(
                    path,
                    format!(
                        "layer {i}: {n_head} heads and {n_kv_head} key/value heads {head_dim} \
                         wide, RoPE over {rope_dim}: Rill needs heads that divide evenly and \
                         RoPE over an even number of dimensions no wider than a head"
                    ),
                ));
            }
            Ok(h)
        })
        .collect()
}

/// Per layer, the layer whose keys and values its queries read: itself, but where the file has
/// `attention.shared_kv_layers` (Gemma 4's E2B and E4B), whose last that many layers compute
/// queries only and read the cache of a layer before them, as llama.cpp's `gemma4` picks it
/// (`n_layer_kv_from_start`). Checked: the layer read has the same window and heads.
pub(super) fn kv_layers(
    ct: &Header,
    family: &Family,
    heads: &[Heads],
    windows: &[Option<usize>],
    path: &Path,
) -> Result<Vec<usize>> {
    let n = heads.len().min(windows.len());
    let key = format!("{}.attention.shared_kv_layers", family.arch);
    let shared = match (family.swa_heads, ct.metadata.get(&key)) {
        (true, Some(v)) => v.to_u32().map_or(usize::MAX, |v| v as usize),
        _ => 0,
    };
    if shared == 0 {
        return Ok((0..n).collect());
    }
    let own = n
        .checked_sub(shared)
        .filter(|own| *own >= 2)
        .ok_or_else(|| {
            Error::model_file(
                path,
                format!("`{key}` is {shared} of {n} layers: at least two must keep their own keys"),
            )
        })?;
    (0..n)
        .map(|i| {
            if i < own {
                return Ok(i);
            }
            // llama.cpp reads layer `own − 2` for a windowed layer, `own − 1` for a global one
            // (a real file's pattern puts the last of each kind there).
            let from = own - if windows[i].is_some() { 2 } else { 1 };
            let same = windows[from] == windows[i]
                && heads[from].head_dim == heads[i].head_dim
                && heads[from].n_kv_head == heads[i].n_kv_head;
            match same {
                true => Ok(from),
                false => Err(Error::model_file(
                    path,
                    format!(
                        "layer {i} would read layer {from}'s keys and values, whose window or \
                         heads differ from its own"
                    ),
                )),
            }
        })
        .collect()
}
