//! Quantised weights × activations, our own kernels (issue 6).
//!
//! candle 0.11 compiles its SIMD dot products only when the *build* targets AVX
//! (`target-cpu=native`); a release build that runs on any x86-64 gets its scalar loops, and its
//! Q4_1 dot product has no SIMD path at all. Here the instruction set is chosen at run time
//! (`is_x86_feature_detected!`), so one binary is fast on any machine, with a scalar reference
//! every SIMD path is tested against.
//!
//! Formats, as GGUF stores them (blocks of 32 weights): Q4_1 (`d`, `m` as f16, 16 bytes of
//! nibbles: weight = d·q + m) against activations quantised to Q8_1 (`d`, `s = d·Σq` as f16, 32
//! signed bytes), and Q8_0 (`d` as f16, 32 signed bytes) against Q8_0. Activations are
//! quantised exactly as ggml does, once per row per matmul.
//!
//! Q4_0, Q4_K, Q5_K and Q6_K run as the file holds them wherever panels are made (AVX2, rows
//! in eights): [`PanelQ4_0`] is Q4_1's panel without `m`, which the kernel takes as `−8·d`;
//! [`PanelQ4K`] and [`PanelQ5K`] keep each super-block's `d` and `dmin` and unpack its 6-bit
//! sub-block scales and mins to a byte each (2–3% more than the file); Q5_K adds each
//! weight's fifth bit from a plane of its own; [`PanelQ6K`] keeps the file's bytes exactly and
//! assembles each 6-bit weight from its nibble and 2-bit plane. The K-quants are dotted with
//! activations quantised as ggml's Q8_K ([`BlockQ8K`]: one f32 scale per 256, and the sums of
//! each 16), so each sub-block's scale, min and Q6_K's offset of 32 apply in integers and a
//! super-block is converted and scaled once, with ggml's numbers. Their kernels prefetch one
//! super-block ahead (two with AVX2's eight-row panels).
//!
//! Elsewhere (Q5_K then stays with candle), and for Q5_0, a matrix is repacked into Q4_1 or
//! Q8_0 when a model loads, so the same kernels run it: Q4_0 as Q4_1 with `m = −8·d` (exact,
//! the bits of its panels); Q5_0 as Q8_0 with bytes `q − 16` (exact); Q4_K as Q4_1 blocks of
//! 32 with the same nibbles and each sub-block's scale and min rounded to f16 (relative error
//! ≤ 2⁻¹¹; 5 bits per weight instead of 4.5); Q6_K dequantised and quantised again as Q8_0,
//! 64 rows at a time (each weight moves by at most half an 8-bit step of its block, about a
//! quarter of its 6-bit step; 8.5 bits per weight instead of 6.56). F16 and BF16 rows run as
//! the file holds them against f32 activations (`halves.rs`: a float dot product in eight
//! lanes, the same bits on every path); candle dequantised them to f32 (twice the file). Other
//! formats stay with candle.
//!
//! With AVX2, a matrix whose rows come in eights is stored as panels ([`PanelQ4_1`], and
//! [`PanelQ8_0`] with AVX-VNNI or AVX-512): eight rows' blocks interleaved so that one vector
//! holds the same four weights of each row (sixteen rows and 512-bit vectors with AVX-512,
//! `avx512.rs`). Activations are broadcast four at a time and dotted with it, so each lane ends a
//! block with its row's exact integer sum, scaled and added once per block; a tile is one panel ×
//! up to four activation rows. Every instruction set's panels give the same bits. Other matrices
//! (rows not in eights, Q8_0 without VNNI, NEON, the scalar reference) run one dot product per
//! (weight row, activation row), in tiles of 2 (Q4_1) or 1 (Q8_0) weight rows × 4 activation rows
//! with AVX2. One row or a few (a decode step, a batched decode) split the weight rows across the
//! engine's rayon pool; many (a prefill chunk) split the activation rows, 32 per task, so each
//! weight panel or row is read once per task and stays in L1 for all of its rows. Every path sums
//! each output in the same order whatever rows are beside it, so a row's output never depends on
//! them.
//!
//! A mixture's experts are not copied at all: Q4_0, Q8_0, Q4_K, Q5_K and Q6_K (and MXFP4
//! everywhere) run row by row on the file's own blocks where they lie in the memory-mapped file
//! (`mapped.rs`): Q4_0 with Q4_1's arithmetic, `m = −8·d`, in tiles of four weight rows
//! (`avx2/q4_0_dots.rs`), the K-quants by `krows.rs`, which give their scalar references' bits.
//!
//! The files: `blocks.rs` (the formats, and their repacking), `panels.rs` (the interleaved
//! layouts; `kpanels.rs` the K-quants'), `quants.rs` (activation quantisers, the scalar
//! reference dots), `isa.rs` (the run-time choice), `linear.rs` ([`QLinear`]; how it holds
//! its weights in `weights.rs`), `driver.rs`
//! (how a product is split across the threads), `halves.rs` (F16 and BF16, all paths),
//! `mapped.rs` and `krows.rs` (rows read in the map), `mxfp4.rs`, one per instruction set:
//! `avx2.rs` (its K-quant tiles in `avx2/kquants.rs`), `avx512.rs`, `neon.rs`, and the tests
//! (`tests.rs`, and
//! `native_tests.rs` for the formats run as the file holds them, `file_rows_tests.rs` for the
//! rows read in the map).

