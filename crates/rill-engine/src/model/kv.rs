//! A sequence's KV cache: the keys and values of every layer for the positions it has run.
//! Each sequence brings its own, so one set of weights serves every conversation; memory is
//! reserved ahead by doubling, never grown by a copy per token. On the host (our attention) it
//! is `[position][kv head][head_dim]` per layer, in f16 or 8-bit (`kv_rows.rs`); on a GPU,
//! candle tensors written with `slice_set`.
//!
//! A layer that attends over a sliding window (Gemma's local layers) keeps only the rows its
//! window can still see, plus [`KV_ROLLBACK`] positions so that the cache can be cut back a
//! little (a next turn re-renders an answer's last tokens; a speculative draft is rejected),
//! plus a slack of a quarter window, so that its rows slide down once in a while rather than
//! at every step. A long Gemma 3 conversation thus costs its global layers' keys, not every
//! layer's. What a window drops is gone: cutting the cache back further than its rows reach
//! (prefix reuse from an earlier point of a conversation) goes to the
//! [`checkpoint`](KvCache::checkpoint) taken when the prompt was in, or else to nothing
//! ([`KvCache::reachable`]).
//!
//! A recurrent layer (Gated DeltaNet) keeps no rows but a state, and copies of it at a few
//! positions (`recurrent.rs`): the cache can be cut back to one of those, and the tokens after
//! it run again.

use candle_core::{DType, Device, Tensor};

use super::attention::LayerKv;
use super::config::DecoderConfig;
use super::kv_rows::KvType;
use super::recurrent::Recurrent;
use crate::error::{Error, Result};

/// Positions a cache allocates at first; it doubles from there.
pub const KV_MIN_CAPACITY: usize = 256;

/// Positions a windowed layer keeps beyond its window, so that the cache can be cut back by
/// this many without losing what the next query must see.
pub const KV_ROLLBACK: usize = 64;

/// Positions a windowed layer lets pile up before its rows slide down (a copy of the window):
/// a quarter window, so the copy costs a few percent of the steps it spans.
fn slide(window: usize) -> usize {
    (window / 4).max(64)
}

/// The first position a layer of `window` keeps once `len` positions are in: the next query's
/// window and [`KV_ROLLBACK`] before it.
fn keep_from(len: usize, window: usize) -> usize {
    (len + 1).saturating_sub(window + KV_ROLLBACK)
}

/// Whether rows from position `start` on hold the whole window of a query at position `len`.
fn reaches(start: usize, len: usize, window: usize) -> bool {
    start <= (len + 1).saturating_sub(window)
}

/// The most positions a layer of `window` holds between steps: the window, the rollback and
/// the slack.
fn most_kept(window: usize) -> usize {
    window + KV_ROLLBACK + slide(window)
}

/// Positions a layer needs room for, from its first row, before a step of `extra` rows: the
/// cache's capacity for a full layer; for a windowed one, what it holds and the step, and no
/// more than [`most_kept`] and the step otherwise.
fn room_for(window: Option<usize>, stored: usize, extra: usize, capacity: usize) -> usize {
    match window {
        None => capacity,
        Some(w) => (stored + extra).max(capacity.min(most_kept(w) + extra)),
    }
}

/// Bytes of KV cache `positions` positions take when each costs `per_position(layer)` bytes in
/// a layer: every position in a full layer, at most [`most_kept`] in a windowed one, none in a
/// recurrent one (whose state the caller counts).
pub fn kv_bytes(
    cfg: &DecoderConfig,
    positions: usize,
    per_position: impl Fn(usize) -> usize,
) -> usize {
    (0..cfg.n_layer)
        .filter(|&i| !cfg.recurrent[i])
        .map(|i| {
            let kept = cfg.windows[i].map_or(positions, |w| positions.min(most_kept(w)));
            kept * per_position(i)
        })
        .sum()
}

