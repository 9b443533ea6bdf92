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

/// Element `e` (0..32) of a Q4_1 block.
pub(crate) fn q4_1_nibble(b: &BlockQ4_1, e: usize) -> u8 {
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
pub(crate) trait Panel: Copy + Send + Sync + Sized {
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
pub(crate) type KernelFn<P, A> =
    unsafe fn(&[P], &PanelActs<A>, std::ops::Range<usize>, std::ops::Range<usize>, *mut f32, usize);

/// A panel layout's kernels.
pub(crate) trait Kernel: Panel {
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
pub(crate) fn to_panels<P: Panel>(w: &[P::Block], kb: usize) -> Vec<P> {
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
