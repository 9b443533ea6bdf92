//! How a host KV cache stores its keys and values (issue 15, long context): f16, as llama.cpp
//! keeps them by default, or 8-bit blocks of 32 with an f16 scale each (llama.cpp's `q8_0`
//! cache, `-ctk q8_0 -ctv q8_0`): 34 bytes for 32 values instead of 64, so a long
//! conversation takes 53% of the memory and a decode step reads 53% of the cache's bytes.
//!
//! A store is flat, `[position][kv head][head_dim]` values, as `attention.rs` reads it. In the
//! 8-bit store a block never straddles two heads (the head size is a multiple of 32), so a
//! head's row is whole blocks and position `p`, head `g`, block `b` has its scale at
//! `(p · width + g · head_dim) / 32 + b`.

use half::{f16, slice::HalfFloatSliceExt};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Values per block of the 8-bit store, each block with its own scale.
pub const Q8_BLOCK: usize = 32;

/// The element type of a host KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    /// 16-bit floats: 2 bytes a value.
    #[default]
    F16,
    /// 8-bit integers in blocks of 32 with an f16 scale: 1.0625 bytes a value.
    Q8_0,
}

impl KvType {
    /// The name llama.cpp gives it (`--cache-type-k`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Parses llama.cpp's name (`f16`, `q8_0`).
    pub fn parse(s: &str) -> Result<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            _ => Err(Error::param(
                "kv_cache",
                format!("unknown KV cache type {s:?}: use f16 or q8_0"),
            )),
        }
    }

    /// Bytes `values` values take (a whole number of blocks for [`KvType::Q8_0`]).
    pub fn bytes(self, values: usize) -> usize {
        match self {
            KvType::F16 => 2 * values,
            KvType::Q8_0 => values + 2 * values.div_ceil(Q8_BLOCK),
        }
    }

    /// Whether a layer whose heads have `head_dim` values can be stored this way.
    pub fn fits(self, head_dim: usize) -> bool {
        self == KvType::F16 || (head_dim > 0 && head_dim.is_multiple_of(Q8_BLOCK))
    }

    /// An empty store of this type.
    pub fn rows(self) -> KvRows {
        match self {
            KvType::F16 => KvRows::F16(Vec::new()),
            KvType::Q8_0 => KvRows::Q8 {
                q: Vec::new(),
                d: Vec::new(),
            },
        }
    }
}

/// Keys or values of one layer, as a flat run of values.
#[derive(Clone, Debug, PartialEq)]
pub enum KvRows {
    F16(Vec<f16>),
    /// `q[i]·d[i / 32]` is value `i`.
    Q8 {
        q: Vec<i8>,
        d: Vec<f16>,
    },
}

impl Default for KvRows {
    fn default() -> Self {
        KvRows::F16(Vec::new())
    }
}