/// One sequence's keys and values for every layer, of which the first `len` positions are
/// filled (a windowed layer holds the last of them, from its own first row). Memory is
/// reserved ahead (doubling), never grown by a copy per token.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Rows>,
    len: usize,
    /// Positions the full layers have room for.
    capacity: usize,
    /// Floats per position in each layer (its `n_kv_head · head_dim`; 0 where it reads
    /// another's: `DecoderConfig::kv_width`).
    widths: Vec<usize>,
    /// Each layer's window (`None`: it attends over every position).
    windows: Vec<Option<usize>>,
    /// The windowed layers' rows at a length (when the prompt was in): what lets the cache be
    /// cut back to the prompt after its rows slid past it.
    checkpoint: Option<(usize, Vec<(usize, Rows)>)>,
    /// The recurrent layers' states, for a hybrid model (whose attention layers are never
    /// windowed: the model's configuration refuses both).
    recurrent: Option<Recurrent>,
    /// Positions whose recurrent states a step that passes them keeps (`keep_states_at`).
    wanted: Vec<usize>,
    /// Images laid out by M-RoPE (Qwen-VL), whose rows take fewer positions than slots.
    pub(super) shifts: super::positions::Shifts,
}

/// One layer's keys and values, from its first row's position on.
enum Rows {
    /// On the host, `[position][kv head][head_dim]`: our attention appends and reads it in
    /// place (`attention.rs`).
    Host(LayerKv),
    /// On a GPU, `[1, n_kv_head, room, head_dim]` tensors, for candle's attention.
    Device { k: Tensor, v: Tensor, start: usize },
}

/// `count` positions of `t` (`[1, heads, positions, head_dim]`) from `from`, copied into a
/// new tensor with room for `room` positions (one at least).
fn regrow(t: &Tensor, from: usize, count: usize, room: usize) -> Result<Tensor> {
    let (b, h, _, d) = t.dims4()?;
    let out = Tensor::zeros((b, h, room.max(count).max(1), d), t.dtype(), t.device())?;
    if count > 0 {
        out.slice_set(&t.narrow(2, from, count)?.contiguous()?, 2, 0)?;
    }
    Ok(out)
}

