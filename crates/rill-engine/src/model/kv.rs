//! A sequence's KV cache: the keys and values of every layer for the positions it has run.
//! Each sequence brings its own, so one set of weights serves every conversation; memory is
//! reserved ahead by doubling, never grown by a copy per token. On the host (our attention) it
//! is `[position][kv head][head_dim]` in f16 per layer; on a GPU, candle tensors written with
//! `slice_set`.

use candle_core::{DType, Device, Tensor};
use half::{f16, slice::HalfFloatSliceExt};

use super::attention::LayerKv;
use super::config::LlamaConfig;
use crate::error::{Error, Result};

/// Positions a cache allocates at first; it doubles from there.
pub const KV_MIN_CAPACITY: usize = 256;

/// One sequence's keys and values for every layer, of which the first `len` positions are
/// filled. Memory is reserved ahead (doubling), never grown by a copy per token.
#[derive(Default)]
pub struct KvCache {
    store: Store,
    len: usize,
    capacity: usize,
    /// Floats per position in a host layer (`n_kv_head · head_dim`).
    width: usize,
}

enum Store {
    /// On the host, `[position][kv head][head_dim]` per layer: our attention appends and reads
    /// it in place (`attention.rs`).
    Host(Vec<LayerKv>),
    /// On a GPU, `[1, n_kv_head, capacity, head_dim]` tensors per layer, for candle's attention.
    Device(Vec<(Tensor, Tensor)>),
}

impl Default for Store {
    fn default() -> Self {
        Store::Host(Vec::new())
    }
}

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (capacity, not just what is filled).
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Host(layers) => layers
                .iter()
                .map(|l| (l.k.capacity() + l.v.capacity()) * std::mem::size_of::<f16>())
                .sum(),
            Store::Device(layers) => layers
                .iter()
                .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
                .sum(),
        }
    }

    /// Forgets positions from `len` on (the memory stays for reuse; a host layer drops them
    /// when it is next appended to).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A copy of the first `len` positions with room for a few more: for a preview, which must
    /// leave the kept cache it starts from as it was.
    pub fn copy_prefix(&self, len: usize) -> Result<KvCache> {
        let len = len.min(self.len);
        let capacity = len + 16;
        let store = match &self.store {
            Store::Host(layers) => Store::Host(
                layers
                    .iter()
                    .map(|l| {
                        let width = self.width;
                        let copy = |x: &[f16]| {
                            let mut c = Vec::with_capacity(capacity * width);
                            c.extend_from_slice(&x[..len * width]);
                            c
                        };
                        LayerKv {
                            k: copy(&l.k),
                            v: copy(&l.v),
                        }
                    })
                    .collect(),
            ),
            Store::Device(layers) => {
                let mut copies = Vec::with_capacity(layers.len());
                for (k, v) in layers {
                    let (b, h, _, d) = k.dims4()?;
                    let copy = |t: &Tensor| -> Result<Tensor> {
                        let out = Tensor::zeros((b, h, capacity, d), t.dtype(), t.device())?;
                        if len > 0 {
                            out.slice_set(&t.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                        }
                        Ok(out)
                    };
                    copies.push((copy(k)?, copy(v)?));
                }
                Store::Device(copies)
            }
        };
        Ok(KvCache {
            store,
            len,
            capacity,
            width: self.width,
        })
    }

    /// Makes room for `extra` more positions, doubling the capacity when it runs out.
    /// `host` picks the store our attention reads; else candle's tensors on `device`.
    pub(super) fn reserve(
        &mut self,
        cfg: &LlamaConfig,
        extra: usize,
        device: &Device,
        host: bool,
    ) -> Result<()> {
        let need = self.len + extra;
        let built = match &self.store {
            Store::Host(l) => host && l.len() == cfg.n_layer,
            Store::Device(l) => !host && l.len() == cfg.n_layer,
        };
        if need <= self.capacity && built {
            return Ok(());
        }
        if !built {
            // A new cache (or, defensively, one built for another model): nothing to keep.
            self.len = 0;
            self.capacity = 0;
        }
        let cap = need
            .max(self.capacity * 2)
            .max(KV_MIN_CAPACITY)
            .min(cfg.context_length.max(need));
        if host {
            let width = cfg.n_kv_head * cfg.head_dim;
            self.width = width;
            if !built {
                self.store = Store::Host((0..cfg.n_layer).map(|_| LayerKv::default()).collect());
            }
            if let Store::Host(layers) = &mut self.store {
                for l in layers {
                    l.k.truncate(self.len * width);
                    l.v.truncate(self.len * width);
                    // Exact, so the doubling above (not Vec's own) decides the memory.
                    l.k.reserve_exact((cap - self.len) * width);
                    l.v.reserve_exact((cap - self.len) * width);
                }
            }
        } else {
            let shape = (1, cfg.n_kv_head, cap, cfg.head_dim);
            let old = match std::mem::take(&mut self.store) {
                Store::Device(old) => old,
                Store::Host(_) => Vec::new(),
            };
            let mut layers = Vec::with_capacity(cfg.n_layer);
            for i in 0..cfg.n_layer {
                let k = Tensor::zeros(shape, DType::F32, device)?;
                let v = Tensor::zeros(shape, DType::F32, device)?;
                if let Some((ok, ov)) = old.get(i) {
                    if self.len > 0 {
                        k.slice_set(&ok.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                        v.slice_set(&ov.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                    }
                }
                layers.push((k, v));
            }
            self.store = Store::Device(layers);
        }
        self.capacity = cap;
        Ok(())
    }

    /// Appends one new position's keys and values (`width` floats each) to host `layer`, after
    /// the filled positions and whatever earlier rows of this step appended.
    /// They are kept in f16, as llama.cpp keeps them: half the memory and half the reads per
    /// step, and the values still carry 11 significant bits.
    pub(super) fn push_host(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        let at = (self.len + row) * self.width;
        if let Store::Host(layers) = &mut self.store {
            let l = &mut layers[layer];
            l.k.truncate(at);
            l.v.truncate(at);
            for (cache, new) in [(&mut l.k, k), (&mut l.v, v)] {
                cache.resize(at + new.len(), f16::ZERO);
                cache[at..].convert_from_f32_slice(new);
            }
        }
    }

    /// Host `layer`'s keys and values (filled positions and this step's rows).
    pub(super) fn host_layer(&self, layer: usize) -> Option<&LayerKv> {
        match &self.store {
            Store::Host(layers) => layers.get(layer),
            Store::Device(_) => None,
        }
    }

    /// Writes the new keys/values of `layer` after the filled positions and returns views of
    /// everything so far (GPU store). [`KvCache::advance`] commits the positions once every
    /// layer is done.
    pub(super) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let Store::Device(layers) = &self.store else {
            return Err(Error::Candle(candle_core::Error::Msg(
                "a host KV cache on a GPU model".into(),
            )));
        };
        let (ck, cv) = &layers[layer];
        let t = k.dim(2)?;
        ck.slice_set(k, 2, self.len)?;
        cv.slice_set(v, 2, self.len)?;
        Ok((
            ck.narrow(2, 0, self.len + t)?,
            cv.narrow(2, 0, self.len + t)?,
        ))
    }

    pub(super) fn advance(&mut self, t: usize) {
        self.len += t;
    }
}
