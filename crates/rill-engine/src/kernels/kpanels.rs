//! The panels of the K-quants (Q4_K, Q5_K, Q6_K): super-blocks of 256 weights, eight or
//! sixteen rows' at one position interleaved as the Q4_1 panels' nibbles are, with each
//! format's scales and extra bit planes beside them, and their kernels.

use super::panels::{deinterleave, interleave, nibble};
use super::*;

/// `R` weight rows' Q4_K super-blocks (256 weights each) at the same position: the rows' `d`
/// and `dmin` (f16), each sub-block's 6-bit scale and min unpacked to a byte (`sc[j][k]`: row
/// k's sub-block j; `m[j / 2][k][j % 2]`: the mins in pairs of sub-blocks, for a 16-bit
/// product of pairs), and each sub-block's nibbles interleaved as [`PanelQ4_1`]'s (`qs[j]`).
/// 1,184 bytes for eight rows' 1,152: the unpacked scales take 2.8% more than the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PanelQ4K<const R: usize> {
    pub d: [u16; R],
    pub dmin: [u16; R],
    pub sc: [[u8; R]; 8],
    pub m: [[[u8; 2]; R]; 4],
    pub qs: [[[[u8; 4]; R]; 4]; 8],
}

/// `R` weight rows' Q5_K super-blocks at the same position: [`PanelQ4K`]'s scales, mins and
/// nibbles, and per sub-block the fifth bits in one vector (`sub[j].qh`): lane k's byte i holds
/// in bit g the fifth bit of element 4g + i. 1,440 bytes for eight rows' 1,408 (2.3% more).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PanelQ5K<const R: usize> {
    pub d: [u16; R],
    pub dmin: [u16; R],
    pub sc: [[u8; R]; 8],
    pub m: [[[u8; 2]; R]; 4],
    pub sub: [FiveBits<R>; 8],
}

/// One sub-block of 32 weights of [`PanelQ5K`]: `R` rows' low nibbles and fifth bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FiveBits<const R: usize> {
    pub ql: [[[u8; 4]; R]; 4],
    pub qh: [[u8; 4]; R],
}

const _: () =
    assert!(std::mem::size_of::<PanelQ5K<8>>() == 8 * (std::mem::size_of::<BlockQ5K>() + 4));

/// `R` weight rows' Q6_K super-blocks at the same position: the rows' `d` (f16) and 16 group
/// scales (`sc[g][k]`: row k's group g), and per sub-block j of 32 weights the low nibbles
/// interleaved as [`PanelQ4_1`]'s (`sub[j].ql`) and the high two bits in two vectors
/// (`sub[j].qh`, see [`SixBits`]). As many bytes as the `R` blocks were; each sub-block's bits
/// lie together, so a panel is read as one stream.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PanelQ6K<const R: usize> {
    pub d: [u16; R],
    pub sc: [[i8; R]; 16],
    pub sub: [SixBits<R>; 8],
}

/// One sub-block of 32 weights of [`PanelQ6K`]: `R` rows' low nibbles and high bits. Lane k's
/// byte i of `qh[v]` holds, in bits 2t..2t+2, the high bits of element 4g + i with g =
/// [`six_bits_group`]`(v, t)`: groups v and v + 2 (whose nibbles are `ql[v]`'s and `ql[v + 2]`'s
/// low ones) in bits 4–5 and 0–1, groups v + 4 and v + 6 (the high nibbles) in bits 6–7 and
/// 2–3. So a kernel finds each group's high bits where a value needs them with one shift by
/// four per vector: at bits 4–5 beside a low nibble, or at bits 6–7 beside a high nibble
/// shifted down by two only (the value times four, which a byte still holds).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SixBits<const R: usize> {
    pub ql: [[[u8; 4]; R]; 4],
    pub qh: [[[u8; 4]; R]; 2],
}

const _: () = assert!(
    std::mem::size_of::<PanelQ6K<8>>() == 8 * std::mem::size_of::<BlockQ6K>()
        && std::mem::size_of::<PanelQ6K<16>>() == 16 * std::mem::size_of::<BlockQ6K>()
);
const _: () =
    assert!(std::mem::size_of::<PanelQ4K<8>>() == 8 * (std::mem::size_of::<BlockQ4K>() + 4));

/// Element `e` (0..32) of sub-block `j` of a Q4_K block.
pub(crate) fn q4_k_nibble(b: &BlockQ4K, j: usize, e: usize) -> u8 {
    (b.qs[32 * (j / 2) + e] >> (4 * (j % 2))) & 0x0F
}

/// Byte `b` (0..16) of sub-block `j`'s nibbles as Q4_0 pairs them (element b low, b + 16
/// high), from Q4_K's and Q5_K's `qs`, where the 32 bytes from 32·(j/2) hold sub-block j in
/// their low nibbles (j even) or high ones (j odd).
#[inline(always)]
fn k4_pair(qs: &[u8; 128], j: usize, b: usize) -> u8 {
    let (lo, hi) = (qs[32 * (j / 2) + b], qs[32 * (j / 2) + b + 16]);
    match j % 2 {
        0 => (lo & 0x0F) | (hi << 4),
        _ => (lo >> 4) | (hi & 0xF0),
    }
}

