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
//! Four more formats are repacked into those two when a model loads, so the same kernels run
//! them: Q4_0 as Q4_1 with `m = −8·d` (exact); Q5_0 as Q8_0 with bytes `q − 16` (exact); Q4_K
//! (super-blocks of 256 with 6-bit sub-block scales and mins) as Q4_1 blocks of 32 with the same
//! nibbles and each sub-block's scale and min rounded to f16 (relative error ≤ 2⁻¹¹; 5 bits per
//! weight instead of 4.5); Q6_K dequantised and quantised again as Q8_0 (each weight moves by at
//! most half an 8-bit step of its block, about a quarter of its 6-bit step; 8.5 bits per weight
//! instead of 6.56). Other formats stay with candle.
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

const QK: usize = 32;

/// 32 weights: `d·q + m`, q in 0..16; element j in the low nibble of `qs[j]`, element j+16 in
/// the high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}

/// 32 weights: `d·q`, q in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}

/// 32 activations: `d·q`, with `s = d·Σq` for the Q4_1 offset term.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; QK],
}

// The blocks are read straight from GGUF bytes: no padding allowed.
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// 32 weights: `d·(q − 8)`, q in 0..16, nibbles laid out as in [`BlockQ4_1`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

/// 256 weights in 8 sub-blocks of 32: `d·sc_j·q − dmin·m_j`, the 6-bit `sc_j`, `m_j` packed in
/// `scales`; the 32 bytes of `qs` from 32·p hold sub-block 2p in their low nibbles and 2p + 1
/// in their high ones.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// 32 weights: `d·(q − 16)`, q in 0..32: the low 4 bits as in [`BlockQ4_0`], bit 4 of element
/// j in bit j of `qh` (little-endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl Default for BlockQ4K {
    fn default() -> Self {
        BlockQ4K {
            d: 0,
            dmin: 0,
            scales: [0; 12],
            qs: [0; 128],
        }
    }
}

/// Q4_0 is Q4_1 with `m = −8·d`: exact in f16 (a power of two), so the Q4_1 kernels run it
/// unchanged, for 2 more bytes per 32 weights.
fn q4_0_as_q4_1(w: &[BlockQ4_0]) -> Vec<BlockQ4_1> {
    w.iter()
        .map(|b| BlockQ4_1 {
            d: b.d,
            m: (f16::from_bits(b.d) * f16::from_f32(-8.0)).to_bits(),
            qs: b.qs,
        })
        .collect()
}

/// Q5_0 is Q8_0 with bytes `q − 16` (exact; 8.5 bits per weight instead of 5.5).
fn q5_0_as_q8_0(w: &[BlockQ5_0]) -> Vec<BlockQ8_0> {
    w.iter()
        .map(|b| {
            let qh = u32::from_le_bytes(b.qh);
            BlockQ8_0 {
                d: b.d,
                qs: std::array::from_fn(|e| {
                    let low = if e < 16 {
                        b.qs[e] & 0x0F
                    } else {
                        b.qs[e - 16] >> 4
                    };
                    let high = ((qh >> e) & 1) as u8;
                    (low | (high << 4)) as i8 - 16
                }),
            }
        })
        .collect()
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min.
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K as Q4_1 blocks of 32: the same nibbles, each sub-block's `d·sc` and `−dmin·m` rounded
/// to f16 (relative error ≤ 2⁻¹¹, far below the 4-bit rounding of the weights themselves), so
/// the Q4_1 kernels run it (5 bits per weight instead of 4.5).
fn q4_k_as_q4_1(w: &[BlockQ4K]) -> Vec<BlockQ4_1> {
    let mut out = Vec::with_capacity(w.len() * 8);
    for b in w {
        let (d, dmin) = (
            f16::from_bits(b.d).to_f32(),
            f16::from_bits(b.dmin).to_f32(),
        );
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let bytes = &b.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            let v = |e: usize| (bytes[e] >> shift) & 0x0F;
            out.push(BlockQ4_1 {
                d: f16::from_f32(d * sc as f32).to_bits(),
                m: f16::from_f32(-dmin * m as f32).to_bits(),
                qs: std::array::from_fn(|e| v(e) | (v(e + 16) << 4)),
            });
        }
    }
    out
}

impl Default for BlockQ8_0 {
    fn default() -> Self {
        BlockQ8_0 { d: 0, qs: [0; QK] }
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        BlockQ8_1 {
            d: 0,
            s: 0,
            qs: [0; QK],
        }
    }
}

/// f16 → f32 by table (256 KB, built once): as fast as F16C and the same on every machine.
fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect())
}

#[inline(always)]
fn h(t: &[f32], bits: u16) -> f32 {
    // A table of 65,536 entries indexed by a u16: always in bounds.
    t[bits as usize]
}

/// Copies GGUF block bytes into typed blocks. `T` is one of the `repr(C)` blocks above: plain
/// bytes with no padding (asserted at compile time), so any bit pattern is a valid value.
fn blocks<T: Copy + Default>(bytes: &[u8]) -> Option<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    let n = bytes.len() / size;
    let mut out = vec![T::default(); n];
    // SAFETY: `out` holds exactly `n * size` bytes; `T` is plain old data (see above), and the
    // copy is bytewise, so the alignment of `bytes` does not matter.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, n * size);
    }
    Some(out)
}

/// `R` weight rows' Q4_1 blocks at the same position, interleaved for the panel kernel: each
/// row's `d` and `m` (f16), then four chunks of nibbles. Chunk `c` holds, in 32-bit lane `k`
/// (`qs[c][k]`), row k's elements `4c..4c+4` in its low nibbles and `4(c+4)..4(c+4)+4` in its
/// high ones; so one load and a mask (or a shift and a mask) gives a vector whose lane k is row
/// k's four weights of one group of four, ready for a byte dot product with the same four
/// activations broadcast to every lane. As many bytes as the `R` blocks were. `R` is a vector's
/// lanes: 8 for 256-bit kernels, 16 for AVX-512.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PanelQ4_1<const R: usize> {
    pub d: [u16; R],
    pub m: [u16; R],
    pub qs: [[[u8; 4]; R]; 4],
}

const _: () = assert!(
    std::mem::size_of::<PanelQ4_1<8>>() == 8 * std::mem::size_of::<BlockQ4_1>()
        && std::mem::size_of::<PanelQ4_1<16>>() == 16 * std::mem::size_of::<BlockQ4_1>()
);

/// Element `e` (0..32) of a Q4_1 block.
fn q4_1_nibble(b: &BlockQ4_1, e: usize) -> u8 {
    match e < QK / 2 {
        true => b.qs[e] & 0x0F,
        false => b.qs[e - QK / 2] >> 4,
    }
}

/// `R` weight rows' Q8_0 blocks at the same position, interleaved like [`PanelQ4_1`]: 32-bit
/// lane `k` of `qs[g]` holds row k's elements `4g..4g+4`; `sum[k]` is the sum of row k's 32
/// bytes (the activations go in offset by 128 as unsigned bytes, and `128·sum` takes the offset
/// back out). 36 bytes a row for blocks of 34.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PanelQ8_0<const R: usize> {
    pub d: [u16; R],
    pub sum: [i16; R],
    pub qs: [[[i8; 4]; R]; 8],
}

/// The blocks of a panel's rows at one position, interleaved for a panel kernel.
trait Panel: Copy + Send + Sync + Sized {
    /// The format of one row's block.
    type Block: Format;
    /// Weight rows per panel.
    const ROWS: usize;
    /// A panel of `rows` (`ROWS` of them).
    fn new(rows: &[&Self::Block]) -> Self;
    /// Row `k`'s block.
    fn block(&self, k: usize) -> Self::Block;
    /// Quantised activations as the kernel reads them.
    fn prepare(_acts: &mut [<Self::Block as Format>::Act]) {}
}

/// A panel kernel: panels `ps` of `w` × activation rows `is` into
/// `o[(i − is.start)·n_out + ROWS·p + k]`.
///
/// # Safety
/// The instructions it was chosen for (see [`Kernel::kernel`]); `ps` within `w`'s panels, `is`
/// within `acts`' rows, and `o` valid for those outputs.
#[cfg(target_arch = "x86_64")]
type KernelFn<P, A> =
    unsafe fn(&[P], &PanelActs<A>, std::ops::Range<usize>, std::ops::Range<usize>, *mut f32, usize);

/// A panel layout's kernels.
trait Kernel: Panel {
    /// The kernel for `isa`, which must be able to run this layout (see
    /// `QLinear::from_qtensor`).
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, <Self::Block as Format>::Act>;
}

impl<const R: usize> Panel for PanelQ4_1<R> {
    type Block = BlockQ4_1;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ4_1]) -> Self {
        assert_eq!(rows.len(), R);
        let byte = |c: usize, k: usize, i: usize| {
            q4_1_nibble(rows[k], 4 * c + i) | (q4_1_nibble(rows[k], 4 * (c + 4) + i) << 4)
        };
        PanelQ4_1 {
            d: std::array::from_fn(|k| rows[k].d),
            m: std::array::from_fn(|k| rows[k].m),
            qs: std::array::from_fn(|c| {
                std::array::from_fn(|k| std::array::from_fn(|i| byte(c, k, i)))
            }),
        }
    }

    fn block(&self, k: usize) -> BlockQ4_1 {
        let element = |e: usize| {
            let (g, i) = (e / 4, e % 4);
            let byte = self.qs[g % 4][k][i];
            if g < 4 {
                byte & 0x0F
            } else {
                byte >> 4
            }
        };
        BlockQ4_1 {
            d: self.d[k],
            m: self.m[k],
            qs: std::array::from_fn(|j| element(j) | (element(j + QK / 2) << 4)),
        }
    }
}

impl<const R: usize> Panel for PanelQ8_0<R> {
    type Block = BlockQ8_0;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ8_0]) -> Self {
        assert_eq!(rows.len(), R);
        PanelQ8_0 {
            d: std::array::from_fn(|k| rows[k].d),
            sum: std::array::from_fn(|k| rows[k].qs.iter().map(|&q| q as i16).sum()),
            qs: std::array::from_fn(|g| {
                std::array::from_fn(|k| std::array::from_fn(|i| rows[k].qs[4 * g + i]))
            }),
        }
    }

    fn block(&self, k: usize) -> BlockQ8_0 {
        BlockQ8_0 {
            d: self.d[k],
            qs: std::array::from_fn(|e| self.qs[e / 4][k][e % 4]),
        }
    }

    fn prepare(acts: &mut [BlockQ8_0]) {
        // q + 128 as an unsigned byte: the top bit flipped.
        for a in acts {
            for q in a.qs.iter_mut() {
                *q ^= i8::MIN;
            }
        }
    }
}

