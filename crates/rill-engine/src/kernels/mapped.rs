//! Weights read where they lie: in the memory-mapped model file, not copied.
//!
//! A format whose row kernels read the file's own blocks (MXFP4 everywhere; Q4_0, Q8_0, Q4_K,
//! Q5_K and Q6_K for a mixture's experts) can stay in the map: loading copies none of it, an
//! expert no token routes to costs no memory until one does, its pages are the page cache's
//! (shared with every other process that maps the same file, a second engine or `rill serve`),
//! and the kernel may drop them under pressure and read them again from the file, as it does
//! for llama.cpp's mapped weights. A matrix stacked from parts (an expert's gate and up) keeps
//! each part where it lies, as its own stretch of rows.

use std::sync::Arc;

use super::*;

/// Drops the pages of `len` bytes at `at` in `map` from this process's mapping (`MADV_DONTNEED`):
/// they stay in the page cache, and a later read maps them again, so nothing is lost. A range
/// not inside the map is left alone, as is any failure (the pages stay mapped).
pub(crate) fn drop_pages(map: &memmap2::Mmap, at: usize, len: usize) {
    #[cfg(unix)]
    if at.checked_add(len).is_some_and(|end| end <= map.len()) {
        // SAFETY: a read-only map of a file: `MADV_DONTNEED` only drops the range's pages from
        // this mapping, and a later read of them reads the file again (the advice is unsafe for
        // private or anonymous maps, whose pages would come back zeroed); the range is inside
        // the map (checked above).
        let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, len) };
    }
    #[cfg(not(unix))]
    let _ = (map, at, len);
}

/// A stretch of whole rows: blocks of our own, or blocks in the map.
enum Stretch<B> {
    Owned(Vec<B>),
    Mapped {
        map: Arc<memmap2::Mmap>,
        /// Byte offset of the first block in the map.
        at: usize,
        blocks: usize,
    },
}

/// A block format that may be read at any offset of the map where its alignment holds: plain
/// bytes and `u16`/`i8` fields, no padding, so every byte pattern is a valid block.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integer fields whose size is the sum of theirs.
pub(crate) unsafe trait PlainBlock: Copy + Default + Sync {}
// SAFETY: each is `#[repr(C)]` over `u8`/`i8`/`u16` fields, its size asserted (`blocks.rs`,
// `mxfp4.rs`) to be their sum, so there is no padding.
unsafe impl PlainBlock for BlockMxfp4 {}
unsafe impl PlainBlock for BlockQ4_0 {}
unsafe impl PlainBlock for BlockQ8_0 {}
unsafe impl PlainBlock for BlockQ4K {}
unsafe impl PlainBlock for BlockQ5K {}
unsafe impl PlainBlock for BlockQ6K {}

impl<B: PlainBlock> Stretch<B> {
    fn blocks(&self) -> &[B] {
        match self {
            Stretch::Owned(w) => w,
            // SAFETY: `at .. at + blocks · size` is inside the map and `at` is aligned for `B`
            // (both checked in `Rows::mapped`); the map lives as long as `self` (the `Arc`), is
            // read-only and never remapped; `B` is a `PlainBlock`, so every byte pattern is one.
            Stretch::Mapped { map, at, blocks } => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(*at) as *const B, *blocks)
            },
        }
    }
}

/// A matrix's rows, in order, over one or more stretches.
pub(crate) struct Rows<B> {
    stretches: Vec<Stretch<B>>,
}

impl<B: PlainBlock> Rows<B> {
    pub(crate) fn owned(w: Vec<B>) -> Self {
        Rows {
            stretches: vec![Stretch::Owned(w)],
        }
    }

    /// `bytes` bytes of blocks at `at` in `map`; `None` unless they are whole blocks inside it,
    /// aligned for `B`.
    pub(crate) fn mapped(map: Arc<memmap2::Mmap>, at: usize, bytes: usize) -> Option<Self> {
        let size = std::mem::size_of::<B>();
        let aligned = (map.as_ptr() as usize).checked_add(at)? % std::mem::align_of::<B>() == 0;
        if !aligned || !bytes.is_multiple_of(size) || at.checked_add(bytes)? > map.len() {
            return None;
        }
        Some(Rows {
            stretches: vec![Stretch::Mapped {
                map,
                at,
                blocks: bytes / size,
            }],
        })
    }

