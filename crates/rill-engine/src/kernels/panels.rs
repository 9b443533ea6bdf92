//! Panels: the weight rows of a matrix interleaved in eights or sixteens, so that one vector
//! holds the same weights of every row (the layout the panel kernels read), and the traits
//! that tie a panel to its block format and kernel.

use super::*;

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

/// Element `e` (0..32) of 16 bytes of nibbles laid out as Q4_0's and Q4_1's: element j in
/// the low nibble of byte j, element j + 16 in its high nibble.
pub(crate) fn nibble(qs: &[u8; QK / 2], e: usize) -> u8 {
    match e < QK / 2 {
        true => qs[e] & 0x0F,
        false => qs[e - QK / 2] >> 4,
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

/// `R` weight rows' Q4_0 blocks at the same position: [`PanelQ4_1`] without `m`, which the
/// kernels take as `−8·d`. As many bytes as the `R` blocks were.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PanelQ4_0<const R: usize> {
    pub d: [u16; R],
    pub qs: [[[u8; 4]; R]; 4],
}

const _: () = assert!(std::mem::size_of::<PanelQ4_0<8>>() == 8 * std::mem::size_of::<BlockQ4_0>());

/// The blocks of a panel's rows at one position, interleaved for a panel kernel.
pub(crate) trait Panel: Copy + Send + Sync + Sized {
    /// The format of one row's block.
    type Block: Copy + Sync;
    /// The activation blocks the panel is dotted with, one per block.
    type Act: Quantise;
    /// Weight rows per panel.
    const ROWS: usize;
    /// A panel of `rows` (`ROWS` of them).
    fn new(rows: &[&Self::Block]) -> Self;
    /// Row `k`'s block.
    fn block(&self, k: usize) -> Self::Block;
    /// Quantised activations as the kernel reads them.
    fn prepare(_acts: &mut [Act<Self>]) {}
    /// The scalar reference: one row's blocks dotted with an activation row.
    fn dot_ref(w: &[Self::Block], a: &[Act<Self>]) -> f32;
}

/// The activation blocks a panel is dotted with.
pub(crate) type Act<P> = <P as Panel>::Act;

/// The 4-bit panels of 32-weight blocks, read by the same kernels: Q4_1's, and Q4_0's, whose
/// offset `m` is `−8·d`.
pub(crate) trait Nibbles<const R: usize> {
    fn d(&self) -> &[u16; R];
    /// The rows' `m` as f16; `None` where it is `−8·d` (Q4_0).
    fn m(&self) -> Option<&[u16; R]>;
    fn qs(&self) -> &[[[u8; 4]; R]; 4];
}

impl<const R: usize> Nibbles<R> for PanelQ4_1<R> {
    #[inline(always)]
    fn d(&self) -> &[u16; R] {
        &self.d
    }
    #[inline(always)]
    fn m(&self) -> Option<&[u16; R]> {
        Some(&self.m)
    }
    #[inline(always)]
    fn qs(&self) -> &[[[u8; 4]; R]; 4] {
        &self.qs
    }
}

impl<const R: usize> Nibbles<R> for PanelQ4_0<R> {
    #[inline(always)]
    fn d(&self) -> &[u16; R] {
        &self.d
    }
    #[inline(always)]
    fn m(&self) -> Option<&[u16; R]> {
        None
    }
    #[inline(always)]
    fn qs(&self) -> &[[[u8; 4]; R]; 4] {
        &self.qs
    }
}

/// A panel kernel: panels `ps` of `w` × activation rows `is` into
/// `o[(i − is.start)·n_out + ROWS·p + k]`.
///
/// # Safety
/// The instructions it was chosen for (see [`Kernel::kernel`]); `ps` within `w`'s panels, `is`
/// within `acts`' rows, and `o` valid for those outputs.
#[cfg(target_arch = "x86_64")]
pub(crate) type KernelFn<P, A> =
    unsafe fn(&[P], &PanelActs<A>, std::ops::Range<usize>, std::ops::Range<usize>, *mut f32, usize);

/// A panel layout's kernels.
pub(crate) trait Kernel: Panel {
    /// The kernel for `isa`, which must be able to run this layout (see
    /// `QLinear::from_qtensor`).
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, Act<Self>>;
}

impl<const R: usize> Panel for PanelQ4_1<R> {
    type Block = BlockQ4_1;
    type Act = BlockQ8_1;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ4_1]) -> Self {
        assert_eq!(rows.len(), R);
        PanelQ4_1 {
            d: std::array::from_fn(|k| rows[k].d),
            m: std::array::from_fn(|k| rows[k].m),
            qs: interleave(|k, b| rows[k].qs[b]),
        }
    }

    fn block(&self, k: usize) -> BlockQ4_1 {
        BlockQ4_1 {
            d: self.d[k],
            m: self.m[k],
            qs: deinterleave(&self.qs, k),
        }
    }

    fn dot_ref(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
        dot_q4_1_q8_1_scalar(w, a)
    }
}