impl KvRows {
    pub fn kind(&self) -> KvType {
        match self {
            KvRows::F16(_) => KvType::F16,
            KvRows::Q8 { .. } => KvType::Q8_0,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            KvRows::F16(x) => x.len(),
            KvRows::Q8 { q, .. } => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values it has room for without growing.
    pub fn capacity(&self) -> usize {
        match self {
            KvRows::F16(x) => x.capacity(),
            KvRows::Q8 { q, .. } => q.capacity(),
        }
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        match self {
            KvRows::F16(x) => 2 * x.capacity(),
            KvRows::Q8 { q, d } => q.capacity() + 2 * d.capacity(),
        }
    }

    /// Keeps the first `n` values (`n` a multiple of the row width, so of 32 for `Q8`).
    pub fn truncate(&mut self, n: usize) {
        match self {
            KvRows::F16(x) => x.truncate(n),
            KvRows::Q8 { q, d } => {
                q.truncate(n);
                d.truncate(n / Q8_BLOCK);
            }
        }
    }

    /// Room for `more` values past those held, exactly (the cache's doubling decides the
    /// memory, not `Vec`'s).
    pub fn reserve_exact(&mut self, more: usize) {
        match self {
            KvRows::F16(x) => x.reserve_exact(more),
            KvRows::Q8 { q, d } => {
                q.reserve_exact(more);
                d.reserve_exact(more.div_ceil(Q8_BLOCK));
            }
        }
    }

    /// Drops the first `n` values (whole rows), moving the rest down.
    pub fn drop_front(&mut self, n: usize) {
        match self {
            KvRows::F16(x) => {
                x.drain(..n);
            }
            KvRows::Q8 { q, d } => {
                q.drain(..n);
                d.drain(..n / Q8_BLOCK);
            }
        }
    }

    /// A copy of values `from..to` (whole rows) with room for `room` values.
    pub fn copy(&self, from: usize, to: usize, room: usize) -> KvRows {
        let room = room.max(to - from);
        match self {
            KvRows::F16(x) => {
                let mut c = Vec::with_capacity(room);
                c.extend_from_slice(&x[from..to]);
                KvRows::F16(c)
            }
            KvRows::Q8 { q, d } => {
                let (mut cq, mut cd) = (
                    Vec::with_capacity(room),
                    Vec::with_capacity(room.div_ceil(Q8_BLOCK)),
                );
                cq.extend_from_slice(&q[from..to]);
                cd.extend_from_slice(&d[from / Q8_BLOCK..to / Q8_BLOCK]);
                KvRows::Q8 { q: cq, d: cd }
            }
        }
    }

    /// Writes `new` (a whole row: a multiple of 32 values for `Q8`) at value `at`, dropping
    /// whatever was held from `at` on.
    pub fn put(&mut self, at: usize, new: &[f32]) {
        match self {
            KvRows::F16(x) => {
                x.truncate(at);
                x.resize(at + new.len(), f16::ZERO);
                x[at..].convert_from_f32_slice(new);
            }
            KvRows::Q8 { q, d } => {
                q.truncate(at);
                d.truncate(at / Q8_BLOCK);
                for block in new.chunks(Q8_BLOCK) {
                    let (scale, values) = quantise(block);
                    d.push(scale);
                    q.extend_from_slice(&values[..block.len()]);
                }
            }
        }
    }

    /// Values `from..from + out.len()` as f32, into `out`.
    pub fn read(&self, from: usize, out: &mut [f32]) {
        match self {
            KvRows::F16(x) => x[from..from + out.len()].convert_to_f32_slice(out),
            KvRows::Q8 { q, d } => {
                // A block at a time, its scale converted once.
                let mut i = 0;
                while i < out.len() {
                    let at = from + i;
                    let end = ((at / Q8_BLOCK + 1) * Q8_BLOCK - from).min(out.len());
                    let scale = d[at / Q8_BLOCK].to_f32();
                    for (o, &v) in out[i..end].iter_mut().zip(&q[at..]) {
                        *o = v as f32 * scale;
                    }
                    i = end;
                }
            }
        }
    }
}

/// One block as ggml's `quantize_row_q8_0` makes it: the scale `max |x| / 127` (kept in f16),
/// and each value divided by the f32 scale and rounded half away from zero.
pub fn quantise(x: &[f32]) -> (f16, [i8; Q8_BLOCK]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; Q8_BLOCK];
    for (q, v) in q.iter_mut().zip(x) {
        // |v · id| ≤ 127 (up to rounding of `id`, which `as` saturates), so it fits an i8.
        *q = (v * id).round() as i8;
    }
    (f16::from_f32(d), q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_q8_block_keeps_each_value_within_half_a_step() {
        let x: Vec<f32> = (0..32)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173)
            .collect();
        let mut rows = KvType::Q8_0.rows();
        rows.put(0, &x);
        let mut back = vec![0f32; 32];
        rows.read(0, &mut back);
        let step = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (a, b) in x.iter().zip(&back) {
            // Half a step from rounding, plus the scale's f16 rounding (2⁻¹¹ relative).
            assert!((a - b).abs() <= 0.5 * step + a.abs() * 1e-3, "{a} → {b}");
        }
        // The largest value is ±127 steps exactly.
        let KvRows::Q8 { q, .. } = &rows else {
            unreachable!()
        };
        assert_eq!(q.iter().map(|v| v.unsigned_abs()).max(), Some(127));
        // An all-zero block has scale 0 and reads back as zeros.
        rows.put(32, &[0.0; 32]);
        let mut zeros = vec![1f32; 32];
        rows.read(32, &mut zeros);
        assert!(zeros.iter().all(|v| *v == 0.0));
        // A read across the two blocks gives each value its own block's scale.
        let mut across = vec![1f32; 30];
        rows.read(20, &mut across);
        assert_eq!(&across[..12], &back[20..]);
        assert!(across[12..].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn rows_are_cut_copied_and_dropped_by_whole_blocks() {
        let row = |k: usize| -> Vec<f32> { (0..64).map(|i| (k * 64 + i) as f32 * 0.01).collect() };
        for kind in [KvType::F16, KvType::Q8_0] {
            let mut rows = kind.rows();
            for k in 0..4 {
                rows.put(k * 64, &row(k));
            }
            assert_eq!(rows.len(), 256);
            let mut want = vec![0f32; 64];
            rows.read(128, &mut want);
            // A copy of rows 1..3 reads row 2 where the original does.
            let copy = rows.copy(64, 192, 512);
            assert!(copy.capacity() >= 512);
            let mut got = vec![0f32; 64];
            copy.read(64, &mut got);
            assert_eq!(got, want);
            // Dropping row 0 moves row 2 to 1; overwriting row 2 drops row 3.
            rows.drop_front(64);
            rows.read(64, &mut got);
            assert_eq!(got, want);
            rows.put(128, &row(9));
            assert_eq!(rows.len(), 192);
            rows.truncate(64);
            assert_eq!(rows.len(), 64);
            assert_eq!(kind.bytes(64), if kind == KvType::F16 { 128 } else { 68 });
        }
    }

    #[test]
    fn kv_types_parse_by_llama_cpp_names() {
        assert_eq!(KvType::parse("q8_0").unwrap(), KvType::Q8_0);
        assert_eq!(KvType::parse("F16").unwrap(), KvType::F16);
        assert!(KvType::parse("q4_0").is_err());
        assert!(KvType::Q8_0.fits(64) && KvType::Q8_0.fits(96));
        assert!(!KvType::Q8_0.fits(24) && KvType::F16.fits(24));
    }
}