impl Rows {
    fn start(&self) -> usize {
        match self {
            Rows::Host(l) => l.start,
            Rows::Device { start, .. } => *start,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Rows::Host(l) => l.k.bytes() + l.v.bytes(),
            Rows::Device { k, v, .. } => {
                (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes()
            }
        }
    }

    /// Positions it has room for, from its first row.
    fn room(&self, width: usize) -> usize {
        match self {
            Rows::Host(l) => l.k.capacity() / width.max(1),
            Rows::Device { k, .. } => k.dim(2).unwrap_or(0),
        }
    }

    /// A copy of positions `from..to` (which it holds) with room for `room` positions.
    fn copy(&self, from: usize, to: usize, room: usize, width: usize) -> Result<Rows> {
        let start = self.start();
        Ok(match self {
            Rows::Host(l) => {
                let (a, b) = ((from - start) * width, (to - start) * width);
                Rows::Host(LayerKv {
                    k: l.k.copy(a, b, room * width),
                    v: l.v.copy(a, b, room * width),
                    start: from,
                })
            }
            Rows::Device { k, v, .. } => Rows::Device {
                k: regrow(k, from - start, to - from, room)?,
                v: regrow(v, from - start, to - from, room)?,
                start: from,
            },
        })
    }

    /// Room for `room` positions from its first row, keeping the `len` filled positions.
    fn make_room(&mut self, len: usize, room: usize, width: usize) -> Result<()> {
        let stored = len - self.start();
        match self {
            Rows::Host(l) => {
                l.k.truncate(stored * width);
                l.v.truncate(stored * width);
                // Exact, so the doubling of the cache (not Vec's own) decides the memory.
                l.k.reserve_exact((room - stored) * width);
                l.v.reserve_exact((room - stored) * width);
            }
            Rows::Device { k, v, .. } => {
                if k.dim(2)? < room {
                    *k = regrow(k, 0, stored, room)?;
                    *v = regrow(v, 0, stored, room)?;
                }
            }
        }
        Ok(())
    }

    /// Drops the positions before `from` (of the `len` filled), keeping its room.
    fn drop_before(&mut self, from: usize, len: usize, width: usize) -> Result<()> {
        let gone = from - self.start();
        match self {
            Rows::Host(l) => {
                l.k.truncate((len - l.start) * width);
                l.v.truncate((len - l.start) * width);
                l.k.drop_front(gone * width);
                l.v.drop_front(gone * width);
                l.start = from;
            }
            Rows::Device { k, v, start } => {
                let room = k.dim(2)?;
                *k = regrow(k, gone, len - from, room)?;
                *v = regrow(v, gone, len - from, room)?;
                *start = from;
            }
        }
        Ok(())
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

    /// Bytes allocated (room, not just what is filled), the checkpoint's included.
    pub fn bytes(&self) -> usize {
        let kept = self.checkpoint.iter().flat_map(|(_, rows)| rows);
        self.layers.iter().map(Rows::bytes).sum::<usize>()
            + kept.map(|(_, r)| r.bytes()).sum::<usize>()
            + self.recurrent.as_ref().map_or(0, Recurrent::bytes)
    }

    /// The windowed layers and their windows.
    fn windowed(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.map(|w| (i, w)))
    }

    /// Whether the windowed layers hold what a query at position `len` sees.
    fn layers_reach(&self, len: usize) -> bool {
        self.windowed()
            .all(|(i, w)| reaches(self.layers[i].start(), len, w))
    }

    /// Whether the checkpoint holds what a query at position `len` sees, up to its length.
    fn checkpoint_reaches(&self, len: usize) -> bool {
        self.checkpoint.as_ref().is_some_and(|(at, rows)| {
            len <= *at
                && rows
                    .iter()
                    .all(|(i, r)| self.windows[*i].is_none_or(|w| reaches(r.start(), len, w)))
        })
    }

    /// The longest prefix of at most `want` positions that the cache can be cut back to:
    /// `want` itself where every windowed layer still holds the next query's window, else the
    /// checkpoint's length where it holds it, else nothing. With recurrent layers: `want`
    /// itself where it is the cache's length, else the latest copy of their states at or
    /// before it, else nothing.
    pub fn reachable(&self, want: usize) -> usize {
        if let Some(r) = &self.recurrent {
            return r.reachable(want, self.len);
        }
        let want = want.min(self.len);
        if self.layers_reach(want) {
            return want;
        }
        match &self.checkpoint {
            Some((at, _)) if self.checkpoint_reaches(want.min(*at)) => want.min(*at),
            _ => 0,
        }
    }

    /// Forgets positions from `len` on, or from [`reachable(len)`](Self::reachable) where the
    /// windowed layers no longer hold `len`'s window (the memory stays for reuse; a host layer
    /// drops them when it is next appended to).
    pub fn truncate(&mut self, len: usize) {
        let to = self.reachable(len);
        self.shifts.cut(to);
        if to == self.len {
            return;
        }
        if let Some(r) = &mut self.recurrent {
            r.go_back(to);
            self.len = to;
            return;
        }
        if !self.layers_reach(to) {
            // `reachable` found that the checkpoint holds `to`, unless `to` is 0.
            let restored = match (&self.checkpoint, to) {
                (Some((_, rows)), 1..) => rows
                    .iter()
                    .map(|(i, r)| {
                        let width = self.widths[*i];
                        let room = self.layers[*i].room(width).max(to - r.start());
                        Ok((*i, r.copy(r.start(), to, room, width)?))
                    })
                    .collect::<Result<Vec<_>>>(),
                _ => return self.clear(),
            };
            match restored {
                Ok(rows) => rows.into_iter().for_each(|(i, r)| self.layers[i] = r),
                Err(e) => {
                    tracing::warn!(error = %e, "could not restore a KV checkpoint");
                    return self.clear();
                }
            }
        }
        self.len = to;
        // Past `to`, the tokens the checkpoint was taken on may change.
        if let Some((at, _)) = &mut self.checkpoint {
            *at = (*at).min(to);
            let at = *at;
            if at == 0 || !self.checkpoint_reaches(at) {
                self.checkpoint = None;
            }
        }
    }

    /// Empties the cache, keeping the full layers' memory (a windowed layer's rows restart at
    /// position 0).
    fn clear(&mut self) {
        self.len = 0;
        self.checkpoint = None;
        if let Some(r) = &mut self.recurrent {
            r.clear();
        }
        for r in &mut self.layers {
            match r {
                Rows::Host(l) => l.start = 0,
                Rows::Device { start, .. } => *start = 0,
            }
        }
    }

    /// Keeps a copy of the windowed layers' rows that the next query and [`KV_ROLLBACK`] need,
    /// so the cache can be cut back to any position from `len − KV_ROLLBACK` to `len` even
    /// after its rows have slid past. A sequence calls it once its prompt is in: an answer
    /// regenerated, or a next turn whose text differs in the answer, still reuses the prompt.
    /// One checkpoint at a time; a model without windows needs none.
    pub fn checkpoint(&mut self) {
        if let Some(r) = &mut self.recurrent {
            r.checkpoint(self.len);
        }
        if self.len == 0 || self.windowed().next().is_none() {
            return;
        }
        let saved = self
            .windowed()
            .map(|(i, w)| {
                let from = self.layers[i].start().max(keep_from(self.len, w));
                Ok((i, self.layers[i].copy(from, self.len, 0, self.widths[i])?))
            })
            .collect::<Result<Vec<_>>>();
        match saved {
            Ok(rows) => self.checkpoint = Some((self.len, rows)),
            Err(e) => tracing::warn!(error = %e, "could not keep a KV checkpoint"),
        }
    }

    /// A copy of the first [`reachable(len)`](Self::reachable) positions with room for a few
    /// more, and no checkpoint: for a preview, which must leave the kept cache it starts from
    /// as it was.
    pub fn copy_prefix(&self, len: usize) -> Result<KvCache> {
        let to = self.reachable(len);
        if to == 0 {
            return Ok(KvCache::new());
        }
        let from_checkpoint = self.recurrent.is_none() && !self.layers_reach(to);
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, rows) in self.layers.iter().enumerate() {
            let (source, from) = match self.windows[i] {
                // A recurrent layer keeps no rows.
                None if self.is_recurrent(i) => {
                    layers.push(rows.copy(0, 0, 0, self.widths[i])?);
                    continue;
                }
                None => (rows, 0),
                Some(w) => {
                    // `reachable` found that this source holds `to`'s window.
                    let source = match &self.checkpoint {
                        Some((_, kept)) if from_checkpoint => kept
                            .iter()
                            .find_map(|(j, r)| (*j == i).then_some(r))
                            .unwrap_or(rows),
                        _ => rows,
                    };
                    (source, source.start().max(keep_from(to, w)))
                }
            };
            layers.push(source.copy(from, to, to - from + 16, self.widths[i])?);
        }
        Ok(KvCache {
            layers,
            len: to,
            capacity: to + 16,
            widths: self.widths.clone(),
            windows: self.windows.clone(),
            checkpoint: None,
            recurrent: self.recurrent.as_ref().map(|r| r.at(to, self.len)),
            wanted: Vec::new(),
            shifts: self.shifts.upto(to),
        })
    }

