//! A model's weights kept in memory (`--mlock`): every matrix our kernels run — its panels, or
//! its rows in the file's map — locked with `mlock` (`kernels/resident.rs`), and unlocked when
//! the model is dropped. The norms and biases (a few KB a layer), and the matrices candle runs
//! (a GPU's, or the rare format ours do not read), are not locked.

use super::decoder::{Decoder, Ffn};
use crate::kernels::{lock_pages, unlock_pages, QLinear, Region};

/// The system refused to lock all of a model's weights: how far it got, and why.
#[derive(Debug, thiserror::Error)]
#[error(
    "locked {} of {} MB of weights in memory, then the system refused: {source}; raise the \
     limit on locked memory (`ulimit -l`, or LimitMEMLOCK= for a service) to lock them all",
    .locked / 1_000_000,
    .total / 1_000_000
)]
pub struct LockRefused {
    /// Bytes locked before the refusal (they stay locked while the model lives).
    pub locked: usize,
    /// Bytes of all the weights.
    pub total: usize,
    #[source]
    pub source: std::io::Error,
}

impl Decoder {
    /// Every matrix our kernels run: the embedding table (when not the output's), each
    /// layer's, the output's.
    fn matrices(&self) -> Vec<&QLinear> {
        let mut all: Vec<&QLinear> = match &self.embed {
            super::parts::Embedding::Quantized(q) => vec![q],
            _ => Vec::new(),
        };
        for l in &self.layers {
            all.extend(l.qkv.ours());
            all.extend(l.wo.ours());
            match &l.ffn {
                Ffn::Dense { gate_up, down } => {
                    all.extend(gate_up.ours());
                    all.extend(down.ours());
                }
                Ffn::Experts(e) => all.extend(e.ours()),
            }
            if let Some(s) = &l.shared {
                all.extend(s.gate_up.ours());
                all.extend(s.down.ours());
            }
            if let Some(b) = &l.beside {
                all.extend(b.experts.ours());
            }
            if let Some(p) = &l.per_layer {
                all.extend(p.gate.ours());
                all.extend(p.proj.ours());
            }
        }
        if let Some(p) = &self.per_layer {
            all.push(&p.table);
            all.extend(p.proj.ours());
        }
        all.extend(self.output.ours());
        all
    }

    /// Locks the weights in memory, reading in any not yet resident; the bytes locked. The
    /// panels still to be made are made first, on the calling thread's pool (locked rows
    /// about to be released would stay in the process). Where the system refuses part way,
    /// what was locked stays locked (and is released with the model): the error says how
    /// much.
    pub fn lock_weights(&mut self) -> Result<usize, LockRefused> {
        while self.make_next_panels() {}
        let regions: Vec<Region> = self.matrices().iter().flat_map(|m| m.regions()).collect();
        let total = regions.iter().map(|r| r.len).sum();
        let mut locked = 0;
        for region in regions {
            if let Err(source) = lock_pages(region) {
                return Err(LockRefused {
                    locked,
                    total,
                    source,
                });
            }
            self.locked.push(region);
            locked += region.len;
        }
        Ok(locked)
    }
}

/// Locks the model's weights and the draft model's in memory (on the compute pool, which
/// makes their panels first); the bytes locked. A refusal is logged, not fatal: the model
/// runs on, with what the system did lock.
pub(crate) fn lock_weights(
    weights: &mut Decoder,
    draft: Option<&mut crate::draft::DraftModel>,
) -> usize {
    let started = std::time::Instant::now();
    let mut locked = 0;
    let outcomes = [
        Some(weights.lock_weights()),
        draft.map(|d| d.lock_weights()),
    ];
    for outcome in outcomes.into_iter().flatten() {
        match outcome {
            Ok(bytes) => locked += bytes,
            Err(refused) => {
                locked += refused.locked;
                tracing::warn!("{refused}");
            }
        }
    }
    tracing::info!(
        locked_mb = locked / 1_000_000,
        ms = started.elapsed().as_millis() as u64,
        "weights locked in memory"
    );
    locked
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // Before the fields (and the memory) go.
        for &region in &self.locked {
            unlock_pages(region);
        }
    }
}
