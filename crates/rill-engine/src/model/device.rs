//! The decoder's block on candle's tensors: what runs on GPUs, and on candle's CPU device when
//! asked (`Compute::Candle`), to test that path against ours. RoPE and mask tables per
//! sequence, made once per step; grouped-query attention without copying K and V; soft-caps
//! and windows as masks.

use candle_core::{DType, Device, Tensor};

use super::backend::{Attention, Backend, Parts};
use super::delta::DeltaNet;
use super::experts::Experts;
use super::family::{Activation, RopeStyle};
use super::kv::KvCache;
use super::parts::{Bias, Group, Linear, Norm, PerLayerInputs, PerLayerStep, SharedExpert};
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

/// One forward pass on candle's tensors, with each sequence's tables for this step.
pub(super) struct OnDevice<'a> {
    d: Parts<'a>,
    tables: Vec<DeviceTables>,
}

impl<'a> OnDevice<'a> {
    pub(super) fn new(d: Parts<'a>, batch: &[(&[u32], &mut KvCache)]) -> Result<Self> {
        let tables = batch
            .iter()
            .map(|(tokens, cache)| device_tables(&d, tokens.len(), cache))
            .collect::<Result<Vec<_>>>()?;
        Ok(OnDevice { d, tables })
    }
}

/// For candle's attention, a sequence's `t` new rows after the positions its `cache` holds:
/// the cos/sin rows of each RoPE table, and the mask of each layer's window and first kept key
/// (`None` where a single query that sees every kept key needs none).
fn device_tables(d: &Parts<'_>, t: usize, cache: &KvCache) -> Result<DeviceTables> {
    let n_rep = d.cfg.n_head / d.cfg.n_kv_head;
    let pos = cache.len();
    let mut masks = Vec::new();
    for (li, w) in d.cfg.windows.iter().enumerate() {
        let key = (*w, cache.first_kept(li));
        if masks.iter().any(|(have, _)| *have == key) {
            continue;
        }
        let needed = t > 1 || w.is_some_and(|w| pos + 1 - key.1 > w);
        let mask = match needed {
            true => Some(causal_mask(t, (pos, key.1), n_rep, *w, d.device)?),
            false => None,
        };
        masks.push((key, mask));
    }
    let ropes = d
        .ropes
        .iter()
        .map(|r| Ok((r.cos.narrow(0, pos, t)?, r.sin.narrow(0, pos, t)?)))
        .collect::<Result<_>>()?;
    Ok(DeviceTables { ropes, masks })
}

fn parts<const N: usize>(v: Vec<Tensor>, what: &str) -> Result<[Tensor; N]> {
    v.try_into()
        .map_err(|_| Error::Candle(candle_core::Error::Msg(what.into())))
}