// Eight-row panels run on 256-bit registers: Q4_1 with or without AVX-VNNI, Q8_0 only with it
// (`maddubs` pairs of 255·127 would saturate i16). Sixteen-row panels run on AVX-512's.
impl Kernel for PanelQ4_1<8> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, BlockQ8_1> {
        match isa.avx_vnni() {
            true => avx2::panels_q4_1::<true>,
            false => avx2::panels_q4_1::<false>,
        }
    }
}

impl Kernel for PanelQ8_0<8> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8_0> {
        avx2::panels_q8_0
    }
}

impl Kernel for PanelQ4_1<16> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8_1> {
        avx512::panels_q4_1
    }
}

impl Kernel for PanelQ8_0<16> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8_0> {
        avx512::panels_q8_0
    }
}

/// A matrix of `kb` blocks per row (rows a multiple of `P::ROWS`) as panels: panel `p` (rows
/// `ROWS·p..ROWS·(p+1)`) holds its `kb` blocks one after another.
fn to_panels<P: Panel>(w: &[P::Block], kb: usize) -> Vec<P> {
    let panels = w.len() / kb / P::ROWS;
    let mut out = Vec::with_capacity(panels * kb);
    let mut rows = Vec::with_capacity(P::ROWS);
    for p in 0..panels {
        for b in 0..kb {
            rows.clear();
            rows.extend((0..P::ROWS).map(|k| &w[(P::ROWS * p + k) * kb + b]));
            out.push(P::new(&rows));
        }
    }
    out
}

/// Row `j`'s blocks out of a matrix in panels (`kb` blocks per row).
fn panel_row<P: Panel>(w: &[P], kb: usize, j: usize) -> impl Iterator<Item = P::Block> + '_ {
    let p = j / P::ROWS;
    w[p * kb..(p + 1) * kb]
        .iter()
        .map(move |panel| panel.block(j % P::ROWS))
}

/// A Q4_1 block's 32 weights into `o`.
fn dequantize_q4_1(t: &[f32], b: &BlockQ4_1, o: &mut [f32]) {
    let (d, m) = (h(t, b.d), h(t, b.m));
    for (i, q) in b.qs.iter().enumerate() {
        o[i] = d * (q & 0x0F) as f32 + m;
        o[i + QK / 2] = d * (q >> 4) as f32 + m;
    }
}

/// One row's `blocks` into `out`, 32 weights each, by the format's `dequantize`.
fn dequantize_blocks<B>(
    blocks: impl Iterator<Item = B>,
    out: &mut [f32],
    dequantize: fn(&[f32], &B, &mut [f32]),
) {
    let t = f16_table();
    for (b, o) in blocks.zip(out.chunks_exact_mut(QK)) {
        dequantize(t, &b, o);
    }
}

/// A Q8_0 block's 32 weights into `o`.
fn dequantize_q8_0(t: &[f32], b: &BlockQ8_0, o: &mut [f32]) {
    let d = h(t, b.d);
    for (v, q) in o.iter_mut().zip(&b.qs) {
        *v = d * *q as f32;
    }
}

/// ggml's `quantize_row_q8_0`.
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d).to_bits();
        for (q, v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
        }
    }
}

/// ggml's `quantize_row_q8_1` (as candle does it, `s` rounded through f16).
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d16 = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.d = d16.to_bits();
        b.s = (f16::from_f32(sum as f32) * d16).to_bits();
    }
}

/// The scalar reference: Σ over blocks of d_x·d_y·Σ(q_x·q_y) + m_x·s_y.
pub fn dot_q4_1_q8_1_scalar(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let mut si = 0i32;
        for j in 0..QK / 2 {
            si += (x.qs[j] & 0x0F) as i32 * y.qs[j] as i32;
            si += (x.qs[j] >> 4) as i32 * y.qs[j + QK / 2] as i32;
        }
        sum += si as f32 * h(t, x.d) * h(t, y.d) + h(t, x.m) * h(t, y.s);
    }
    sum
}

/// The scalar reference: Σ over blocks of d_x·d_y·Σ(q_x·q_y).
pub fn dot_q8_0_q8_0_scalar(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let si: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
        sum += si as f32 * h(t, x.d) * h(t, y.d);
    }
    sum
}

