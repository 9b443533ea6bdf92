//! How a matrix's weights are held ([`Weights`]): in one of our panel or block layouts
//! ([`Made`]), as the file holds them ([`FileRows`], read in the memory-mapped file where it
//! can be), or read there until their panels are made ([`Later`]); and [`Held`], what a
//! product reads now.

use super::*;

/// A matrix's weights, as it holds them now or will.
pub(crate) enum Weights {
    /// In a layout of ours, made when the model loaded.
    Made(Made),
    /// Blocks as the file holds them, run row by row: in the memory-mapped file where the
    /// model was loaded from one (`mapped.rs`), else copied.
    File(FileRows),
    /// Read in the map until its panels are made (`later.rs`).
    Later(std::sync::Arc<Later>),
}

/// Weights in a layout of ours: blocks, or panels of eight or sixteen rows.
pub(crate) enum Made {
    Q4_1(Vec<BlockQ4_1>),
    /// Q4_1 in panels of eight rows, for the 256-bit panel kernels (rows a multiple of 8).
    Q4_1x8(Vec<PanelQ4_1<8>>),
    /// Q4_1 in panels of sixteen rows, for the AVX-512 panel kernel (rows a multiple of 16).
    Q4_1x16(Vec<PanelQ4_1<16>>),
    /// Q4_0 in panels, as the file holds it (elsewhere it runs as Q4_1).
    Q4_0x8(Vec<PanelQ4_0<8>>),
    Q4_0x16(Vec<PanelQ4_0<16>>),
    /// Q4_K in panels of super-blocks (elsewhere it runs as Q4_1).
    Q4Kx8(Vec<PanelQ4K<8>>),
    Q4Kx16(Vec<PanelQ4K<16>>),
    /// Q5_K in panels of super-blocks (elsewhere candle runs it).
    Q5Kx8(Vec<PanelQ5K<8>>),
    Q5Kx16(Vec<PanelQ5K<16>>),
    /// Q6_K in panels of super-blocks (elsewhere it runs as Q8_0).
    Q6Kx8(Vec<PanelQ6K<8>>),
    Q6Kx16(Vec<PanelQ6K<16>>),
    Q8_0(Vec<BlockQ8_0>),
    /// Q8_0 in panels of eight rows, for the AVX-VNNI panel kernel (rows a multiple of 8).
    Q8_0x8(Vec<PanelQ8_0<8>>),
    /// Q8_0 in panels of sixteen rows, for the AVX-512 panel kernel (rows a multiple of 16).
    Q8_0x16(Vec<PanelQ8_0<16>>),
    /// F16 and BF16 rows as the file holds them (`halves.rs`).
    F16(Vec<f16>),
    Bf16(Vec<half::bf16>),
}

/// The formats whose row kernels read the file's own blocks: MXFP4 wherever it is (`mxfp4.rs`),
/// and the others for a mixture's experts (`krows.rs` for the K-quants).
pub(crate) enum FileRows {
    Mxfp4(Rows<BlockMxfp4>),
    Q4_0(Rows<BlockQ4_0>),
    Q8_0(Rows<BlockQ8_0>),
    Q4K(Rows<BlockQ4K>),
    Q5K(Rows<BlockQ5K>),
    Q6K(Rows<BlockQ6K>),
}

/// `$body` with `$w` bound to the rows of whatever format `$rows` holds.
macro_rules! each_file_format {
    ($rows:expr, $w:ident => $body:expr) => {
        match $rows {
            FileRows::Mxfp4($w) => $body,
            FileRows::Q4_0($w) => $body,
            FileRows::Q8_0($w) => $body,
            FileRows::Q4K($w) => $body,
            FileRows::Q5K($w) => $body,
            FileRows::Q6K($w) => $body,
        }
    };
}