    /// `bytes` (a tensor's, which lie at `at` in `map` when that is given) in the map where
    /// they are its own and aligned, else copied.
    pub(crate) fn new(bytes: &[u8], map: Option<(&Arc<memmap2::Mmap>, usize)>) -> Option<Self> {
        let own = |(m, at): (&Arc<memmap2::Mmap>, usize)| {
            m.get(at..).is_some_and(|m| m.as_ptr() == bytes.as_ptr())
        };
        match map.filter(|&m| own(m)) {
            Some((m, at)) => Self::mapped(m.clone(), at, bytes.len())
                .or_else(|| Some(Self::owned(blocks(bytes)?))),
            None => Some(Self::owned(blocks(bytes)?)),
        }
    }

    pub(crate) fn n_blocks(&self) -> usize {
        self.stretches.iter().map(|s| s.blocks().len()).sum()
    }

    /// Bytes of blocks: what one product reads.
    pub(crate) fn bytes(&self) -> usize {
        self.n_blocks() * std::mem::size_of::<B>()
    }

    /// Bytes of blocks that lie in the map rather than in memory of our own.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.stretches
            .iter()
            .filter(|s| matches!(s, Stretch::Mapped { .. }))
            .map(|s| std::mem::size_of_val(s.blocks()))
            .sum()
    }

    /// Each stretch's blocks, in order.
    pub(crate) fn stretch_blocks(&self) -> Vec<&[B]> {
        self.stretches.iter().map(Stretch::blocks).collect()
    }

    /// Drops the pages of `blocks` (a stretch's, or part of one) from this process's mapping
    /// where they lie in the map ([`drop_pages`]).
    pub(crate) fn release(&self, blocks: &[B]) {
        let (start, len) = (blocks.as_ptr() as usize, std::mem::size_of_val(blocks));
        for s in &self.stretches {
            if let Stretch::Mapped { map, .. } = s {
                if let Some(at) = start.checked_sub(map.as_ptr() as usize) {
                    if at.saturating_add(len) <= map.len() {
                        return drop_pages(map, at, len);
                    }
                }
            }
        }
    }

    /// `more`'s rows after these, each stretch where it lies.
    pub(crate) fn extend(&mut self, more: Rows<B>) {
        self.stretches.extend(more.stretches);
    }

    /// Row `j`'s `kb` blocks.
    pub(crate) fn row(&self, j: usize, kb: usize) -> &[B] {
        let mut first = j * kb;
        for s in &self.stretches {
            let w = s.blocks();
            if first < w.len() {
                return &w[first..first + kb];
            }
            first -= w.len();
        }
        panic!("row {j} is past the matrix's end")
    }
}

impl<B: PlainBlock + Format> Rows<B> {
    /// `out = x · wᵀ` for `m` rows of `k` (`out` is `m × n_out`). One stretch is one product;
    /// several are one product each, their columns set side by side. A row's output does not
    /// depend on the rows beside it (the kernels' promise), so the bits are the one stretch's.
    pub(crate) fn matmul(&self, isa: Isa, x: &[f32], m: usize, k: usize, out: &mut [f32]) {
        if let [one] = self.stretches.as_slice() {
            return rows_times(isa, one.blocks(), x, m, k, out);
        }
        let (kb, n_out) = (k / B::Act::ACT_QK, out.len() / m.max(1));
        let mut col = 0;
        let mut part = Vec::new();
        for s in &self.stretches {
            let w = s.blocks();
            let n = w.len() / kb;
            if m == 1 {
                rows_times(isa, w, x, 1, k, &mut out[col..col + n]);
            } else {
                part.clear();
                part.resize(m * n, 0.0);
                rows_times(isa, w, x, m, k, &mut part);
                for (o, p) in out.chunks_exact_mut(n_out).zip(part.chunks_exact(n)) {
                    o[col..col + n].copy_from_slice(p);
                }
            }
            col += n;
        }
    }
}