/// `R` rows' 32 nibbles in [`PanelQ4_1`]'s chunks, from their bytes as Q4_0 and Q4_1 pair
/// them (`byte(k, b)`: row k's byte b of 16, element b in its low nibble and b + 16 in its
/// high one): chunk c's lane k is row k's bytes `4c..4c+4`, so this is a copy.
/// (Plain loops: nested `array::from_fn` calls were not inlined, and loading a model is
/// mostly making panels.)
#[inline(always)]
pub(crate) fn interleave<const R: usize>(byte: impl Fn(usize, usize) -> u8) -> [[[u8; 4]; R]; 4] {
    let mut out = [[[0u8; 4]; R]; 4];
    for k in 0..R {
        for (c, chunk) in out.iter_mut().enumerate() {
            for (i, v) in chunk[k].iter_mut().enumerate() {
                *v = byte(k, 4 * c + i);
            }
        }
    }
    out
}

/// Row `k`'s nibbles out of [`interleave`]'s chunks, as a Q4_0 or Q4_1 block holds them.
pub(crate) fn deinterleave<const R: usize>(qs: &[[[u8; 4]; R]; 4], k: usize) -> [u8; QK / 2] {
    let element = |e: usize| {
        let (g, i) = (e / 4, e % 4);
        let byte = qs[g % 4][k][i];
        if g < 4 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    };
    std::array::from_fn(|j| element(j) | (element(j + QK / 2) << 4))
}

impl<const R: usize> Panel for PanelQ4_0<R> {
    type Block = BlockQ4_0;
    type Act = BlockQ8_1;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ4_0]) -> Self {
        assert_eq!(rows.len(), R);
        PanelQ4_0 {
            d: std::array::from_fn(|k| rows[k].d),
            qs: interleave(|k, b| rows[k].qs[b]),
        }
    }

    fn block(&self, k: usize) -> BlockQ4_0 {
        BlockQ4_0 {
            d: self.d[k],
            qs: deinterleave(&self.qs, k),
        }
    }

    fn dot_ref(w: &[BlockQ4_0], a: &[BlockQ8_1]) -> f32 {
        dot_q4_0_q8_1_scalar(w, a)
    }
}

impl<const R: usize> Panel for PanelQ8_0<R> {
    type Block = BlockQ8_0;
    type Act = BlockQ8_0;
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

    fn dot_ref(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
        dot_q8_0_q8_0_scalar(w, a)
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

impl Kernel for PanelQ4_0<8> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, BlockQ8_1> {
        match isa.avx_vnni() {
            true => avx2::panels_q4_0::<true>,
            false => avx2::panels_q4_0::<false>,
        }
    }
}

impl Kernel for PanelQ4_0<16> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8_1> {
        avx512::panels_q4_0
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
/// `ROWS·p..ROWS·(p+1)`) holds its `kb` blocks one after another. Made across rayon's threads
/// (each panel block on its own, so the result does not depend on how they split): loading a
/// model is mostly this.
pub(crate) fn to_panels<P: Panel>(w: &[P::Block], kb: usize) -> Vec<P> {
    let mut out = Vec::new();
    extend_panels(&mut out, w, kb);
    out
}

/// [`to_panels`] of `w` after the panels `out` holds, written in place (in its spare
/// capacity, where reserved).
pub(crate) fn extend_panels<P: Panel>(out: &mut Vec<P>, w: &[P::Block], kb: usize) {
    let panels = w.len() / kb / P::ROWS;
    out.par_extend((0..panels * kb).into_par_iter().with_min_len(256).map_init(
        || Vec::with_capacity(P::ROWS),
        |rows, n| {
            let (p, b) = (n / kb, n % kb);
            rows.clear();
            rows.extend((0..P::ROWS).map(|k| &w[(P::ROWS * p + k) * kb + b]));
            P::new(rows)
        },
    ));
}

/// Row `j`'s blocks out of a matrix in panels (`kb` blocks per row).
pub(crate) fn panel_row<P: Panel>(
    w: &[P],
    kb: usize,
    j: usize,
) -> impl Iterator<Item = P::Block> + '_ {
    let p = j / P::ROWS;
    w[p * kb..(p + 1) * kb]
        .iter()
        .map(move |panel| panel.block(j % P::ROWS))
}