impl FileRows {
    /// `bytes` of `dtype` (lying at `.1` in the map `.0` where given) read there, or copied
    /// where they are not the map's own or not aligned for their blocks; `None` for a format
    /// without row kernels on the file's blocks.
    pub(super) fn new(
        dtype: TensorType,
        bytes: &[u8],
        map: Option<(&std::sync::Arc<memmap2::Mmap>, usize)>,
    ) -> Option<FileRows> {
        Some(match dtype {
            TensorType::Mxfp4 => FileRows::Mxfp4(Rows::new(bytes, map)?),
            TensorType::Ggml(GgmlDType::Q4_0) => FileRows::Q4_0(Rows::new(bytes, map)?),
            TensorType::Ggml(GgmlDType::Q8_0) => FileRows::Q8_0(Rows::new(bytes, map)?),
            TensorType::Ggml(GgmlDType::Q4K) => FileRows::Q4K(Rows::new(bytes, map)?),
            TensorType::Ggml(GgmlDType::Q5K) => FileRows::Q5K(Rows::new(bytes, map)?),
            TensorType::Ggml(GgmlDType::Q6K) => FileRows::Q6K(Rows::new(bytes, map)?),
            _ => return None,
        })
    }

    /// Weights per block: 32, or a K-quant's 256.
    fn block_weights(&self) -> usize {
        match self {
            FileRows::Q4K(_) | FileRows::Q5K(_) | FileRows::Q6K(_) => QK_K,
            _ => QK,
        }
    }

    /// Blocks of 32 weights held.
    pub(super) fn n_blocks(&self) -> usize {
        each_file_format!(self, w => w.n_blocks()) * self.block_weights() / QK
    }

    pub(super) fn extend(&mut self, more: FileRows) -> Option<()> {
        match (self, more) {
            (FileRows::Mxfp4(w), FileRows::Mxfp4(m)) => w.extend(m),
            (FileRows::Q4_0(w), FileRows::Q4_0(m)) => w.extend(m),
            (FileRows::Q8_0(w), FileRows::Q8_0(m)) => w.extend(m),
            (FileRows::Q4K(w), FileRows::Q4K(m)) => w.extend(m),
            (FileRows::Q5K(w), FileRows::Q5K(m)) => w.extend(m),
            (FileRows::Q6K(w), FileRows::Q6K(m)) => w.extend(m),
            _ => return None,
        }
        Some(())
    }

    pub(super) fn bytes(&self) -> usize {
        each_file_format!(self, w => w.bytes())
    }

    pub(super) fn mapped_bytes(&self) -> usize {
        each_file_format!(self, w => w.mapped_bytes())
    }

    pub(super) fn matmul(&self, isa: Isa, x: &[f32], m: usize, k: usize, out: &mut [f32]) {
        each_file_format!(self, w => w.matmul(isa, x, m, k, out))
    }

    /// Row `j` (of `k` weights) as f32 into `out`.
    pub(super) fn dequantize_row(&self, j: usize, k: usize, out: &mut [f32]) {
        let kb = k / self.block_weights();
        match self {
            FileRows::Mxfp4(w) => {
                dequantize_blocks(w.row(j, kb).iter().copied(), out, QK, dequantize_mxfp4)
            }
            FileRows::Q4_0(w) => {
                dequantize_blocks(w.row(j, kb).iter().copied(), out, QK, dequantize_q4_0)
            }
            FileRows::Q8_0(w) => {
                dequantize_blocks(w.row(j, kb).iter().copied(), out, QK, dequantize_q8_0)
            }
            FileRows::Q4K(w) => {
                dequantize_blocks(w.row(j, kb).iter().copied(), out, QK_K, dequantize_q4_k)
            }
            FileRows::Q5K(w) => {
                dequantize_blocks(w.row(j, kb).iter().copied(), out, QK_K, dequantize_q5_k)
            }
            FileRows::Q6K(w) => {
                dequantize_blocks(w.row(j, kb).iter().copied(), out, QK_K, dequantize_q6_k)
            }
        }
    }
}

/// `$body` with `$w` bound to the weights of whatever layout `$weights` holds.
macro_rules! each_layout {
    ($weights:expr, $w:ident => $body:expr) => {
        match $weights {
            Made::Q4_1($w) => $body,
            Made::Q4_1x8($w) => $body,
            Made::Q4_1x16($w) => $body,
            Made::Q4_0x8($w) => $body,
            Made::Q4_0x16($w) => $body,
            Made::Q4Kx8($w) => $body,
            Made::Q4Kx16($w) => $body,
            Made::Q5Kx8($w) => $body,
            Made::Q5Kx16($w) => $body,
            Made::Q6Kx8($w) => $body,
            Made::Q6Kx16($w) => $body,
            Made::Q8_0($w) => $body,
            Made::Q8_0x8($w) => $body,
            Made::Q8_0x16($w) => $body,
            Made::F16($w) => $body,
            Made::Bf16($w) => $body,
        }
    };
}