/// A panel kernel's driver: `$name` runs panels `ps` of `w` × activation rows `is` into
/// `o[(i − is.start)·n_out + ROWS·p + k]`, in tiles of one panel × up to [`TILE_A`] activation
/// rows computed by `$tile` (with the const generic `VNNI` where named) and stored by `$store`.
#[cfg(target_arch = "x86_64")]
macro_rules! panels {
    ($name:ident, [$($vnni:ident)?], $features:literal, $tile:ident, $p:ty, $a:ty, $store:ident) => {
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
            let kb = acts.kb;
            assert!(ps.end * kb <= w.len() && is.end * kb <= acts.q.len());
            for p in ps {
                let wp = w.as_ptr().add(p * kb);
                for i in is.clone().step_by(TILE_A) {
                    let (a, ad, s) = (
                        acts.q.as_ptr().add(i * kb),
                        acts.d.as_ptr().add(i * kb),
                        acts.s.as_ptr().add(i * kb),
                    );
                    let at = o.add((i - is.start) * n_out + <$p as Panel>::ROWS * p);
                    macro_rules! go {
                        ($c:literal) => {{
                            let t = $tile::<$c $(, $vnni)?>(wp, kb, a, ad, s);
                            for (c, v) in t.iter().enumerate() {
                                $store(at.add(c * n_out), *v);
                            }
                        }};
                    }
                    match TILE_A.min(is.end - i) {
                        4 => go!(4),
                        3 => go!(3),
                        2 => go!(2),
                        _ => go!(1),
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
// Tiles index their accumulators by row and column: clearer than zipped iterators here.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// `acc` plus, per 32-bit lane, the sum of the four products of unsigned bytes `u` and
    /// signed bytes `s`: one AVX-VNNI `vpdpbusd`, in asm with its VEX encoding spelled out (the
    /// form CPUs with AVX-VNNI but no AVX-512 run; the CPU is checked at run time).
    macro_rules! vpdpbusd {
        ($acc:expr, $u:expr, $s:expr) => {{
            let (mut acc, u, s): (__m256i, __m256i, __m256i) = ($acc, $u, $s);
            std::arch::asm!(
                "{{vex}} vpdpbusd {acc}, {u}, {s}",
                acc = inout(ymm_reg) acc,
                u = in(ymm_reg) u,
                s = in(ymm_reg) s,
                options(pure, nomem, nostack, preserves_flags),
            );
            acc
        }};
    }

    /// Per 32-bit lane, the sum of the four products of unsigned bytes `u` and signed bytes `s`
    /// (no saturation for the operands here: |products| ≤ 15·127 or 127·127). With `$vnni`,
    /// one `vpdpbusd`; else `maddubs` into i16 pairs and `madd` into i32. Both give the same
    /// integers, so every path rounds the same floats.
    macro_rules! dot4 {
        ($vnni:expr, $u:expr, $s:expr) => {{
            let (u, s): (__m256i, __m256i) = ($u, $s);
            if $vnni {
                vpdpbusd!(_mm256_setzero_si256(), u, s)
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
            }
        }};
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The two f16 at the start of a block (`d, m` or `d, s`) as f32, in lanes 0 and 1.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn two_halves(p: *const u16) -> __m128 {
        _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()))
    }

    /// One block of 32 activations quantised to 8 bits as the scalar quantisers do it, bit for
    /// bit: `d = max|x| / 127`, `q = round(x / d)` with halves rounded away from zero (`roundf`;
    /// the vector rounding instruction would send them to even). Returns `d`, the bytes and
    /// their sum.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quantize_block(x: *const f32, qs: *mut i8) -> (f32, i32) {
        let sign = _mm256_set1_ps(-0.0);
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.add(8 * i)));
        let abs = |v: __m256| _mm256_andnot_ps(sign, v);
        let m = _mm256_max_ps(
            _mm256_max_ps(abs(v[0]), abs(v[1])),
            _mm256_max_ps(abs(v[2]), abs(v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let y = _mm256_mul_ps(v[i], id);
            // Whole part, and the exact fraction beside it (|y| ≤ 127).
            let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let away = _mm256_cmp_ps(abs(_mm256_sub_ps(y, t)), half, _CMP_GE_OQ);
            let step = _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(y, sign)));
            _mm256_cvtps_epi32(_mm256_add_ps(t, step))
        });
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01)));
        // i32 → i16 → i8 packs work within 128-bit halves; the permute puts the lanes back.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs as *mut __m256i, p);
        (d, sum)
    }

    /// [`super::quantize_q8_0`], bit for bit.
    ///
    /// # Safety
    /// AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
        for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
            let (d, _) = quantize_block(xs.as_ptr(), b.qs.as_mut_ptr());
            b.d = f16::from_f32(d).to_bits();
        }
    }

    /// [`super::quantize_q8_1`], bit for bit.
    ///
    /// # Safety
    /// AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
        for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
            let (d, sum) = quantize_block(xs.as_ptr(), b.qs.as_mut_ptr());
            let d16 = f16::from_f32(d);
            b.d = d16.to_bits();
            b.s = (f16::from_f32(sum as f32) * d16).to_bits();
        }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` and `y` the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_q8_1<const VNNI: bool>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        let low = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        // Lane 1 gathers the offset terms m_x·s_y.
        let mut offsets = _mm_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            // [d_x·d_y, m_x·s_y] in one multiply, straight from the f16 fields.
            let scales = _mm_mul_ps(two_halves(&x.d), two_halves(&y.d));
            offsets = _mm_add_ps(offsets, scales);
            let nibbles = _mm_loadu_si128(x.qs.as_ptr() as *const __m128i);
            // Elements 0..16 are the low nibbles, 16..32 the high ones.
            let qx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), low);
            let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
            let sums = _mm256_cvtepi32_ps(dot4!(VNNI, qx, qy));
            acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), sums, acc);
        }
        hsum(acc) + _mm_cvtss_f32(_mm_shuffle_ps(offsets, offsets, 1))
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` and `y` the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0_q8_0<const VNNI: bool>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        // The scales by table here: converting them with F16C measured slower for this format.
        let t = f16_table();
        let mut acc = _mm256_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let scale = _mm256_set1_ps(h(t, x.d) * h(t, y.d));
            let qx = _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i);
            let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
            // |x| · (y with x's sign): u8 × i8.
            let sums = dot4!(VNNI, _mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc);
        }
        hsum(acc)
    }

    /// One tile for Q4_1 × Q8_1: `R` weight rows from `w` × `C` activation rows from `a`
    /// (`kb` blocks each, their scales `ad`, their `s` at `s[b·stride + c]`). Each weight block
    /// is unpacked and its scales converted once for the C activation rows, each activation
    /// block loaded once for the R weight rows.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row and scale read lies inside its allocation.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_q4_1<const R: usize, const C: usize, const VNNI: bool>(
        w: *const BlockQ4_1,
        kb: usize,
        a: *const BlockQ8_1,
        ad: *const f32,
        s: *const f32,
        stride: usize,
    ) -> [[f32; C]; R] {
        let low = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // Lane c of off[r]: Σ_b m_r·s_c, a 4-wide multiply and add per weight block, summed in
        // the order `dot_q4_1_q8_1` sums them, so a row's output is the same alone or in a
        // batch (and everything else in the tile rounds as it does there too).
        let mut off = [_mm_setzero_ps(); R];
        for b in 0..kb {
            let mut qx = [_mm256_setzero_si256(); R];
            let mut dx = [_mm256_setzero_ps(); R];
            let sy = _mm_loadu_ps(s.add(b * stride));
            for r in 0..R {
                let x = &*w.add(r * kb + b);
                let nibbles = _mm_loadu_si128(x.qs.as_ptr() as *const __m128i);
                qx[r] =
                    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), low);
                let dm = two_halves(&x.d);
                dx[r] = _mm256_broadcastss_ps(dm);
                let m = _mm_shuffle_ps(dm, dm, 0b01_01_01_01);
                off[r] = _mm_add_ps(off[r], _mm_mul_ps(m, sy));
            }
            for c in 0..C {
                let qy = _mm256_loadu_si256((*a.add(c * kb + b)).qs.as_ptr() as *const __m256i);
                let dy = _mm256_broadcast_ss(&*ad.add(c * kb + b));
                for r in 0..R {
                    let sums = _mm256_cvtepi32_ps(dot4!(VNNI, qx[r], qy));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), sums, acc[r][c]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            let mut o = [0f32; 4];
            _mm_storeu_ps(o.as_mut_ptr(), off[r]);
            for c in 0..C {
                out[r][c] = hsum(acc[r][c]) + o[c];
            }
        }
        out
    }

    /// One tile for Q8_0 × Q8_0, as [`tile_q4_1`] (no offsets: `s` and `stride` unused).
    ///
    /// # Safety
    /// As [`tile_q4_1`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_q8_0<const R: usize, const C: usize, const VNNI: bool>(
        w: *const BlockQ8_0,
        kb: usize,
        a: *const BlockQ8_0,
        ad: *const f32,
        _s: *const f32,
        _stride: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..kb {
            let mut qx = [_mm256_setzero_si256(); R];
            let mut ax = [_mm256_setzero_si256(); R];
            let mut dx = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let x = &*w.add(r * kb + b);
                qx[r] = _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i);
                ax[r] = _mm256_sign_epi8(qx[r], qx[r]);
                dx[r] = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(x.d as i32)));
            }
            for c in 0..C {
                let qy = _mm256_loadu_si256((*a.add(c * kb + b)).qs.as_ptr() as *const __m256i);
                let dy = _mm256_broadcast_ss(&*ad.add(c * kb + b));
                for r in 0..R {
                    let sums = _mm256_cvtepi32_ps(dot4!(VNNI, ax[r], _mm256_sign_epi8(qy, qx[r])));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), sums, acc[r][c]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum(acc[r][c]);
            }
        }
        out
    }

    /// One panel (eight weight rows, `kb` blocks from `w`) × `C` activation rows (row c's
    /// blocks at `a + c·kb`, their `d` and `s` at `ad`/`s + c·kb`): lane k of result c is weight
    /// row k · activation row c. Per block, the four-byte groups of the eight rows are dotted
    /// with the activation's group broadcast to every lane, so lane k ends with row k's exact
    /// integer sum for the block (VNNI: `vpdpbusd` accumulates in i32; else `maddubs` pairs
    /// accumulate in i16, at most 8·2·15·127 = 30,480, then one `madd`); then `acc += (d_w·d_a)
    /// · sum` and `acc += m_w · s_a`. Each output's arithmetic is the same whatever `C` is.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn panel_tile<const C: usize, const VNNI: bool>(
        w: *const PanelQ4_1<8>,
        kb: usize,
        a: *const BlockQ8_1,
        ad: *const f32,
        s: *const f32,
    ) -> [__m256; C] {
        let low = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); C];
        for b in 0..kb {
            let p = &*w.add(b);
            let mut isum = [_mm256_setzero_si256(); C];
            for c4 in 0..4 {
                let chunk = _mm256_loadu_si256(p.qs[c4].as_ptr() as *const __m256i);
                let halves = [
                    _mm256_and_si256(chunk, low),
                    _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low),
                ];
                for (h, wq) in halves.into_iter().enumerate() {
                    let g = c4 + 4 * h;
                    for c in 0..C {
                        let ap = (*a.add(c * kb + b)).qs.as_ptr().add(4 * g) as *const i32;
                        let av = _mm256_set1_epi32(ap.read_unaligned());
                        isum[c] = if VNNI {
                            vpdpbusd!(isum[c], wq, av)
                        } else {
                            _mm256_add_epi16(isum[c], _mm256_maddubs_epi16(wq, av))
                        };
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
            let mw = _mm256_cvtph_ps(_mm_loadu_si128(p.m.as_ptr() as *const __m128i));
            for c in 0..C {
                let i32s = match VNNI {
                    true => isum[c],
                    false => _mm256_madd_epi16(isum[c], _mm256_set1_epi16(1)),
                };
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.add(c * kb + b)));
                acc[c] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(i32s), acc[c]);
                acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*s.add(c * kb + b)), acc[c]);
            }
        }
        acc
    }

    /// One panel of Q8_0 (eight weight rows) × `C` activation rows (as [`panel_tile`]; the
    /// activations' bytes offset by 128, see `Panel::prepare`; AVX-VNNI only, since `maddubs`
    /// pairs of 255·127 would saturate i16): lane k sums `(a + 128)·w` over the block with
    /// `vpdpbusd`, takes `128·Σw` back out (exact integers), then `acc += (d_w·d_a) · sum`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn panel_tile_q8_0<const C: usize>(
        w: *const PanelQ8_0<8>,
        kb: usize,
        a: *const BlockQ8_0,
        ad: *const f32,
        _s: *const f32,
    ) -> [__m256; C] {
        let mut acc = [_mm256_setzero_ps(); C];
        for b in 0..kb {
            let p = &*w.add(b);
            let mut isum = [_mm256_setzero_si256(); C];
            for g in 0..8 {
                let wq = _mm256_loadu_si256(p.qs[g].as_ptr() as *const __m256i);
                for c in 0..C {
                    let ap = (*a.add(c * kb + b)).qs.as_ptr().add(4 * g) as *const i32;
                    let av = _mm256_set1_epi32(ap.read_unaligned());
                    isum[c] = vpdpbusd!(isum[c], av, wq);
                }
            }
            let offset = _mm256_slli_epi32(
                _mm256_cvtepi16_epi32(_mm_loadu_si128(p.sum.as_ptr() as *const __m128i)),
                7,
            );
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
            for c in 0..C {
                let sums = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[c], offset));
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.add(c * kb + b)));
                acc[c] = _mm256_fmadd_ps(dd, sums, acc[c]);
            }
        }
        acc
    }

    panels!(
        panels_q4_1,
        [VNNI],
        "avx2,fma,f16c",
        panel_tile,
        PanelQ4_1<8>,
        BlockQ8_1,
        _mm256_storeu_ps
    );
    panels!(
        panels_q8_0,
        [],
        "avx2,fma,f16c",
        panel_tile_q8_0,
        PanelQ8_0<8>,
        BlockQ8_0,
        _mm256_storeu_ps
    );

    /// The tiles of [`Format::rows`] for one format: weight rows `R` at a time (its tile's
    /// height), activation rows [`TILE_A`] at a time, the last tiles of each smaller.
    macro_rules! rows {
        ($name:ident, $tile:ident, $w:ty, $a:ty, $r:literal) => {
            /// # Safety
            /// AVX2, FMA and F16C; the bounds [`Format::rows`] asserts.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn $name<const VNNI: bool>(
                w: &[$w],
                acts: &Acts<$a>,
                is: std::ops::Range<usize>,
                out: &mut [f32],
                sj: usize,
                si: usize,
            ) {
                let kb = acts.kb;
                let n = w.len() / kb;
                let o = out.as_mut_ptr();
                for j in (0..n).step_by($r) {
                    let wp = w.as_ptr().add(j * kb);
                    for i in is.clone().step_by(TILE_A) {
                        let (a, ad) = (acts.q.as_ptr().add(i * kb), acts.d.as_ptr().add(i * kb));
                        let s = acts.s.as_ptr().add(i);
                        let at = (j * sj + (i - is.start) * si) as isize;
                        macro_rules! go {
                            ($rr:literal, $cc:literal) => {{
                                let t = $tile::<$rr, $cc, VNNI>(wp, kb, a, ad, s, acts.stride);
                                for (r, row) in t.iter().enumerate() {
                                    for (c, v) in row.iter().enumerate() {
                                        *o.offset(at + (r * sj + c * si) as isize) = *v;
                                    }
                                }
                            }};
                        }
                        match ($r.min(n - j), TILE_A.min(is.end - i)) {
                            (2, 4) => go!(2, 4),
                            (2, 3) => go!(2, 3),
                            (2, 2) => go!(2, 2),
                            (2, _) => go!(2, 1),
                            (_, 4) => go!(1, 4),
                            (_, 3) => go!(1, 3),
                            (_, 2) => go!(1, 2),
                            _ => go!(1, 1),
                        }
                    }
                }
            }
        };
    }
    // Two Q4_1 rows per tile; one Q8_0 row (two spill registers and measured slower).
    rows!(rows_q4_1, tile_q4_1, BlockQ4_1, BlockQ8_1, 2);
    rows!(rows_q8_0, tile_q8_0, BlockQ8_0, BlockQ8_0, 1);
}