    /// Whether `layer` is a recurrent layer (its state is the cache's, not rows).
    fn is_recurrent(&self, layer: usize) -> bool {
        self.recurrent
            .as_ref()
            .is_some_and(|r| r.is_recurrent(layer))
    }

    /// Asks that the recurrent layers' states at these positions be kept when a step passes
    /// them, so that the cache can be cut back there (a sequence asks for points near its
    /// prompt's end, `recurrent.rs`). A model without recurrent layers needs none.
    pub fn keep_states_at(&mut self, positions: &[usize]) {
        self.wanted.clear();
        self.wanted.extend_from_slice(positions);
    }

    /// Before recurrent `layer` runs the token at position `at`: its state is kept there when
    /// asked (`keep_states_at`).
    pub(super) fn keep_before(&mut self, layer: usize, at: usize) {
        if let Some(r) = &mut self.recurrent {
            r.keep_before(layer, at);
        }
    }

    /// A recurrent `layer`'s state at the cache's length, which a step advances.
    pub(super) fn state_mut(&mut self, layer: usize) -> Option<&mut [f32]> {
        self.recurrent.as_mut()?.state_mut(layer)
    }

    /// Makes room for `extra` more positions, doubling the capacity when it runs out, and lets
    /// the windowed layers' rows slide. `host` picks the store our attention reads, and its
    /// type; `None`: candle's tensors on `device`.
    pub(super) fn reserve(
        &mut self,
        cfg: &DecoderConfig,
        extra: usize,
        device: &Device,
        host: Option<KvType>,
    ) -> Result<()> {
        let built = self.layers.len() == cfg.n_layer
            && self.windows == cfg.windows
            && self
                .widths
                .iter()
                .copied()
                .eq((0..cfg.n_layer).map(|i| cfg.kv_width(i)))
            && self.layers.iter().all(|r| match r {
                Rows::Host(l) => host == Some(l.k.kind()),
                Rows::Device { .. } => host.is_none(),
            })
            && match &self.recurrent {
                Some(r) => r.fits(cfg),
                None => cfg.delta.is_none(),
            };
        if !built {
            // A new cache (or, defensively, one built for another model): nothing to keep.
            *self = KvCache {
                widths: (0..cfg.n_layer).map(|i| cfg.kv_width(i)).collect(),
                windows: cfg.windows.clone(),
                recurrent: Recurrent::new(cfg),
                wanted: std::mem::take(&mut self.wanted),
                ..KvCache::default()
            };
        }
        if let Some(r) = &mut self.recurrent {
            r.before_step(self.len, extra, &self.wanted);
        }
        let need = self.len + extra;
        if need > self.capacity {
            self.capacity = need
                .max(self.capacity * 2)
                .max(KV_MIN_CAPACITY)
                .min(cfg.context_length.max(need));
        }
        for i in 0..cfg.n_layer {
            let window = self.windows[i];
            // A recurrent layer, or one that reads another's keys, keeps no rows: its entry
            // stays empty.
            let rows_of = |room: usize| match cfg.recurrent[i] || cfg.kv_width(i) == 0 {
                true => 0,
                false => room,
            };
            if !built {
                let room = rows_of(room_for(window, 0, extra, self.capacity));
                self.layers.push(match host {
                    Some(kind) => Rows::Host(LayerKv {
                        k: kind.rows(),
                        v: kind.rows(),
                        start: 0,
                    }),
                    None => {
                        let h = cfg.heads[i];
                        let shape = (1, h.n_kv_head, room, h.head_dim);
                        Rows::Device {
                            k: Tensor::zeros(shape, DType::F32, device)?,
                            v: Tensor::zeros(shape, DType::F32, device)?,
                            start: 0,
                        }
                    }
                });
            }
            let rows = &mut self.layers[i];
            if let Some(w) = window {
                let from = keep_from(self.len, w);
                if from >= rows.start() + slide(w) {
                    rows.drop_before(from, self.len, self.widths[i])?;
                }
            }
            if cfg.recurrent[i] {
                continue;
            }
            let room = room_for(window, self.len - rows.start(), extra, self.capacity);
            rows.make_room(self.len, room, self.widths[i])?;
        }
        Ok(())
    }

