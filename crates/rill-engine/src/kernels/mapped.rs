//! MXFP4 weights read where they lie: in the memory-mapped model file, not copied.
//!
//! MXFP4 runs as the file holds it (17-byte blocks, byte-aligned, nothing repacked), so a
//! mixture's experts (gpt-oss's) can stay in the map: loading copies none of them, an expert
//! no token routes to costs no memory until one does, its pages are the page cache's (shared
//! with every other process that maps the same file, a second engine or `rill serve`), and the
//! kernel may drop them under pressure and read them again from the file, as it does for
//! llama.cpp's mapped weights. A matrix stacked from parts (an expert's gate and up) keeps
//! each part where it lies, as its own stretch of rows.

use std::sync::Arc;

use super::*;

/// A stretch of whole rows: blocks of our own, or blocks in the map.
enum Stretch {
    Owned(Vec<BlockMxfp4>),
    Mapped {
        map: Arc<memmap2::Mmap>,
        /// Byte offset of the first block in the map.
        at: usize,
        blocks: usize,
    },
}

// Blocks are read from any byte offset of the map.
const _: () = assert!(std::mem::align_of::<BlockMxfp4>() == 1);

impl Stretch {
    fn blocks(&self) -> &[BlockMxfp4] {
        match self {
            Stretch::Owned(w) => w,
            // SAFETY: `at .. at + blocks · 17` is inside the map (checked in `Mxfp4Rows::mapped`),
            // which lives as long as `self` (the `Arc`), is read-only and never remapped; a
            // block is 17 plain bytes with no padding and alignment 1 (asserted above), so every
            // byte pattern at every offset is a valid block.
            Stretch::Mapped { map, at, blocks } => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(*at) as *const BlockMxfp4, *blocks)
            },
        }
    }
}

/// A matrix's MXFP4 rows, in order, over one or more stretches.
pub(crate) struct Mxfp4Rows {
    stretches: Vec<Stretch>,
}

impl Mxfp4Rows {
    pub(crate) fn owned(w: Vec<BlockMxfp4>) -> Self {
        Mxfp4Rows {
            stretches: vec![Stretch::Owned(w)],
        }
    }

    /// `bytes` bytes of blocks at `at` in `map`; `None` unless they are whole blocks inside it.
    pub(crate) fn mapped(map: Arc<memmap2::Mmap>, at: usize, bytes: usize) -> Option<Self> {
        let size = std::mem::size_of::<BlockMxfp4>();
        if !bytes.is_multiple_of(size) || at.checked_add(bytes)? > map.len() {
            return None;
        }
        Some(Mxfp4Rows {
            stretches: vec![Stretch::Mapped {
                map,
                at,
                blocks: bytes / size,
            }],
        })
    }

    pub(crate) fn n_blocks(&self) -> usize {
        self.stretches.iter().map(|s| s.blocks().len()).sum()
    }

    /// Bytes of blocks: what one product reads.
    pub(crate) fn bytes(&self) -> usize {
        self.n_blocks() * std::mem::size_of::<BlockMxfp4>()
    }

    /// Bytes of blocks that lie in the map rather than in memory of our own.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.stretches
            .iter()
            .filter(|s| matches!(s, Stretch::Mapped { .. }))
            .map(|s| std::mem::size_of_val(s.blocks()))
            .sum()
    }

    /// `more`'s rows after these, each stretch where it lies.
    pub(crate) fn extend(&mut self, more: Mxfp4Rows) {
        self.stretches.extend(more.stretches);
    }

    /// Row `j`'s `kb` blocks.
    pub(crate) fn row(&self, j: usize, kb: usize) -> &[BlockMxfp4] {
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

    /// `out = x · wᵀ` for `m` rows of `k` (`out` is `m × n_out`). One stretch is one product;
    /// several are one product each, their columns set side by side. A row's output does not
    /// depend on the rows beside it (the kernels' promise), so the bits are the one stretch's.
    pub(crate) fn matmul(&self, isa: Isa, x: &[f32], m: usize, k: usize, out: &mut [f32]) {
        if let [one] = self.stretches.as_slice() {
            return rows_times(isa, one.blocks(), x, m, k, out);
        }
        let (kb, n_out) = (k / QK, out.len() / m.max(1));
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