/// ARM's Advanced SIMD (every AArch64 CPU has it). Each block's integer sum is computed with
/// widening multiplies and pairwise adds, exactly, and then scaled and added in the scalar
/// reference's own order, so the results are the reference's bit for bit.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use std::arch::aarch64::*;

    /// Σ a·b over 16 signed bytes, widened to 16 bits (at most 127·128 per product) and
    /// accumulated pairwise into 32.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn dot16(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }

    /// # Safety
    /// NEON; `x` and `y` the same length.
    #[target_feature(enable = "neon")]
    pub unsafe fn dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        let t = f16_table();
        let mut sum = 0f32;
        for (x, y) in x.iter().zip(y) {
            let q = vld1q_u8(x.qs.as_ptr());
            let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
            let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
            let acc = dot16(vdupq_n_s32(0), lo, vld1q_s8(y.qs.as_ptr()));
            let acc = dot16(acc, hi, vld1q_s8(y.qs.as_ptr().add(QK / 2)));
            let si = vaddvq_s32(acc);
            sum += si as f32 * h(t, x.d) * h(t, y.d) + h(t, x.m) * h(t, y.s);
        }
        sum
    }

    /// # Safety
    /// NEON; `x` and `y` the same length.
    #[target_feature(enable = "neon")]
    pub unsafe fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        let t = f16_table();
        let mut sum = 0f32;
        for (x, y) in x.iter().zip(y) {
            let acc = dot16(
                vdupq_n_s32(0),
                vld1q_s8(x.qs.as_ptr()),
                vld1q_s8(y.qs.as_ptr()),
            );
            let acc = dot16(
                acc,
                vld1q_s8(x.qs.as_ptr().add(16)),
                vld1q_s8(y.qs.as_ptr().add(16)),
            );
            sum += vaddvq_s32(acc) as f32 * h(t, x.d) * h(t, y.d);
        }
        sum
    }
}

/// AVX2 with FMA and F16C (every AVX2 CPU has the other two).
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-VNNI (`vpdpbusd` on 256-bit registers, VEX-encoded), on top of AVX2. Read once: CPUID
/// leaves the virtual machine on every call.
#[cfg(target_arch = "x86_64")]
fn has_avx_vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx2() && is_x86_feature_detected!("avxvnni"))
}

/// AVX-512 with byte and word instructions and VNNI, on top of AVX2 (the detection also checks
/// that the OS saves the 512-bit registers).
#[cfg(target_arch = "x86_64")]
fn has_avx512_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// The instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// ARM's Advanced SIMD: the byte dot products, bit-identical to the scalar reference.
    Neon,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// The same, with AVX-VNNI's one-instruction byte dot products (bit-identical to `Avx2`).
    AvxVnni,
    /// AVX-512 (F, BW, VNNI) for the panel kernels, sixteen weight rows per vector
    /// (bit-identical to `Avx2`); the rest runs as `AvxVnni`, or `Avx2` on a CPU without AVX-VNNI.
    Avx512Vnni,
}

impl Isa {
    /// The best this CPU has; `RILL_KERNELS=scalar`, `avx2` or `avx-vnni` caps it, for
    /// benchmarks. An `Isa` reaches SIMD code only through [`checked`](Self::checked).
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let cap = std::env::var("RILL_KERNELS").unwrap_or_default();
            let available = Self::available();
            let cap = match cap.as_str() {
                "scalar" => Some(Isa::Scalar),
                "avx2" => Some(Isa::Avx2),
                "avx-vnni" => Some(Isa::AvxVnni),
                _ => None,
            };
            match cap {
                Some(isa) if available.contains(&isa) => isa,
                _ => available.last().copied().unwrap_or(Isa::Scalar),
            }
        })
    }

    /// Every instruction set this CPU can run, the best last (for tests against the reference).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push(Isa::Neon);
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            v.push(Isa::Avx2);
            if has_avx_vnni() {
                v.push(Isa::AvxVnni);
            }
            if has_avx512_vnni() {
                v.push(Isa::Avx512Vnni);
            }
        }
        v
    }

    /// Whether AVX2, FMA and F16C may be used (every x86 SIMD `Isa`).
    pub fn avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni)
    }

    /// Whether the 256-bit kernels may use AVX-VNNI's `vpdpbusd`.
    fn avx_vnni(self) -> bool {
        match self {
            Isa::AvxVnni => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => has_avx_vnni(),
            _ => false,
        }
    }

    /// `self` if this CPU runs it, else the scalar reference: every public entry point passes
    /// its `Isa` through here, so naming an instruction set the CPU lacks can never run it.
    pub fn checked(self) -> Isa {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        match AVAILABLE.get_or_init(Isa::available).contains(&self) {
            true => self,
            false => Isa::Scalar,
        }
    }

    pub fn dot_q4_1_q8_1(self, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        self.checked().dot_q4_1_q8_1_checked(x, y)
    }

    pub fn dot_q8_0_q8_0(self, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        self.checked().dot_q8_0_q8_0_checked(x, y)
    }

    /// [`dot_q4_1_q8_1`](Self::dot_q4_1_q8_1) for an `Isa` already [`checked`](Self::checked)
    /// (the matmuls check theirs once, when the matrix is made).
    fn dot_q4_1_q8_1_checked(self, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        assert_eq!(x.len(), y.len());
        match self {
            // SAFETY: `avx2()` ISAs are only ever chosen when the CPU reports AVX2, FMA and
            // F16C; `avx_vnni()` says whether it reports AVX-VNNI as well.
            #[cfg(target_arch = "x86_64")]
            _ if self.avx_vnni() => unsafe { avx2::dot_q4_1_q8_1::<true>(x, y) },
            #[cfg(target_arch = "x86_64")]
            _ if self.avx2() => unsafe { avx2::dot_q4_1_q8_1::<false>(x, y) },
            // SAFETY: `Neon` is only chosen when the CPU reports it.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { neon::dot_q4_1_q8_1(x, y) },
            _ => dot_q4_1_q8_1_scalar(x, y),
        }
    }

    /// As [`dot_q4_1_q8_1_checked`](Self::dot_q4_1_q8_1_checked).
    fn dot_q8_0_q8_0_checked(self, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        assert_eq!(x.len(), y.len());
        match self {
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            _ if self.avx_vnni() => unsafe { avx2::dot_q8_0_q8_0::<true>(x, y) },
            #[cfg(target_arch = "x86_64")]
            _ if self.avx2() => unsafe { avx2::dot_q8_0_q8_0::<false>(x, y) },
            // SAFETY: as above.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { neon::dot_q8_0_q8_0(x, y) },
            _ => dot_q8_0_q8_0_scalar(x, y),
        }
    }
}

enum Weights {
    Q4_1(Vec<BlockQ4_1>),
    /// Q4_1 in panels of eight rows, for the 256-bit panel kernels (rows a multiple of 8).
    Q4_1x8(Vec<PanelQ4_1<8>>),
    /// Q4_1 in panels of sixteen rows, for the AVX-512 panel kernel (rows a multiple of 16).
    Q4_1x16(Vec<PanelQ4_1<16>>),
    Q8_0(Vec<BlockQ8_0>),
    /// Q8_0 in panels of eight rows, for the AVX-VNNI panel kernel (rows a multiple of 8).
    Q8_0x8(Vec<PanelQ8_0<8>>),
    /// Q8_0 in panels of sixteen rows, for the AVX-512 panel kernel (rows a multiple of 16).
    Q8_0x16(Vec<PanelQ8_0<16>>),
}

impl Weights {
    /// Blocks of 32 weights held.
    fn n_blocks(&self) -> usize {
        match self {
            Weights::Q4_1(w) => w.len(),
            Weights::Q4_1x8(w) => 8 * w.len(),
            Weights::Q4_1x16(w) => 16 * w.len(),
            Weights::Q8_0(w) => w.len(),
            Weights::Q8_0x8(w) => 8 * w.len(),
            Weights::Q8_0x16(w) => 16 * w.len(),
        }
    }

    /// `more`'s rows after these; `None` unless both have the same format and layout.
    fn extend(&mut self, more: Weights) -> Option<()> {
        match (self, more) {
            (Weights::Q4_1(w), Weights::Q4_1(m)) => w.extend(m),
            (Weights::Q4_1x8(w), Weights::Q4_1x8(m)) => w.extend(m),
            (Weights::Q4_1x16(w), Weights::Q4_1x16(m)) => w.extend(m),
            (Weights::Q8_0(w), Weights::Q8_0(m)) => w.extend(m),
            (Weights::Q8_0x8(w), Weights::Q8_0x8(m)) => w.extend(m),
            (Weights::Q8_0x16(w), Weights::Q8_0x16(m)) => w.extend(m),
            _ => return None,
        }
        Some(())
    }
}

/// A quantised weight matrix `[n_out, k]` (GGUF's row-major layout) that our kernels run.
pub struct QLinear {
    weights: Weights,
    n_out: usize,
    k: usize,
    isa: Isa,
}

/// Weight rows per task: enough work per task to amortise rayon's hand-off, enough tasks to
/// balance the threads.
const ROWS_PER_TASK: usize = 64;