impl Made {
    /// Blocks of 32 weights held.
    pub(crate) fn n_blocks(&self) -> usize {
        match self {
            Made::Q4_1(w) => w.len(),
            Made::Q4_1x8(w) => 8 * w.len(),
            Made::Q4_1x16(w) => 16 * w.len(),
            Made::Q4_0x8(w) => 8 * w.len(),
            Made::Q4_0x16(w) => 16 * w.len(),
            Made::Q4Kx8(w) => 64 * w.len(),
            Made::Q4Kx16(w) => 128 * w.len(),
            Made::Q5Kx8(w) => 64 * w.len(),
            Made::Q5Kx16(w) => 128 * w.len(),
            Made::Q6Kx8(w) => 64 * w.len(),
            Made::Q6Kx16(w) => 128 * w.len(),
            Made::Q8_0(w) => w.len(),
            Made::Q8_0x8(w) => 8 * w.len(),
            Made::Q8_0x16(w) => 16 * w.len(),
            Made::F16(w) => w.len() / QK,
            Made::Bf16(w) => w.len() / QK,
        }
    }

    /// `more`'s rows after these; `None` unless both have the same format and layout.
    pub(crate) fn extend(&mut self, more: Made) -> Option<()> {
        match (self, more) {
            (Made::Q4_1(w), Made::Q4_1(m)) => w.extend(m),
            (Made::Q4_1x8(w), Made::Q4_1x8(m)) => w.extend(m),
            (Made::Q4_1x16(w), Made::Q4_1x16(m)) => w.extend(m),
            (Made::Q4_0x8(w), Made::Q4_0x8(m)) => w.extend(m),
            (Made::Q4_0x16(w), Made::Q4_0x16(m)) => w.extend(m),
            (Made::Q4Kx8(w), Made::Q4Kx8(m)) => w.extend(m),
            (Made::Q4Kx16(w), Made::Q4Kx16(m)) => w.extend(m),
            (Made::Q5Kx8(w), Made::Q5Kx8(m)) => w.extend(m),
            (Made::Q5Kx16(w), Made::Q5Kx16(m)) => w.extend(m),
            (Made::Q6Kx8(w), Made::Q6Kx8(m)) => w.extend(m),
            (Made::Q6Kx16(w), Made::Q6Kx16(m)) => w.extend(m),
            (Made::Q8_0(w), Made::Q8_0(m)) => w.extend(m),
            (Made::Q8_0x8(w), Made::Q8_0x8(m)) => w.extend(m),
            (Made::Q8_0x16(w), Made::Q8_0x16(m)) => w.extend(m),
            (Made::F16(w), Made::F16(m)) => w.extend(m),
            (Made::Bf16(w), Made::Bf16(m)) => w.extend(m),
            _ => return None,
        }
        Some(())
    }
}

impl Weights {
    /// Blocks of 32 weights held.
    pub(crate) fn n_blocks(&self) -> usize {
        match self {
            Weights::Made(w) => w.n_blocks(),
            Weights::File(w) => w.n_blocks(),
            Weights::Later(l) => l.rows.n_blocks(),
        }
    }

    /// `more`'s rows after these; `None` unless both have the same format and layout.
    pub(crate) fn extend(&mut self, more: Weights) -> Option<()> {
        match (self, more) {
            (Weights::Made(w), Weights::Made(m)) => w.extend(m),
            (Weights::File(w), Weights::File(m)) => w.extend(m),
            (Weights::Later(w), Weights::Later(m)) => {
                let m = std::sync::Arc::into_inner(m)?;
                std::sync::Arc::get_mut(w)?.extend(m)
            }
            _ => None,
        }
    }
}

/// What a matrix's weights are now: rows as the file holds them (read in its map, or panels
/// still to be made), or weights in a layout of ours.
pub(crate) enum Held<'a> {
    Rows(&'a FileRows),
    Made(&'a Made),
}

impl Weights {
    /// What these weights are now ([`Held`]).
    pub(crate) fn held(&self) -> Held<'_> {
        match self {
            Weights::Made(w) => Held::Made(w),
            Weights::File(rows) => Held::Rows(rows),
            Weights::Later(l) => l.ready().map_or(Held::Rows(&l.rows), Held::Made),
        }
    }
}