// Panels, and what feeds them, are made only for x86-64's SIMD; elsewhere they go unused.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, unused_variables, unused_mut)
)]

use std::sync::OnceLock;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use half::f16;
use rayon::prelude::*;

/// The row kernels' loop, written once (every format run row by row, and the F16/BF16
/// rows): weight rows `$js` (a range) `$h` at a time, or one at a time for the last few, ×
/// activation rows `$is` [`TILE_A`] at a time, fewer for the last. Each tile is `$tile`, an
/// expression of the weight row `$j` and activation row `$i` it starts at and of the constants
/// `$R` × `$C` of its shape, giving `[[f32; C]; R]`; the loop stores it at
/// `$o + (j + r)·sj + (i − is.start + c)·si`. `[($r, $c) …]` lists the shapes the loop may
/// ask for, so that only those are compiled: every `($h, c)`, and `(1, c)` where `$js` may
/// end on fewer than `$h` rows, for `c` up to [`TILE_A`] (up to `$is`'s length where that is
/// less).
///
/// Safety: the caller's `unsafe` block answers for `$tile`'s reads, and for `$o` being valid
/// for every output of `$js` × `$is`.
#[cfg(target_arch = "x86_64")]
macro_rules! row_tiles {
    (
        $js:expr, $is:expr, $h:expr, [$(($r:literal, $c:literal))+],
        ($o:expr, $sj:expr, $si:expr),
        |$R:ident, $C:ident, $j:ident, $i:ident| $tile:expr
    ) => {{
        let (js, is): (std::ops::Range<usize>, std::ops::Range<usize>) = ($js, $is);
        let (h, o, sj, si): (usize, *mut f32, usize, usize) = ($h, $o, $sj, $si);
        let mut $j = js.start;
        while $j < js.end {
            let r = if js.end - $j >= h { h } else { 1 };
            for $i in is.clone().step_by(TILE_A) {
                let at = o.add($j * sj + ($i - is.start) * si);
                match (r, TILE_A.min(is.end - $i)) {
                    $(
                        ($r, $c) => {
                            const $R: usize = $r;
                            const $C: usize = $c;
                            let t: [[f32; $C]; $R] = $tile;
                            for (dr, row) in t.iter().enumerate() {
                                for (dc, v) in row.iter().enumerate() {
                                    *at.add(dr * sj + dc * si) = *v;
                                }
                            }
                        }
                    )+
                    (r, c) => unreachable!("no {r} × {c} tile listed"),
                }
            }
            $j += r;
        }
    }};
}