impl QLinear {
    /// The matrix, when its format is one the kernels run (Q4_1, Q8_0) and its rows are whole
    /// blocks; `None` leaves it to candle.
    pub fn from_qtensor(t: &QTensor, isa: Isa) -> Option<QLinear> {
        if !Self::supports(t) {
            return None;
        }
        let isa = isa.checked();
        let &[n_out, k] = t.shape().dims() else {
            return None;
        };
        let bytes = t.data().ok()?;
        let weights = match t.dtype() {
            GgmlDType::Q4_1 => Weights::Q4_1(blocks(&bytes)?),
            GgmlDType::Q8_0 => Weights::Q8_0(blocks(&bytes)?),
            GgmlDType::Q4_0 => Weights::Q4_1(q4_0_as_q4_1(&blocks(&bytes)?)),
            GgmlDType::Q5_0 => Weights::Q8_0(q5_0_as_q8_0(&blocks(&bytes)?)),
            GgmlDType::Q4K => Weights::Q4_1(q4_k_as_q4_1(&blocks(&bytes)?)),
            GgmlDType::Q6K => {
                // Dequantised and quantised again, a matrix at a time (see the module's notes).
                let x = t.dequantize(&Device::Cpu).ok()?.flatten_all().ok()?;
                let x = x.to_vec1::<f32>().ok()?;
                let mut w = vec![BlockQ8_0::default(); x.len() / QK];
                quantize_q8_0(&x, &mut w);
                Weights::Q8_0(w)
            }
            _ => return None,
        };
        if weights.n_blocks() != n_out * k / QK {
            return None;
        }
        // Panels where the rows allow them: sixteen rows with AVX-512, else eight with AVX2 for
        // Q4_1 and with AVX-VNNI for Q8_0 (without, its byte products would overflow the
        // 256-bit panel kernel's i16).
        let (kb, wide) = (k / QK, isa == Isa::Avx512Vnni && n_out % 16 == 0);
        let weights = match weights {
            Weights::Q4_1(w) if wide => Weights::Q4_1x16(to_panels(&w, kb)),
            Weights::Q4_1(w) if isa.avx2() && n_out % 8 == 0 => Weights::Q4_1x8(to_panels(&w, kb)),
            Weights::Q8_0(w) if wide => Weights::Q8_0x16(to_panels(&w, kb)),
            Weights::Q8_0(w) if isa.avx_vnni() && n_out % 8 == 0 => {
                Weights::Q8_0x8(to_panels(&w, kb))
            }
            w => w,
        };
        Some(QLinear {
            weights,
            n_out,
            k,
            isa,
        })
    }

    /// Whether [`from_qtensor`](Self::from_qtensor) takes this tensor (without copying it).
    pub fn supports(t: &QTensor) -> bool {
        matches!(t.shape().dims(), &[_, k] if k > 0 && k % QK == 0)
            && matches!(
                t.dtype(),
                GgmlDType::Q4_1
                    | GgmlDType::Q8_0
                    | GgmlDType::Q4_0
                    | GgmlDType::Q5_0
                    | GgmlDType::Q4K
                    | GgmlDType::Q6K
            )
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Row `j` as f32 into `out` (`k` values): an embedding lookup straight from the quantised
    /// table, so the table never has to exist in f32 (113 MB for a 49,152 × 576 vocabulary).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let kb = self.k / QK;
        let row = j * kb..(j + 1) * kb;
        match &self.weights {
            Weights::Q4_1(w) => dequantize_blocks(w[row].iter().copied(), out, dequantize_q4_1),
            Weights::Q4_1x8(w) => dequantize_blocks(panel_row(w, kb, j), out, dequantize_q4_1),
            Weights::Q4_1x16(w) => dequantize_blocks(panel_row(w, kb, j), out, dequantize_q4_1),
            Weights::Q8_0(w) => dequantize_blocks(w[row].iter().copied(), out, dequantize_q8_0),
            Weights::Q8_0x8(w) => dequantize_blocks(panel_row(w, kb, j), out, dequantize_q8_0),
            Weights::Q8_0x16(w) => dequantize_blocks(panel_row(w, kb, j), out, dequantize_q8_0),
        }
    }

    /// The rows `ids` as a `[ids.len(), k]` tensor; `None` when an id is out of range.
    pub fn rows(&self, ids: &[u32]) -> Option<candle_core::Result<Tensor>> {
        let mut out = vec![0f32; ids.len() * self.k];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.k)) {
            if id as usize >= self.n_out {
                return None;
            }
            self.dequantize_row(id as usize, o);
        }
        Some(Tensor::from_vec(out, (ids.len(), self.k), &Device::Cpu))
    }

    /// `out[i][j] = Σ_k x[i][k]·w[j][k]` for the `m` rows of `x` (`m × k`, row-major);
    /// `out` is `m × n_out`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(x.len(), m * self.k);
        assert_eq!(out.len(), m * self.n_out);
        match &self.weights {
            Weights::Q4_1(w) => rows_times(self.isa, w, x, m, self.k, out),
            Weights::Q4_1x8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Weights::Q4_1x16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Weights::Q8_0(w) => rows_times(self.isa, w, x, m, self.k, out),
            Weights::Q8_0x8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Weights::Q8_0x16(w) => panels_times(self.isa, w, x, m, self.k, out),
        }
    }

    /// `x · wᵀ` for a `[m, k]` tensor of f32 on the CPU.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (m, out) = self.run(x)?;
        Tensor::from_vec(out, (m, self.n_out), &Device::Cpu)
    }

    /// The product of a `[m, k]` tensor as `m` and a row-major `m × n_out` buffer.
    pub(crate) fn run(&self, x: &Tensor) -> candle_core::Result<(usize, Vec<f32>)> {
        let (m, k) = x.dims2()?;
        if k != self.k {
            candle_core::bail!("QLinear: input has {k} columns, the weights {}", self.k);
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        Ok((m, self.product(&xs, m)))
    }

    /// [`matmul`](Self::matmul) into a new `m × n_out` buffer.
    pub fn product(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * self.n_out];
        self.matmul(x, m, &mut out);
        out
    }

    /// Stacks matrices that read the same input (q, k and v; gate and up) into one, so one call
    /// quantises the input once and hands the threads one job. `None` unless all share the
    /// format, the input width and the instruction set.
    pub fn stack(parts: Vec<QLinear>) -> Option<QLinear> {
        let first = parts.first()?;
        let (k, isa) = (first.k, first.isa);
        if parts.iter().any(|p| p.k != k || p.isa != isa) {
            return None;
        }
        let n_out = parts.iter().map(|p| p.n_out).sum();
        let mut all = parts.into_iter();
        let mut weights = all.next()?.weights;
        for p in all {
            weights.extend(p.weights)?;
        }
        Some(QLinear {
            weights,
            n_out,
            k,
            isa,
        })
    }

    /// [`forward`](Self::forward) of a stacked matrix, cut back into its parts' outputs
    /// (`widths`, which add up to `n_out`).
    pub fn forward_parts(&self, x: &Tensor, widths: &[usize]) -> candle_core::Result<Vec<Tensor>> {
        // Cut from the product buffer itself, not from a tensor made of it and read back.
        let (m, whole) = self.run(x)?;
        let mut from = 0;
        widths
            .iter()
            .map(|&w| {
                let part: Vec<f32> = whole
                    .chunks_exact(self.n_out)
                    .flat_map(|row| &row[from..from + w])
                    .copied()
                    .collect();
                from += w;
                Tensor::from_vec(part, (m, w), &Device::Cpu)
            })
            .collect()
    }
}

/// The tiles of [`Format::rows`] on AVX2 for one format: `(w, acts, is, out, sj, si)`.
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-VNNI for the VNNI one); the bounds [`Format::rows`] asserts.
#[cfg(target_arch = "x86_64")]
type RowsFn<F, A> = unsafe fn(&[F], &Acts<A>, std::ops::Range<usize>, &mut [f32], usize, usize);

/// A weight block format the kernels run, and the activation blocks it is dotted with.
trait Format: Copy + Sync {
    type Act: Copy + Default + Send + Sync;
    /// ggml's quantisation of an activation row, the scalar reference.
    const QUANTIZE: fn(&[f32], &mut [Self::Act]);
    /// The same with AVX2, bit for bit (needs AVX2, FMA and F16C).
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [Self::Act]);
    /// The tiles of [`rows`](Self::rows) on AVX2: without AVX-VNNI, and with it.
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, Self::Act>; 2];
    /// An activation row quantised with the best of `isa`.
    fn quantize(isa: Isa, x: &[f32], out: &mut [Self::Act]) {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C.
            return unsafe { (Self::QUANTIZE_AVX2)(x, out) };
        }
        let _ = isa;
        (Self::QUANTIZE)(x, out)
    }
    /// `(d, s)` of an activation block (`s` = d·Σq, or 0 when the format needs none).
    fn act_scales(a: &Self::Act, t: &[f32]) -> (f32, f32);
    /// With an `isa` already [`checked`](Isa::checked) (the matrix's).
    fn dot(isa: Isa, w: &[Self], a: &[Self::Act]) -> f32;
    /// Every weight row `j` of `w` (whole rows of `acts.kb` blocks) dotted with every
    /// activation row `i` in `is`, into `out[j·sj + (i - is.start)·si]`.
    fn rows(
        isa: Isa,
        w: &[Self],
        acts: &Acts<Self::Act>,
        is: std::ops::Range<usize>,
        out: &mut [f32],
        sj: usize,
        si: usize,
    ) {
        let kb = acts.kb;
        let n = w.len() / kb;
        assert!(w.len().is_multiple_of(kb) && is.start < is.end && is.end * kb <= acts.q.len());
        assert!(acts.d.len() == acts.q.len() && acts.s.len() >= kb * acts.stride);
        assert!(is.start.is_multiple_of(TILE_A) && acts.stride >= is.end.div_ceil(TILE_A) * TILE_A);
        assert!(n == 0 || (n - 1) * sj + (is.len() - 1) * si < out.len());
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            let tiles = Self::ROWS_AVX2[usize::from(isa.avx_vnni())];
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C (and
            // AVX-VNNI where `avx_vnni()`, which picks the VNNI tiles); every row, scale (tiles
            // start at whole tiles and `s` is padded to whole tiles) and output the tiles touch
            // is inside the bounds asserted above.
            return unsafe { tiles(w, acts, is, out, sj, si) };
        }
        // Otherwise the dot product pair by pair (the scalar reference, or NEON's, which gives
        // the same bits): the same numbers a row gets alone.
        for j in 0..n {
            for i in is.clone() {
                let (x, y) = (&w[j * kb..(j + 1) * kb], &acts.q[i * kb..(i + 1) * kb]);
                out[j * sj + (i - is.start) * si] = Self::dot(isa, x, y);
            }
        }
    }
}

impl Format for BlockQ4_1 {
    type Act = BlockQ8_1;
    const QUANTIZE: fn(&[f32], &mut [BlockQ8_1]) = quantize_q8_1;
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [BlockQ8_1]) = avx2::quantize_q8_1;
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, BlockQ8_1>; 2] =
        [avx2::rows_q4_1::<false>, avx2::rows_q4_1::<true>];
    fn act_scales(a: &BlockQ8_1, t: &[f32]) -> (f32, f32) {
        (h(t, a.d), h(t, a.s))
    }
    fn dot(isa: Isa, w: &[Self], a: &[BlockQ8_1]) -> f32 {
        isa.dot_q4_1_q8_1_checked(w, a)
    }
}