    /// Appends one new position's keys and values (`width` floats each) to host `layer`, after
    /// the filled positions and whatever earlier rows of this step appended, in the layer's
    /// [`KvType`]: f16 by default, as llama.cpp keeps them (half the memory and half the reads
    /// of f32, and the values still carry 11 significant bits).
    pub(super) fn push_host(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        if let Some(Rows::Host(l)) = self.layers.get_mut(layer) {
            let at = (self.len + row - l.start) * self.widths[layer];
            l.k.put(at, k);
            l.v.put(at, v);
        }
    }

    /// Host `layer`'s keys and values (its kept positions and this step's rows).
    pub(super) fn host_layer(&self, layer: usize) -> Option<&LayerKv> {
        match self.layers.get(layer) {
            Some(Rows::Host(l)) => Some(l),
            _ => None,
        }
    }

    /// The position of `layer`'s first kept row (0 but in a windowed layer).
    pub(super) fn first_kept(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, Rows::start)
    }

    /// Writes the new keys/values of `layer` after the filled positions and returns views of
    /// every kept position so far, from [`first_kept`](Self::first_kept) (GPU store).
    /// [`KvCache::advance`] commits the positions once every layer is done.
    pub(super) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let Some(Rows::Device {
            k: ck,
            v: cv,
            start,
        }) = self.layers.get(layer)
        else {
            return Err(Error::Candle(candle_core::Error::Msg(
                "a host KV cache on a GPU model".into(),
            )));
        };
        let (at, t) = (self.len - start, k.dim(2)?);
        ck.slice_set(k, 2, at)?;
        cv.slice_set(v, 2, at)?;
        Ok((ck.narrow(2, 0, at + t)?, cv.narrow(2, 0, at + t)?))
    }

    pub(super) fn advance(&mut self, t: usize) {
        self.len += t;
        if let Some(r) = &mut self.recurrent {
            r.after_step();
        }
    }
}