mod blocks;
mod driver;
mod halves;
mod isa;
mod kpanels;
mod krows;
mod later;
// Its `each_layout!` and `each_file_format!` serve `linear.rs` and `resident.rs` too.
#[macro_use]
mod weights;
mod linear;
mod mapped;
mod mxfp4;
mod panels;
mod peak;
mod quants;
mod resident;
mod tensor_type;

pub use blocks::*;
use driver::*;
use halves::*;
pub use isa::*;
pub use kpanels::*;
pub(crate) use later::*;
pub use linear::*;
pub(crate) use mapped::*;
pub use mxfp4::*;
pub use panels::*;
pub use peak::byte_product_peak;
pub use quants::*;
pub(crate) use resident::*;
pub use resident::{process_locked_bytes, process_status_bytes};
pub use tensor_type::*;
pub(crate) use weights::*;

/// A panel kernel's driver: `$name` runs panels `ps` of `w` × activation rows `is` into
/// `o[(i − is.start)·n_out + ROWS·p + k]`, in tiles of one panel × up to [`TILE_A`] activation
/// rows computed by `$tile` (given the types `$g` first, and the const generic `VNNI` where
/// named) and stored by `$store`;
/// with `wider` (every AVX-512 kernel), up to [`TILE_A_WIDER`] rows a tile (32 registers hold
/// their sums for twelve rows), so a weight block is unpacked a third as often for a prompt's
/// rows, and once for a draft's check. A row's arithmetic is the same in a tile of any height,
/// so are its bits.
#[cfg(target_arch = "x86_64")]
macro_rules! panels {
    ($name:ident, [$($vnni:ident)?], $features:literal, $tile:ident [$($g:ty),*], $p:ty, $a:ty,
     $store:ident) => {
        panels!(@driver $name, [$($vnni)?], $features, $tile [$($g),*], $p, $a, $store, TILE_A,
                [4 3 2]);
    };
    ($name:ident, wider, $features:literal, $tile:ident [$($g:ty),*], $p:ty, $a:ty,
     $store:ident) => {
        panels!(@driver $name, [], $features, $tile [$($g),*], $p, $a, $store, TILE_A_WIDER,
                [12 11 10 9 8 7 6 5 4 3 2]);
    };
    (@driver $name:ident, [$($vnni:ident)?], $features:literal, $tile:ident [$($g:ty),*],
     $p:ty, $a:ty, $store:ident, $height:ident, [$($c:literal)*]) => {
        /// # Safety
        /// The instructions of its target features and its tile's (AVX-VNNI with `VNNI`, and
        /// for the 256-bit Q8_0 tile); `ps` within `w`'s panels, `is` within `acts`' rows, and
        /// `o` valid for those outputs.
        #[target_feature(enable = $features)]
        pub unsafe fn $name<$(const $vnni: bool)?>(
            w: &[$p],
            acts: &PanelActs<$a>,
            ps: std::ops::Range<usize>,
            is: std::ops::Range<usize>,
            o: *mut f32,
            n_out: usize,
        ) {
            // Blocks per row: one panel block per activation block.
            let kb = acts.kb;
            assert!(acts.d.len() == acts.q.len() && acts.s.len() == acts.q.len());
            assert!(ps.end * kb <= w.len() && is.end * kb <= acts.q.len());
            for p in ps {
                let wp = w.as_ptr().add(p * kb);
                for i in is.clone().step_by($height) {
                    let (a, ad, s) = (
                        acts.q.as_ptr().add(i * kb),
                        acts.d.as_ptr().add(i * kb),
                        acts.s.as_ptr().add(i * kb),
                    );
                    let at = o.add((i - is.start) * n_out + <$p as Panel>::ROWS * p);
                    macro_rules! go {
                        ($rows:literal) => {{
                            let t = $tile::<$($g,)* $rows $(, $vnni)?>(wp, kb, a, ad, s);
                            for (c, v) in t.iter().enumerate() {
                                $store(at.add(c * n_out), *v);
                            }
                        }};
                    }
                    match $height.min(is.end - i) {
                        $($c => go!($c),)*
                        _ => go!(1),
                    }
                }
            }
        }
    };
}