/// The same from a Q6_K block's low nibbles: sub-block j (of 32) lies in the low (j % 4 < 2)
/// or high nibbles of `ql` from 64·(j/4) + 32·(j % 2), as [`q6_k_value`] reads them.
#[inline(always)]
fn q6_k_pair(x: &BlockQ6K, j: usize, b: usize) -> u8 {
    let base = 64 * (j / 4) + 32 * (j % 2);
    let (lo, hi) = (x.ql[base + b], x.ql[base + b + 16]);
    match (j % 4) / 2 {
        0 => (lo & 0x0F) | (hi << 4),
        _ => (lo >> 4) | (hi & 0xF0),
    }
}

/// Sub-block `j`'s fifth bits of `R` rows' Q5_K blocks (`qh(k)`: row k's, element e's in bit
/// j of byte e) as [`FiveBits`] holds them: lane k's byte i has element 4g + i's in bit g.
#[inline(always)]
fn fifth_bits<'a, const R: usize>(qh: impl Fn(usize) -> &'a [u8; 32], j: usize) -> [[u8; 4]; R] {
    let mut out = [[0u8; 4]; R];
    for (k, lane) in out.iter_mut().enumerate() {
        let qh = qh(k);
        for (i, v) in lane.iter_mut().enumerate() {
            for g in 0..8 {
                *v |= ((qh[4 * g + i] >> j) & 1) << g;
            }
        }
    }
    out
}

/// The group (of four elements, 0..8) whose high bits [`SixBits`] keeps in bits 2t..2t+2 of
/// `qh[v]`.
pub(crate) const fn six_bits_group(v: usize, t: usize) -> usize {
    v + [2, 6, 0, 4][t]
}

/// Sub-block `j`'s high two bits of `R` rows' Q6_K blocks (`qh(k)`: row k's; element e of the
/// sub-block has its in bits 2·(j % 4) of byte 32·(j/4) + e) as [`SixBits`] holds them.
#[inline(always)]
fn high_pairs<'a, const R: usize>(
    qh: impl Fn(usize) -> &'a [u8; 64],
    j: usize,
) -> [[[u8; 4]; R]; 2] {
    let (base, shift) = (32 * (j / 4), 2 * (j % 4));
    let mut out = [[[0u8; 4]; R]; 2];
    for k in 0..R {
        let qh = qh(k);
        for (v, vector) in out.iter_mut().enumerate() {
            for (i, byte) in vector[k].iter_mut().enumerate() {
                for t in 0..4 {
                    let g = six_bits_group(v, t);
                    *byte |= ((qh[base + 4 * g + i] >> shift) & 3) << (2 * t);
                }
            }
        }
    }
    out
}

/// Sub-block scales and mins as the Q4_K and Q5_K panels hold them: scales sub-block-major
/// (`[j][k]`), mins in pairs of sub-blocks (`[j / 2][k][j % 2]`).
type ScalesMins<const R: usize> = ([[u8; R]; 8], [[[u8; 2]; R]; 4]);

/// `R` rows' packed 6-bit scales and mins (`scales(k)`: row k's 12 bytes) unpacked to a byte
/// each.
fn unpack_scales_k4<'a, const R: usize>(scales: impl Fn(usize) -> &'a [u8; 12]) -> ScalesMins<R> {
    let (mut sc, mut m) = ([[0u8; R]; 8], [[[0u8; 2]; R]; 4]);
    for k in 0..R {
        for j in 0..8 {
            (sc[j][k], m[j / 2][k][j % 2]) = scale_min_k4(j, scales(k));
        }
    }
    (sc, m)
}

/// Eight sub-blocks' 6-bit scales and mins (`scale_min(j)`) packed as ggml packs them: the
/// inverse of `scale_min_k4`.
fn pack_scales_k4(scale_min: impl Fn(usize) -> (u8, u8)) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        let (sc, m) = scale_min(j);
        if j < 4 {
            q[j] |= sc;
            q[j + 4] |= m;
        } else {
            q[j + 4] = (sc & 0x0F) | ((m & 0x0F) << 4);
            q[j - 4] |= (sc >> 4) << 6;
            q[j] |= (m >> 4) << 6;
        }
    }
    q
}