impl Format for BlockQ8_0 {
    type Act = BlockQ8_0;
    const QUANTIZE: fn(&[f32], &mut [BlockQ8_0]) = quantize_q8_0;
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [BlockQ8_0]) = avx2::quantize_q8_0;
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, BlockQ8_0>; 2] =
        [avx2::rows_q8_0::<false>, avx2::rows_q8_0::<true>];
    fn act_scales(a: &BlockQ8_0, t: &[f32]) -> (f32, f32) {
        (h(t, a.d), 0.0)
    }
    fn dot(isa: Isa, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        isa.dot_q8_0_q8_0_checked(w, a)
    }
}

/// Activations quantised once per call, with their blocks' scales as f32: `d` row-major,
/// `s` block-major with a stride of `m` rounded up to a whole tile (zeros after the last row).
struct Acts<A> {
    q: Vec<A>,
    d: Vec<f32>,
    s: Vec<f32>,
    stride: usize,
    kb: usize,
}

/// Activation rows per tile: each weight block is unpacked once for 4 activation rows.
const TILE_A: usize = 4;

/// Activation rows per task when a call has many (a prefill chunk).
const ACT_ROWS_PER_TASK: usize = 32;

/// The `m` rows of `x` (`k` wide) quantised for format `F`; across the threads when there are
/// many.
fn quantize_rows<F: Format>(isa: Isa, x: &[f32], m: usize, k: usize) -> Vec<F::Act> {
    let kb = k / QK;
    let mut q = vec![F::Act::default(); m * kb];
    if m < ACT_ROWS_PER_TASK {
        for (row, q) in x.chunks_exact(k).zip(q.chunks_exact_mut(kb)) {
            F::quantize(isa, row, q);
        }
    } else {
        x.par_chunks_exact(k)
            .zip(q.par_chunks_exact_mut(kb))
            .with_min_len(ACT_ROWS_PER_TASK / 2)
            .for_each(|(row, q)| F::quantize(isa, row, q));
    }
    q
}

/// A pointer the tasks of one matmul share, each writing outputs no other task writes.
struct SharedOut(*mut f32);
// SAFETY: only used by `panels_times`, whose tasks write disjoint elements (see there).
unsafe impl Sync for SharedOut {}

/// [`rows_times`] for matrices in panels (made only for x86's SIMD: see
/// `QLinear::from_qtensor`). Every split runs the same panel kernel, which sums each output in
/// the same order whatever rows are beside it, so a row's output is the same alone, in a batch
/// or in a prefill chunk.
fn panels_times<P: Kernel>(isa: Isa, w: &[P], x: &[f32], m: usize, k: usize, out: &mut [f32]) {
    let kb = k / QK;
    let n_out = w.len() / kb * P::ROWS;
    let q = quantize_rows::<P::Block>(isa, x, m, k);
    let t = f16_table();
    let (d, s): (Vec<f32>, Vec<f32>) = q.iter().map(|a| P::Block::act_scales(a, t)).unzip();
    let mut acts = PanelActs { q, d, s, kb };
    let panels = n_out / P::ROWS;
    // Panels per task when a call splits the weight rows: `ROWS_PER_TASK` rows.
    let per_task = ROWS_PER_TASK / P::ROWS;
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        P::prepare(&mut acts.q);
        let (acts, kernel) = (&acts, P::kernel(isa));
        let run = |ps: std::ops::Range<usize>, is: std::ops::Range<usize>, o: *mut f32| {
            // SAFETY: the matrix's `isa` is `checked`, and its panels are only made where that
            // `isa` runs their kernel (`from_qtensor`); `ps` and `is` are within the panels and
            // rows, and `o` points at the output of row `is.start` (column 0) of a row-major
            // buffer `n_out` wide holding rows `is`.
            unsafe { kernel(w, acts, ps, is, o, n_out) }
        };
        if m >= 2 * ACT_ROWS_PER_TASK {
            // Many rows: each task its own activation rows (and so its own output rows).
            out.par_chunks_mut(ACT_ROWS_PER_TASK * n_out)
                .enumerate()
                .for_each(|(task, chunk)| {
                    let first = task * ACT_ROWS_PER_TASK;
                    let rows = chunk.len() / n_out;
                    run(0..panels, first..first + rows, chunk.as_mut_ptr());
                });
        } else {
            // A few rows: each task its own panels, i.e. its own 64 columns of every row, so
            // no two tasks write the same element of `out`.
            assert_eq!(out.len(), m * n_out);
            let o = SharedOut(out.as_mut_ptr());
            let o = &o;
            (0..panels.div_ceil(per_task))
                .into_par_iter()
                .for_each(|task| {
                    let ps = task * per_task..((task + 1) * per_task).min(panels);
                    run(ps, 0..m, o.0);
                });
        }
        return;
    }
    // Panels are only made for x86's SIMD; should one reach here, the scalar dot product per
    // pair.
    for (i, row) in out.chunks_exact_mut(n_out).enumerate() {
        let a = &acts.q[i * kb..(i + 1) * kb];
        for (j, o) in row.iter_mut().enumerate() {
            let blocks: Vec<P::Block> = panel_row(w, kb, j).collect();
            *o = P::Block::dot(Isa::Scalar, &blocks, a);
        }
    }
}

/// Quantised activation rows for a panel kernel, with their blocks' `d` and `s` as f32
/// (row-major, `kb` per row).
struct PanelActs<A> {
    q: Vec<A>,
    d: Vec<f32>,
    s: Vec<f32>,
    kb: usize,
}