/// Prefetches part `j` of 8 of the super-block [`PANEL_BYTES_AHEAD`] after `p` (rounded to
/// whole super-blocks, at least the next). Called once per sub-block, it puts each super-block
/// on its way ahead of the kernel: with the hardware prefetcher alone, the K-quant kernels
/// waited on memory at each sub-block's first load (a matrix too large for the cache ran at
/// half the speed of one inside it). The distance is the Q4_0 panels': one super-block of
/// sixteen rows (2.4–3.4 KB), two of eight; two of sixteen, as before, left the 1B shape's
/// Q4_K_M and Q6_K decode 7–15% slower (every line-fill buffer busy with lines wanted later).
/// Addresses past the matrix are only prefetched, never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_part<T>(p: *const T, j: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let size = std::mem::size_of::<T>();
    let ahead = ((PANEL_BYTES_AHEAD + size / 2) / size).max(1);
    let lines = size.div_ceil(64 * 8);
    let base = (p as *const i8).wrapping_add(ahead * size + 64 * lines * j);
    for line in 0..lines {
        // SAFETY: a prefetch is a hint: it reads nothing and cannot fault, whatever the
        // address (SSE, which every x86-64 has).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(64 * line)) };
    }
}

/// Rows ahead of a tile's own that the row kernels prefetch, block by block: a tile of four
/// rows asks for the next tile's. A matrix read in a file's map lies in 4 KB pages, and the
/// hardware prefetchers stop at each page's end, so without this each page's first lines
/// waited on memory (an expert of Qwen3-30B-A3B is 216 pages): four rows ahead (4.6 KB for a
/// row of 2,048 Q4_0 weights) is past the next page boundary, early enough.
#[cfg(target_arch = "x86_64")]
const ROWS_AHEAD: usize = 4;

/// Prefetches every cache line of the block [`ROWS_AHEAD`] rows (of `kb` blocks) after `p`.
/// Addresses past the matrix are only prefetched, never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_rows_ahead<T>(p: *const T, kb: usize) {
    prefetch_block(p, ROWS_AHEAD * kb);
}

/// How far ahead the Q4_0, Q4_1 and Q8_0 panel kernels prefetch, in bytes: a panel is one
/// stream, block after block, and the hardware prefetchers alone left its reads waiting at
/// each 4 KB page (a 1B-shape Q4_0 model decoded at 71–75% of the bandwidth bound, 80–100%
/// with this; eight blocks of a 16-row Q4_1 panel: 4 and 16 were slower).
#[cfg(target_arch = "x86_64")]
const PANEL_BYTES_AHEAD: usize = 2560;

/// Prefetches the panel block [`PANEL_BYTES_AHEAD`] after `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_panel_ahead<T>(p: *const T) {
    prefetch_block(p, (PANEL_BYTES_AHEAD / std::mem::size_of::<T>()).max(1));
}

/// Prefetches every cache line of the block `ahead` blocks after `p`. Addresses past the
/// matrix are only prefetched, never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_block<T>(p: *const T, ahead: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let size = std::mem::size_of::<T>();
    let at = p.wrapping_add(ahead) as *const i8;
    // The line of its first byte and of every 64 after, and of its last byte.
    let mut off = 0;
    while off < size {
        // SAFETY: a prefetch is a hint: it reads nothing and cannot fault, whatever the
        // address (SSE, which every x86-64 has).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(off)) };
        off += 64;
    }
    // SAFETY: as above.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(size - 1)) };
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod native_tests;

#[cfg(test)]
mod file_rows_tests;
