//! The forward pass's attention on candle's tensors (what runs on GPUs, and on candle's CPU
//! device when asked, to test that path): RoPE and mask tables per sequence, grouped-query
//! attention without copying K and V, soft-caps and windows as masks.

use candle_core::{Device, Tensor};

use super::family::RopeStyle;
use super::llama::{Layer, Llama};
use super::KvCache;
use crate::error::{Error, Result};

/// Additive causal mask for a chunk of `t` queries at positions `pos..pos+t` over the keys
/// kept from position `start` on, repeated for the `n_rep` query heads that share a KV head
/// (their rows are stacked, see `forward`). With a `window`, a query also skips the keys
/// `window` or more positions before it.
fn causal_mask(
    t: usize,
    (pos, start): (usize, usize),
    n_rep: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let total = pos + t;
    let w = window.unwrap_or(usize::MAX);
    let mut m = Vec::with_capacity(n_rep * t * (total - start));
    for _ in 0..n_rep {
        for i in 0..t {
            let at = pos + i;
            m.extend((start..total).map(|j| match j > at || at - j >= w {
                true => f32::NEG_INFINITY,
                false => 0.0,
            }));
        }
    }
    Ok(Tensor::from_vec(m, (n_rep * t, total - start), device)?)
}

impl Llama {
    /// For candle's attention, a sequence's `t` new rows after the positions its `cache`
    /// holds: the cos/sin rows of each RoPE table, and the mask of each layer's window and
    /// first kept key (`None` where a single query that sees every kept key needs none).
    pub(super) fn device_tables(&self, t: usize, cache: &KvCache) -> Result<DeviceTables> {
        let n_rep = self.cfg.n_head / self.cfg.n_kv_head;
        let pos = cache.len();
        let mut masks = Vec::new();
        for (li, w) in self.cfg.windows.iter().enumerate() {
            let key = (*w, cache.first_kept(li));
            if masks.iter().any(|(have, _)| *have == key) {
                continue;
            }
            let needed = t > 1 || w.is_some_and(|w| pos + 1 - key.1 > w);
            let mask = match needed {
                true => Some(causal_mask(t, (pos, key.1), n_rep, *w, &self.device)?),
                false => None,
            };
            masks.push((key, mask));
        }
        let ropes = self
            .ropes
            .iter()
            .map(|r| Ok((r.cos.narrow(0, pos, t)?, r.sin.narrow(0, pos, t)?)))
            .collect::<Result<_>>()?;
        Ok(DeviceTables { ropes, masks })
    }

    /// Attention through candle's tensors (GPU models): one layer, each sequence against its
    /// cache. Returns `[rows, n_head·head_dim]`.
    pub(super) fn attend_device(
        &self,
        li: usize,
        layer: &Layer,
        h: &Tensor,
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
        tables: &[DeviceTables],
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (n_head, n_kv, hd) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
        let n_rep = n_head / n_kv;
        let scale = match cfg.query_prescale {
            Some(s) => s as f64,
            None => 1.0 / (hd as f64).sqrt(),
        };
        let [mut q, mut k, mut v]: [Tensor; 3] = layer
            .qkv
            .forward(h)?
            .try_into()
            .map_err(|_| Error::Candle(candle_core::Error::Msg("q, k, v".into())))?;
        if let Some(b) = &layer.bias {
            q = q.broadcast_add(&b.q)?;
            k = k.broadcast_add(&b.k)?;
            v = v.broadcast_add(&b.v)?;
        }
        if let Some((qn, kn)) = &layer.qk_norm {
            let rows = q.dim(0)?;
            q = qn
                .forward(&q.reshape((rows, n_head, hd))?)?
                .reshape((rows, n_head * hd))?;
            k = kn
                .forward(&k.reshape((rows, n_kv, hd))?)?
                .reshape((rows, n_kv * hd))?;
        }
        let rotate = match cfg.family.rope {
            RopeStyle::Normal => candle_nn::rotary_emb::rope_i,
            RopeStyle::Neox => candle_nn::rotary_emb::rope,
        };
        let mut ys = Vec::with_capacity(batch.len());
        for (((_, cache), &(row, t)), tables) in batch.iter_mut().zip(spans).zip(tables) {
            let (cos, sin) = &tables.ropes[layer.rope];
            let key = (layer.window, cache.first_kept(li));
            let mask = tables
                .masks
                .iter()
                .find(|(have, _)| *have == key)
                .and_then(|(_, m)| m.as_ref());
            let heads = |m: &Tensor, n: usize| -> Result<Tensor> {
                Ok(m.narrow(0, row, t)?
                    .reshape((1, t, n, hd))?
                    .transpose(1, 2)?
                    .contiguous()?)
            };
            // RoPE on the first `rope_dim` dimensions of each head (all but in partial
            // rotary), the rest as they are.
            let rope = |x: Tensor| -> Result<Tensor> {
                if self.rope_dim == hd {
                    return Ok(rotate(&x, cos, sin)?);
                }
                let turned = rotate(&x.narrow(3, 0, self.rope_dim)?.contiguous()?, cos, sin)?;
                let kept = x.narrow(3, self.rope_dim, hd - self.rope_dim)?;
                Ok(Tensor::cat(&[&turned, &kept], 3)?.contiguous()?)
            };
            let qs = rope(heads(&q, n_head)?)?;
            let ks = rope(heads(&k, n_kv)?)?;
            let (ks, vs) = cache.append(li, &ks, &heads(&v, n_kv)?)?;
            // Grouped-query attention without copying K/V: the n_rep query heads that share
            // a KV head are consecutive, so [1, n_head, t, hd] is [1, n_kv, n_rep·t, hd].
            let qs = qs.reshape((1, n_kv, n_rep * t, hd))?;
            let mut att = (qs.matmul(&ks.t()?)? * scale)?;
            if let Some(c) = cfg.attn_softcap {
                att = ((att * (1.0 / c) as f64)?.tanh()? * c as f64)?;
            }
            let att = match mask {
                Some(m) => att.broadcast_add(m)?,
                None => att,
            };
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            ys.push(
                att.matmul(&vs)?
                    .reshape((1, n_head, t, hd))?
                    .transpose(1, 2)?
                    .reshape((t, n_head * hd))?,
            );
        }
        Ok(Tensor::cat(&ys, 0)?)
    }
}

/// A layer's window and the position of its first kept key: the layers alike share a mask.
type MaskKey = (Option<usize>, usize);

/// A sequence's RoPE rows (per table) and masks (per window and first kept key) for one step
/// on candle's path.
pub(super) struct DeviceTables {
    pub(super) ropes: Vec<(Tensor, Tensor)>,
    pub(super) masks: Vec<(MaskKey, Option<Tensor>)>,
}