impl Backend for OnDevice<'_> {
    type Rows = Tensor;
    type Qkv = [Tensor; 3];

    fn embed(&mut self, x: Tensor, scale: Option<f32>) -> Result<Tensor> {
        Ok(match scale {
            Some(s) => (x * s as f64)?,
            None => x,
        })
    }

    fn inject(&mut self, _x: &mut Tensor, _row: usize, _values: &[f32], _add: bool) -> Result<()> {
        // `Decoder::forward_rows_with` refuses images before a device step is made.
        Err(Error::param("image", "images run on the CPU for now"))
    }

    fn norm(&mut self, norm: &Norm, x: &Tensor) -> Result<Tensor> {
        norm.forward(x)
    }

    fn renorm(&mut self, norm: &Norm, y: &mut Tensor) -> Result<()> {
        *y = norm.forward(y)?;
        Ok(())
    }

    fn linear(&mut self, w: &Linear, x: Tensor) -> Result<Tensor> {
        w.forward(&x)
    }

    fn add_bias(&mut self, y: &mut Tensor, bias: &[f32]) -> Result<()> {
        let b = Tensor::from_slice(bias, (1, bias.len()), y.device())?.to_dtype(y.dtype())?;
        *y = y.broadcast_add(&b)?;
        Ok(())
    }

    fn residual(&mut self, x: &mut Tensor, y: Tensor) -> Result<()> {
        *x = (&*x + y)?;
        Ok(())
    }

    fn qkv(&mut self, w: &Group, h: Tensor) -> Result<[Tensor; 3]> {
        parts(w.forward(&h)?, "q, k, v")
    }

    fn qkv_bias(&mut self, [q, k, v]: &mut [Tensor; 3], bias: &Bias) -> Result<()> {
        *q = q.broadcast_add(&bias.q)?;
        *k = k.broadcast_add(&bias.k)?;
        *v = v.broadcast_add(&bias.v)?;
        Ok(())
    }

    fn qk_norm(
        &mut self,
        [q, k, _]: &mut [Tensor; 3],
        layer: usize,
        qn: &Norm,
        kn: Option<&Norm>,
    ) -> Result<()> {
        let h = self.d.cfg.heads[layer];
        let (n_head, n_kv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
        let rows = q.dim(0)?;
        *q = qn
            .forward(&q.reshape((rows, n_head, hd))?)?
            .reshape((rows, n_head * hd))?;
        if let Some(kn) = kn {
            *k = kn
                .forward(&k.reshape((rows, n_kv, hd))?)?
                .reshape((rows, n_kv * hd))?;
        }
        Ok(())
    }

    /// Each sequence against its cache; `how.f16_weights` has no step here (candle's
    /// arithmetic is f32 throughout).
    fn attend(
        &mut self,
        how: &Attention<'_>,
        [q, k, v]: [Tensor; 3],
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
    ) -> Result<Tensor> {
        // `family::Family::host_only` refuses such models off the CPU when they load.
        if how.sinks.is_some() {
            return Err(Error::param(
                "device",
                "attention sinks run on the CPU only",
            ));
        }
        if how.kv_layer != how.layer {
            return Err(Error::param(
                "device",
                "layers that share keys and values run on the CPU only",
            ));
        }
        let h = self.d.cfg.heads[how.layer];
        let (n_head, n_kv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
        let n_rep = n_head / n_kv;
        let scale = match how.prescale {
            Some(s) => s as f64,
            None => 1.0 / (hd as f64).sqrt(),
        };
        let rotate = match how.rope_style {
            RopeStyle::Normal => candle_nn::rotary_emb::rope_i,
            RopeStyle::Neox => candle_nn::rotary_emb::rope,
        };
        let mut ys = Vec::with_capacity(batch.len());
        for (((_, cache), &(row, t)), tables) in batch.iter_mut().zip(spans).zip(&self.tables) {
            let (cos, sin) = &tables.ropes[how.rope];
            let key = (how.window, cache.first_kept(how.layer));
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
                if how.rope_dim == hd {
                    return Ok(rotate(&x, cos, sin)?);
                }
                let turned = rotate(&x.narrow(3, 0, how.rope_dim)?.contiguous()?, cos, sin)?;
                let kept = x.narrow(3, how.rope_dim, hd - how.rope_dim)?;
                Ok(Tensor::cat(&[&turned, &kept], 3)?.contiguous()?)
            };
            let qs = rope(heads(&q, n_head)?)?;
            let ks = rope(heads(&k, n_kv)?)?;
            let (ks, vs) = cache.append(how.layer, &ks, &heads(&v, n_kv)?)?;
            // Grouped-query attention without copying K/V: the n_rep query heads that share
            // a KV head are consecutive, so [1, n_head, t, hd] is [1, n_kv, n_rep·t, hd].
            let qs = qs.reshape((1, n_kv, n_rep * t, hd))?;
            let mut att = (qs.matmul(&ks.t()?)? * scale)?;
            if let Some(c) = how.softcap {
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

    fn dense(
        &mut self,
        gate_up: &Group,
        down: &Linear,
        act: Activation,
        h: Tensor,
    ) -> Result<Tensor> {
        let [gate, up] = parts(gate_up.forward(&h)?, "gate, up")?;
        let gate = match act {
            Activation::Silu => gate.silu()?,
            // candle's `gelu` is the tanh approximation.
            Activation::GeluTanh => gate.gelu()?,
            // `family::Family::host_only` refuses such a model off the CPU when it loads.
            Activation::SwigluOai => {
                return Err(Error::param(
                    "device",
                    "the clamped SwiGLU runs on the CPU only",
                ))
            }
        };
        down.forward(&(gate * up)?)
    }

    fn experts(
        &mut self,
        experts: &Experts,
        h: Tensor,
        route_by: Option<Tensor>,
    ) -> Result<Tensor> {
        experts.forward(&h, route_by.as_ref())
    }

    fn shared_expert(&mut self, s: &SharedExpert, h: Tensor) -> Result<Tensor> {
        let gate =
            Tensor::from_slice(&s.gate, (s.gate.len(), 1), h.device())?.to_dtype(h.dtype())?;
        let scale = candle_nn::ops::sigmoid(&h.matmul(&gate)?)?;
        let y = self.dense(&s.gate_up, &s.down, Activation::Silu, h)?;
        Ok(y.broadcast_mul(&scale)?)
    }

    fn keys_as_values(&mut self, [_, k, v]: &mut [Tensor; 3], _: usize) -> Result<()> {
        *v = k.clone();
        Ok(())
    }

    fn v_norm(&mut self, [_, _, v]: &mut [Tensor; 3], layer: usize) -> Result<()> {
        let (h, eps) = (self.d.cfg.heads[layer], self.d.cfg.rms_eps);
        let rows = v.dim(0)?;
        let heads = v.reshape((rows, h.n_kv_head, h.head_dim))?;
        let mean = heads.sqr()?.mean_keepdim(2)?;
        let normed = heads.broadcast_div(&(mean + eps)?.sqrt()?)?;
        *v = normed.reshape((rows, h.kv_width()))?;
        Ok(())
    }

    fn per_layer_inputs(&mut self, _: &PerLayerInputs, _: &Tensor, _: Tensor) -> Result<Tensor> {
        // `family::Family::host_only` refuses Gemma 4 off the CPU when it loads.
        Err(Error::param(
            "device",
            "per-layer embeddings run on the CPU only",
        ))
    }

    fn per_layer(&mut self, _: &PerLayerStep, _: usize, _: &Tensor, _: &mut Tensor) -> Result<()> {
        Err(Error::param(
            "device",
            "per-layer embeddings run on the CPU only",
        ))
    }

    fn scale(&mut self, x: &mut Tensor, s: f32) -> Result<()> {
        *x = (&*x * s as f64)?;
        Ok(())
    }

    fn split_gate(&mut self, [q, _, _]: &mut [Tensor; 3], layer: usize) -> Result<Tensor> {
        let hd = self.d.cfg.heads[layer].head_dim;
        let (rows, width) = q.dims2()?;
        let heads = q.reshape((rows, width / (2 * hd), 2 * hd))?;
        let half = |from: usize| -> Result<Tensor> {
            Ok(heads
                .narrow(2, from, hd)?
                .contiguous()?
                .reshape((rows, width / 2))?)
        };
        let gate = half(hd)?;
        *q = half(0)?;
        Ok(gate)
    }

    fn gate(&mut self, y: &mut Tensor, gate: Tensor) -> Result<()> {
        *y = (&*y * candle_nn::ops::sigmoid(&gate)?)?;
        Ok(())
    }

    /// Refused at load (`Family::host_only`): no model reaches it.
    fn delta_net(
        &mut self,
        _: &Group,
        _: &DeltaNet,
        _: usize,
        _: Tensor,
        _: &mut [(&[u32], &mut KvCache)],
        _: &[(usize, usize)],
    ) -> Result<Tensor> {
        Err(Error::Candle(candle_core::Error::Msg(
            "Gated DeltaNet layers run on the CPU only".into(),
        )))
    }

    fn logits(
        &mut self,
        x: Tensor,
        rows: &[usize],
        norm: &Norm,
        output: &Linear,
        softcap: Option<f32>,
    ) -> Result<Vec<f32>> {
        let rows: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let last = x.index_select(&Tensor::new(rows.as_slice(), x.device())?, 0)?;
        let mut logits = output
            .forward(&norm.forward(&last)?)?
            .to_dtype(DType::F32)?;
        if let Some(c) = softcap {
            logits = ((logits * (1.0 / c) as f64)?.tanh()? * c as f64)?;
        }
        Ok(logits.flatten_all()?.to_vec1()?)
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