/// Every weight row (of `w`, `k / 32` blocks each) dotted with every row of `x` (`m × k`,
/// quantised once) into `out` (`m × n_out`). One row (decode): the weight rows are split across
/// rayon's pool, one dot product each. A few rows (a batched decode): still split by weight rows,
/// in tiles of 2 weight rows × 4 activation rows, and gathered back. Many rows (prefill): the
/// activation rows are split instead, each task writing its own output rows while each pair of
/// weight rows, read once per task, stays in L1 for all of the task's rows.
fn rows_times<F: Format>(isa: Isa, w: &[F], x: &[f32], m: usize, k: usize, out: &mut [f32]) {
    let kb = k / QK;
    let n_out = w.len() / kb;
    let q = quantize_rows::<F>(isa, x, m, k);
    if m == 1 {
        out.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (r, d) in chunk.iter_mut().enumerate() {
                    let j = task * ROWS_PER_TASK + r;
                    *d = F::dot(isa, &w[j * kb..(j + 1) * kb], &q);
                }
            });
        return;
    }
    let t = f16_table();
    let stride = m.div_ceil(TILE_A) * TILE_A;
    let mut d = vec![0f32; m * kb];
    let mut s = vec![0f32; stride * kb];
    for (n, a) in q.iter().enumerate() {
        let (i, b) = (n / kb, n % kb);
        (d[n], s[b * stride + i]) = F::act_scales(a, t);
    }
    let acts = Acts {
        q,
        d,
        s,
        stride,
        kb,
    };
    if m >= 2 * ACT_ROWS_PER_TASK {
        out.par_chunks_mut(ACT_ROWS_PER_TASK * n_out)
            .enumerate()
            .for_each(|(task, chunk)| {
                let first = task * ACT_ROWS_PER_TASK;
                let rows = chunk.len() / n_out;
                F::rows(isa, w, &acts, first..first + rows, chunk, 1, n_out);
            });
        return;
    }
    // Transposed result (`n_out × m`): each task owns whole weight rows.
    let mut out_t = vec![0f32; n_out * m];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each(|(task, chunk)| {
            let first = task * ROWS_PER_TASK;
            let rows = chunk.len() / m;
            F::rows(
                isa,
                &w[first * kb..(first + rows) * kb],
                &acts,
                0..m,
                chunk,
                m,
                1,
            );
        });
    for (i, row) in out.chunks_exact_mut(n_out).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = out_t[j * m + i];
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl QLinear {
        /// Row `j`'s Q4_1 blocks, from either layout.
        fn q4_1_row(&self, j: usize) -> Option<Vec<BlockQ4_1>> {
            let kb = self.k / QK;
            match &self.weights {
                Weights::Q4_1(w) => Some(w[j * kb..(j + 1) * kb].to_vec()),
                Weights::Q4_1x8(w) => Some(panel_row(w, kb, j).collect()),
                Weights::Q4_1x16(w) => Some(panel_row(w, kb, j).collect()),
                _ => None,
            }
        }

        /// Row `j`'s Q8_0 blocks, from either layout.
        fn q8_0_row(&self, j: usize) -> Option<Vec<BlockQ8_0>> {
            let kb = self.k / QK;
            match &self.weights {
                Weights::Q8_0(w) => Some(w[j * kb..(j + 1) * kb].to_vec()),
                Weights::Q8_0x8(w) => Some(panel_row(w, kb, j).collect()),
                Weights::Q8_0x16(w) => Some(panel_row(w, kb, j).collect()),
                _ => None,
            }
        }
    }

    /// A small deterministic generator (the tests need no `rand`).
    pub(crate) struct Lcg(pub u64);
    impl Lcg {
        /// Uniform in [-1, 1).
        pub fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
        pub fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next()).collect()
        }
    }

    fn q4_1(x: &[f32]) -> Vec<BlockQ4_1> {
        // ggml's quantize_row_q4_1.
        x.chunks_exact(QK)
            .map(|xs| {
                let min = xs.iter().copied().fold(f32::INFINITY, f32::min);
                let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let mut b = BlockQ4_1 {
                    d: f16::from_f32(d).to_bits(),
                    m: f16::from_f32(min).to_bits(),
                    qs: [0; 16],
                };
                for j in 0..16 {
                    let q0 = (((xs[j] - min) * id + 0.5) as u8).min(15);
                    let q1 = (((xs[j + 16] - min) * id + 0.5) as u8).min(15);
                    b.qs[j] = q0 | (q1 << 4);
                }
                b
            })
            .collect()
    }

    #[test]
    fn every_simd_dot_product_equals_the_scalar_reference() {
        let mut r = Lcg(7);
        // 1, 3 and 18 blocks (this model's 576 columns), 49 (ragged), 96.
        for blocks in [1, 3, 18, 49, 96] {
            let w = r.vec(blocks * QK);
            let x: Vec<f32> = r.vec(blocks * QK).iter().map(|v| v * 3.0).collect();
            let wq = q4_1(&w);
            let mut x1 = vec![BlockQ8_1::default(); blocks];
            quantize_q8_1(&x, &mut x1);
            let mut w8 = vec![BlockQ8_0::default(); blocks];
            let mut x8 = vec![BlockQ8_0::default(); blocks];
            quantize_q8_0(&w, &mut w8);
            quantize_q8_0(&x, &mut x8);
            let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
            let (ref41, ref80) = (
                dot_q4_1_q8_1_scalar(&wq, &x1),
                dot_q8_0_q8_0_scalar(&w8, &x8),
            );
            // The reference is the real product, up to quantisation error.
            let scale = (blocks * QK) as f32;
            assert!(
                (ref41 - exact).abs() < 0.1 * scale.sqrt() * 3.0,
                "{ref41} vs {exact}"
            );
            assert!(
                (ref80 - exact).abs() < 0.02 * scale.sqrt() * 3.0,
                "{ref80} vs {exact}"
            );
            for isa in Isa::available() {
                let (a, b) = (isa.dot_q4_1_q8_1(&wq, &x1), isa.dot_q8_0_q8_0(&w8, &x8));
                let tol = |v: f32| 1e-4 * v.abs().max(1.0);
                assert!(
                    (a - ref41).abs() <= tol(ref41),
                    "{isa:?} q4_1 {blocks}: {a} vs {ref41}"
                );
                assert!(
                    (b - ref80).abs() <= tol(ref80),
                    "{isa:?} q8_0 {blocks}: {b} vs {ref80}"
                );
                if isa == Isa::Neon {
                    // NEON only computes the integer sums; the rest is the reference's own code.
                    assert_eq!(
                        (a.to_bits(), b.to_bits()),
                        (ref41.to_bits(), ref80.to_bits())
                    );
                }
            }
        }
    }

    /// Every tile shape (1–2 weight rows × 1–4 activation rows), both splits of the work and
    /// both formats give each output what the scalar dot product of its pair gives.
    #[test]
    fn every_tile_equals_the_scalar_dot_products() {
        let mut r = Lcg(3);
        // 7 weight rows (a last odd one; no panels), 136 (17 panels of 8 with AVX2: three
        // tasks, the last short) and 144 (9 panels of 16 with AVX-512), 49 blocks (ragged); 1–9
        // rows (decode, batched decode, every remainder of 4) and 70 (prefill, the last task
        // short).
        let k = 49 * QK;
        for (n_out, dtype) in [7, 136, 144]
            .into_iter()
            .flat_map(|n| [(n, GgmlDType::Q4_1), (n, GgmlDType::Q8_0)])
        {
            let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&wt, dtype).unwrap();
            for m in (1..=9).chain([70]) {
                let x = r.vec(m * k);
                for isa in Isa::available() {
                    let lin = QLinear::from_qtensor(&q, isa).unwrap();
                    let mut out = vec![0f32; m * n_out];
                    lin.matmul(&x, m, &mut out);
                    for (i, row) in out.chunks_exact(n_out).enumerate() {
                        let xs = &x[i * k..(i + 1) * k];
                        for (j, &v) in row.iter().enumerate() {
                            let want = match &lin.weights {
                                Weights::Q4_1(_) | Weights::Q4_1x8(_) | Weights::Q4_1x16(_) => {
                                    let mut a = vec![BlockQ8_1::default(); k / QK];
                                    quantize_q8_1(xs, &mut a);
                                    let w = lin.q4_1_row(j).unwrap();
                                    dot_q4_1_q8_1_scalar(&w, &a)
                                }
                                Weights::Q8_0(_) | Weights::Q8_0x8(_) | Weights::Q8_0x16(_) => {
                                    let mut a = vec![BlockQ8_0::default(); k / QK];
                                    quantize_q8_0(xs, &mut a);
                                    let w = lin.q8_0_row(j).unwrap();
                                    dot_q8_0_q8_0_scalar(&w, &a)
                                }
                            };
                            assert!(
                                (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                                "{dtype:?} {isa:?} m={m} ({i}, {j}): {v} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A row's output is the same, bit for bit, alone (the dot products) and among others (the
    /// tiles, either split): decoding answers together changes none of their numbers, and a
    /// prefill chunk's matmuls give each row what a one-row step would.
    #[test]
    fn an_instruction_set_the_cpu_lacks_runs_the_reference() {
        // The other architecture's SIMD is never available here.
        #[cfg(target_arch = "x86_64")]
        let foreign = Isa::Neon;
        #[cfg(not(target_arch = "x86_64"))]
        let foreign = Isa::AvxVnni;
        assert_eq!(foreign.checked(), Isa::Scalar);
        let mut r = Lcg(5);
        let w = q4_1(&r.vec(4 * QK));
        let mut a = vec![BlockQ8_1::default(); 4];
        quantize_q8_1(&r.vec(4 * QK), &mut a);
        assert_eq!(
            foreign.dot_q4_1_q8_1(&w, &a).to_bits(),
            dot_q4_1_q8_1_scalar(&w, &a).to_bits()
        );
    }

    #[test]
    fn the_vector_quantisers_equal_the_scalar_ones() {
        let mut rng = Lcg(21);
        // Random blocks at several scales, an all-zero block, and blocks whose max is 127 so
        // that x / d lands on halves (rounded away from zero, not to even).
        let mut x: Vec<f32> = [1e-3f32, 1.0, 300.0]
            .iter()
            .flat_map(|s| rng.vec(8 * QK).into_iter().map(move |v| v * s))
            .collect();
        x.extend([0.0; QK]);
        for sign in [1.0f32, -1.0] {
            x.push(127.0 * sign);
            x.extend((1..QK).map(|i| sign * (i as f32 * 4.0 - 0.5)));
        }
        let blocks = x.len() / QK;
        for isa in Isa::available().into_iter().filter(|i| i.avx2()) {
            let (mut a0, mut b0) = (vec![BlockQ8_0 { d: 0, qs: [0; QK] }; blocks], vec![]);
            b0.resize(blocks, a0[0]);
            quantize_q8_0(&x, &mut a0);
            BlockQ8_0::quantize(isa, &x, &mut b0);
            assert_eq!(a0, b0, "{isa:?} q8_0");
            let mut a1 = vec![BlockQ8_1::default(); blocks];
            let mut b1 = vec![BlockQ8_1::default(); blocks];
            quantize_q8_1(&x, &mut a1);
            BlockQ4_1::quantize(isa, &x, &mut b1);
            assert_eq!(a1, b1, "{isa:?} q8_1");
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_in_a_batch() {
        let mut r = Lcg(31);
        for n_out in [11, 136, 144] {
            a_row_gives_the_same_bits(&mut r, n_out);
        }
    }

    /// [`a_row_gives_the_same_bits_alone_and_in_a_batch`] for `n_out` weight rows (136: panels
    /// of 8; 144: of 16 with AVX-512).
    fn a_row_gives_the_same_bits(r: &mut Lcg, n_out: usize) {
        let k = 576;
        let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::Q4_1,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            let k = if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) {
                512
            } else {
                k
            };
            let wt = wt.narrow(1, 0, k).unwrap().contiguous().unwrap();
            let q = QTensor::quantize(&wt, dtype).unwrap();
            for isa in Isa::available() {
                let lin = QLinear::from_qtensor(&q, isa).unwrap();
                for m in [3, 70] {
                    let x = r.vec(m * k);
                    let mut together = vec![0f32; m * n_out];
                    lin.matmul(&x, m, &mut together);
                    for (i, row) in together.chunks_exact(n_out).enumerate() {
                        let mut alone = vec![0f32; n_out];
                        lin.matmul(&x[i * k..(i + 1) * k], 1, &mut alone);
                        assert_eq!(row, &alone[..], "{dtype:?} {isa:?} m={m} row {i}");
                    }
                }
            }
        }
    }

    /// The panel kernels of every instruction set give the same bits: AVX2's (`maddubs`),
    /// AVX-VNNI's and AVX-512's (panels of sixteen rows), so a faster CPU changes no answer.
    #[test]
    fn every_panel_kernel_gives_the_same_bits() {
        let mut r = Lcg(41);
        let k = 576;
        // One panel of eight (AVX-512 runs it with the 256-bit kernels), 17 of eight, 9 of
        // sixteen (the last task short).
        for n_out in [8, 136, 144] {
            let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
            for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
                let q = QTensor::quantize(&wt, dtype).unwrap();
                let panels: Vec<(Isa, QLinear)> = Isa::available()
                    .into_iter()
                    .map(|isa| (isa, QLinear::from_qtensor(&q, isa).unwrap()))
                    .filter(|(_, l)| !matches!(l.weights, Weights::Q4_1(_) | Weights::Q8_0(_)))
                    .collect();
                for m in [1, 3, 4, 5, 70] {
                    let x = r.vec(m * k);
                    let run = |l: &QLinear| {
                        let mut out = vec![0f32; m * n_out];
                        l.matmul(&x, m, &mut out);
                        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    };
                    let Some(((first, reference), rest)) = panels.split_first() else {
                        continue;
                    };
                    let want = run(reference);
                    for (isa, l) in rest {
                        assert!(
                            run(l) == want,
                            "{dtype:?} n_out={n_out} m={m}: {isa:?} differs from {first:?}"
                        );
                    }
                }
            }
        }
    }

    /// Every instruction set's kernels, rows and panels, against the integer definition of the
    /// product (issue 13: comparing panels with each other checks nothing on a CPU with one
    /// instruction set). Weights and activations are integers chosen so that every block's
    /// scale is exactly 1 (each block holds the largest magnitude) and every sum is exact in
    /// f32: any kernel whose integer block sums are right gives the exact product, bit for bit,
    /// whatever its order of additions. What this CPU cannot run is printed as skipped.
    fn layout(l: &QLinear) -> &'static str {
        match l.weights {
            Weights::Q4_1(_) | Weights::Q8_0(_) => "rows",
            Weights::Q4_1x8(_) | Weights::Q8_0x8(_) => "panels of 8",
            Weights::Q4_1x16(_) | Weights::Q8_0x16(_) => "panels of 16",
        }
    }

    #[test]
    fn every_kernel_gives_the_exact_integer_product() {
        let mut r = Lcg(43);
        let k = 576;
        let all = [
            Isa::Scalar,
            Isa::Neon,
            Isa::Avx2,
            Isa::AvxVnni,
            Isa::Avx512Vnni,
        ];
        let available = Isa::available();
        let skipped: Vec<_> = all.iter().filter(|i| !available.contains(i)).collect();
        eprintln!(
            "instruction sets checked: {available:?}; skipped (not on this CPU): {skipped:?}"
        );
        // Integers in [lo, hi] with the block's first element at `top`, so each 32-value
        // block's quantisation scale is exactly 1.
        let ints = |r: &mut Lcg, n: usize, lo: i32, hi: i32, top: i32| -> Vec<f32> {
            (0..n)
                .map(|i| match i % 32 {
                    0 => top as f32,
                    _ => {
                        let u = (r.next() + 1.0) / 2.0; // [0, 1)
                        (lo + ((u * (hi - lo + 1) as f32) as i32).min(hi - lo)) as f32
                    }
                })
                .collect()
        };
        for n_out in [8, 16, 136, 144] {
            // Q8_0: weights in [-127, 127] (scale 1); Q4_1: in [-8, 7] (scale 1, minimum -8).
            for (dtype, lo, hi, top) in [
                (GgmlDType::Q8_0, -127, 127, 127),
                (GgmlDType::Q4_1, -8, 7, -8),
            ] {
                let mut w = ints(&mut r, n_out * k, lo, hi, top);
                if dtype == GgmlDType::Q4_1 {
                    // Each block also needs its maximum 7, for a scale of (7 - -8) / 15 = 1.
                    for b in w.chunks_mut(32) {
                        b[1] = 7.0;
                    }
                }
                let wt = Tensor::from_vec(w.clone(), (n_out, k), &Device::Cpu).unwrap();
                let q = QTensor::quantize(&wt, dtype).unwrap();
                for m in [1, 4, 5, 70] {
                    let x = ints(&mut r, m * k, -127, 127, 127);
                    let exact: Vec<f32> = (0..m)
                        .flat_map(|i| {
                            let (x, w) = (&x, &w);
                            (0..n_out).map(move |j| {
                                (0..k)
                                    .map(|c| x[i * k + c] as i64 * w[j * k + c] as i64)
                                    .sum::<i64>() as f32
                            })
                        })
                        .collect();
                    for &isa in &available {
                        let l = QLinear::from_qtensor(&q, isa).unwrap();
                        let mut out = vec![0f32; m * n_out];
                        l.matmul(&x, m, &mut out);
                        let bad = out
                            .iter()
                            .zip(&exact)
                            .position(|(a, b)| a.to_bits() != b.to_bits());
                        assert!(
                            bad.is_none(),
                            "{dtype:?} n_out={n_out} m={m} {isa:?} ({}): element {bad:?} is {} \
                             instead of {}",
                            layout(&l),
                            out[bad.unwrap_or(0)],
                            exact[bad.unwrap_or(0)]
                        );
                    }
                }
            }
        }
    }

    /// candle's own matmul quantises activations the same way (ggml's), so the two agree up to
    /// the order of float additions.
    #[test]
    fn the_matmul_equals_candles_on_the_same_weights() {
        let mut r = Lcg(11);
        // 70 rows (no panels), 72 (panels of 8 with AVX2) and 80 (of 16 with AVX-512).
        for n_out in [70, 72, 80] {
            the_matmul_equals_candles(&mut r, n_out);
        }
    }

    fn the_matmul_equals_candles(r: &mut Lcg, n_out: usize) {
        use candle_core::Module;
        let k = 576;
        let w = r.vec(n_out * k);
        let wt = Tensor::from_vec(w, (n_out, k), &Device::Cpu).unwrap();
        // 1 row (decode), 5 (split by weight rows), 37 (prefill: split by activation rows,
        // the last task short).
        for (m, dtype) in [1, 5, 37]
            .into_iter()
            .flat_map(|m| [(m, GgmlDType::Q4_1), (m, GgmlDType::Q8_0)])
        {
            let xt = Tensor::from_vec(r.vec(m * k), (m, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let theirs = candle_core::quantized::QMatMul::from_qtensor(
                QTensor::quantize(&wt, dtype).unwrap(),
            )
            .unwrap()
            .forward(&xt)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
            for isa in Isa::available() {
                let lin = QLinear::from_qtensor(&q, isa).expect("a supported format");
                let ours = lin.forward(&xt).unwrap().to_vec2::<f32>().unwrap();
                for (a, b) in ours.iter().flatten().zip(theirs.iter().flatten()) {
                    assert!(
                        (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                        "{dtype:?} {isa:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_stacked_matrix_gives_each_part_its_own_output() {
        // Panels of eight rows, and of sixteen with AVX-512.
        for rows in [[40, 8, 8], [48, 16, 16]] {
            a_stacked_matrix_gives_each_part(rows);
        }
    }

    fn a_stacked_matrix_gives_each_part(rows: [usize; 3]) {
        let mut r = Lcg(5);
        let k = 64;
        let parts: Vec<(usize, Tensor)> = rows
            .into_iter()
            .map(|n| {
                (
                    n,
                    Tensor::from_vec(r.vec(n * k), (n, k), &Device::Cpu).unwrap(),
                )
            })
            .collect();
        let x = Tensor::from_vec(r.vec(3 * k), (3, k), &Device::Cpu).unwrap();
        let lin = |t: &Tensor| {
            QLinear::from_qtensor(
                &QTensor::quantize(t, GgmlDType::Q4_1).unwrap(),
                Isa::detect(),
            )
            .unwrap()
        };
        let alone: Vec<Vec<Vec<f32>>> = parts
            .iter()
            .map(|(_, t)| lin(t).forward(&x).unwrap().to_vec2().unwrap())
            .collect();
        let stacked = QLinear::stack(parts.iter().map(|(_, t)| lin(t)).collect()).unwrap();
        let widths: Vec<usize> = parts.iter().map(|(n, _)| *n).collect();
        let outs = stacked.forward_parts(&x, &widths).unwrap();
        for (o, a) in outs.iter().zip(&alone) {
            assert_eq!(&o.to_vec2::<f32>().unwrap(), a);
        }
        // Mixed formats do not stack.
        let q8 = QLinear::from_qtensor(
            &QTensor::quantize(&parts[1].1, GgmlDType::Q8_0).unwrap(),
            Isa::detect(),
        )
        .unwrap();
        assert!(QLinear::stack(vec![lin(&parts[0].1), q8]).is_none());
    }

    #[test]
    fn rows_dequantise_like_candle() {
        // 16 rows: in panels of 8 with AVX2, of 16 with AVX-512.
        let wt = Tensor::from_vec(Lcg(9).vec(16 * 64), (16, 64), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let theirs = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            for isa in Isa::available() {
                let lin = QLinear::from_qtensor(&q, isa).unwrap();
                let ours = lin
                    .rows(&[12, 0, 12, 9])
                    .unwrap()
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap();
                let want = [12, 0, 12, 9].map(|j| theirs[j].clone()).to_vec();
                assert_eq!(ours, want, "{dtype:?} {isa:?}");
                assert!(lin.rows(&[16]).is_none());
            }
        }
    }

    /// The repacked formats: Q4_0's and Q5_0's rows come back exactly as candle dequantises
    /// them, Q4_K's within the f16 rounding of their sub-block scales, Q6_K's within half an
    /// 8-bit step.
    #[test]
    fn repacked_formats_dequantise_like_candle() {
        let (n, k) = (6, 512);
        let wt = Tensor::from_vec(Lcg(21).vec(n * k), (n, k), &Device::Cpu).unwrap();
        for (dtype, tol) in [
            (GgmlDType::Q4_0, 0.0),
            (GgmlDType::Q5_0, 0.0),
            (GgmlDType::Q4K, 1.5e-3),
            (GgmlDType::Q6K, 1.0 / 200.0),
        ] {
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let theirs = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let lin = QLinear::from_qtensor(&q, Isa::detect()).expect("a repacked format");
            let ids: Vec<u32> = (0..n as u32).collect();
            let ours = lin.rows(&ids).unwrap().unwrap().to_vec2::<f32>().unwrap();
            for (a, b) in ours.iter().zip(&theirs) {
                let max = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= tol * max, "{dtype:?}: {x} vs {y}");
                }
            }
        }
    }

    /// Their products against the exact product of the weights as candle dequantises them: off
    /// only by the rounding of the 8-bit activations (and Q6_K's requantisation), a small part
    /// of Σ|w·x|. A wrong nibble or scale layout would be off by a large part of it.
    #[test]
    fn the_repacked_formats_multiply_like_their_weights() {
        let mut r = Lcg(23);
        // 16 rows: Q4_0 and Q4_K repacked into Q4_1 go on into panels with AVX2.
        let (n_out, k) = (16, 768);
        let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::Q4_0,
            GgmlDType::Q5_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let w = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            for m in [1, 5, 70] {
                let x = r.vec(m * k);
                for isa in Isa::available() {
                    let lin = QLinear::from_qtensor(&q, isa).unwrap();
                    let mut out = vec![0f32; m * n_out];
                    lin.matmul(&x, m, &mut out);
                    for (i, row) in out.chunks_exact(n_out).enumerate() {
                        let xs = &x[i * k..(i + 1) * k];
                        for (j, &v) in row.iter().enumerate() {
                            let exact: f32 = w[j].iter().zip(xs).map(|(a, b)| a * b).sum();
                            let size: f32 = w[j].iter().zip(xs).map(|(a, b)| (a * b).abs()).sum();
                            assert!(
                                (v - exact).abs() <= 0.01 * size,
                                "{dtype:?} {isa:?} m={m}: {v} vs {exact} (Σ|w·x| {size})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unsupported_formats_and_ragged_rows_are_left_to_candle() {
        let wt = Tensor::zeros((8, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q5K, GgmlDType::Q5_1, GgmlDType::F16] {
            let q = QTensor::quantize(&wt, dtype).unwrap();
            assert!(
                QLinear::from_qtensor(&q, Isa::Scalar).is_none(),
                "{dtype:?}"
            );
        }
        // An empty row (a malformed file) is not ours to divide by.
        let empty = Tensor::zeros((8, 0), candle_core::DType::F32, &Device::Cpu).unwrap();
        let q = QTensor::quantize(&empty, GgmlDType::Q8_0).unwrap();
        assert!(QLinear::from_qtensor(&q, Isa::Scalar).is_none());
    }
}