impl<const R: usize> Panel for PanelQ4K<R> {
    type Block = BlockQ4K;
    type Act = BlockQ8K;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ4K]) -> Self {
        assert_eq!(rows.len(), R);
        let (sc, m) = unpack_scales_k4(|k| &rows[k].scales);
        PanelQ4K {
            d: std::array::from_fn(|k| rows[k].d),
            dmin: std::array::from_fn(|k| rows[k].dmin),
            sc,
            m,
            qs: std::array::from_fn(|j| interleave(|k, b| k4_pair(&rows[k].qs, j, b))),
        }
    }

    fn block(&self, k: usize) -> BlockQ4K {
        let mut b = BlockQ4K {
            d: self.d[k],
            dmin: self.dmin[k],
            scales: pack_scales_k4(|j| (self.sc[j][k], self.m[j / 2][k][j % 2])),
            ..Default::default()
        };
        for j in 0..8 {
            let nibbles = deinterleave(&self.qs[j], k);
            for e in 0..QK {
                b.qs[32 * (j / 2) + e] |= nibble(&nibbles, e) << (4 * (j % 2));
            }
        }
        b
    }

    fn dot_ref(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
        dot_q4_k_q8_k_scalar(w, a)
    }
}

impl<const R: usize> Panel for PanelQ5K<R> {
    type Block = BlockQ5K;
    type Act = BlockQ8K;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ5K]) -> Self {
        assert_eq!(rows.len(), R);
        let (sc, m) = unpack_scales_k4(|k| &rows[k].scales);
        PanelQ5K {
            d: std::array::from_fn(|k| rows[k].d),
            dmin: std::array::from_fn(|k| rows[k].dmin),
            sc,
            m,
            sub: std::array::from_fn(|j| FiveBits {
                ql: interleave(|k, b| k4_pair(&rows[k].qs, j, b)),
                qh: fifth_bits(|k| &rows[k].qh, j),
            }),
        }
    }

    fn block(&self, k: usize) -> BlockQ5K {
        let mut b = BlockQ5K {
            d: self.d[k],
            dmin: self.dmin[k],
            scales: pack_scales_k4(|j| (self.sc[j][k], self.m[j / 2][k][j % 2])),
            ..Default::default()
        };
        for j in 0..8 {
            let low = deinterleave(&self.sub[j].ql, k);
            for e in 0..QK {
                b.qs[32 * (j / 2) + e] |= nibble(&low, e) << (4 * (j % 2));
                b.qh[e] |= ((self.sub[j].qh[k][e % 4] >> (e / 4)) & 1) << j;
            }
        }
        b
    }

    fn dot_ref(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
        dot_q5_k_q8_k_scalar(w, a)
    }
}

impl<const R: usize> Panel for PanelQ6K<R> {
    type Block = BlockQ6K;
    type Act = BlockQ8K;
    const ROWS: usize = R;

    fn new(rows: &[&BlockQ6K]) -> Self {
        assert_eq!(rows.len(), R);
        PanelQ6K {
            d: std::array::from_fn(|k| rows[k].d),
            sc: std::array::from_fn(|g| std::array::from_fn(|k| rows[k].scales[g])),
            sub: std::array::from_fn(|j| SixBits {
                ql: interleave(|k, b| q6_k_pair(rows[k], j, b)),
                qh: high_pairs(|k| &rows[k].qh, j),
            }),
        }
    }

    fn block(&self, k: usize) -> BlockQ6K {
        let mut b = BlockQ6K {
            d: self.d[k],
            scales: std::array::from_fn(|g| self.sc[g][k]),
            ..Default::default()
        };
        for j in 0..8 {
            let low = deinterleave(&self.sub[j].ql, k);
            for e in 0..QK {
                let (g, i) = (e / 4, e % 4);
                let (v, t) = (g % 2, [2, 0, 3, 1][g / 2]);
                debug_assert_eq!(six_bits_group(v, t), g);
                let high = (self.sub[j].qh[v][k][i] >> (2 * t)) & 3;
                set_q6_k_value(&mut b, 32 * j + e, nibble(&low, e) | (high << 4));
            }
        }
        b
    }

    fn dot_ref(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
        dot_q6_k_q8_k_scalar(w, a)
    }
}

impl Kernel for PanelQ4K<8> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, BlockQ8K> {
        match isa.avx_vnni() {
            true => avx2::panels_q4_k::<true>,
            false => avx2::panels_q4_k::<false>,
        }
    }
}

impl Kernel for PanelQ4K<16> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8K> {
        avx512::panels_q4_k
    }
}

impl Kernel for PanelQ5K<8> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, BlockQ8K> {
        match isa.avx_vnni() {
            true => avx2::panels_q5_k::<true>,
            false => avx2::panels_q5_k::<false>,
        }
    }
}

impl Kernel for PanelQ5K<16> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8K> {
        avx512::panels_q5_k
    }
}

impl Kernel for PanelQ6K<8> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(isa: Isa) -> KernelFn<Self, BlockQ8K> {
        match isa.avx_vnni() {
            true => avx2::panels_q6_k::<true>,
            false => avx2::panels_q6_k::<false>,
        }
    }
}

impl Kernel for PanelQ6K<16> {
    #[cfg(target_arch = "x86_64")]
    fn kernel(_: Isa) -> KernelFn<Self, BlockQ8K> {
        avx512::panels_q6_k
    }
}
