//! The GGUF block formats the kernels read (Q4_1, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, and the Q8_1
//! and Q8_K activations), the repacking of Q4_0, Q5_0 and Q4_K into Q4_1 or Q8_0 where there
//! are no panels for them, and the f16 table and byte reader they share.

use super::*;

pub(crate) const QK: usize = 32;

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

/// 32 activations: `d·q`, with `s = d·Σq` (f16, rounded once from the f32 product, as
/// ggml's Q8_1) for Q4_1's offset term, and the exact `sum = Σq` for Q4_0's, which ggml
/// takes in integers (its `q − 8` weights).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub sum: i16,
    pub qs: [i8; QK],
}

/// Weights (and activations) per K-quant super-block.
pub(crate) const QK_K: usize = 256;

/// 256 activations for the K-quants (ggml's Q8_K): `d·q` with one f32 `d`, q in -127..=127,
/// and the sums of each 16 of them (`bsums`) for the K-quants' mins and offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        }
    }
}

impl BlockQ8K {
    /// The sum of sub-block `j`'s 32 activations.
    #[inline(always)]
    pub(crate) fn sum32(&self, j: usize) -> i32 {
        self.bsums[2 * j] as i32 + self.bsums[2 * j + 1] as i32
    }

    /// Sub-blocks 2·jp's and 2·jp + 1's sums as the low and high i16 of a 32-bit lane (each at
    /// most 32·128 in magnitude), for a 16-bit product of pairs with the K-quant panels' mins.
    #[inline(always)]
    pub(crate) fn sum_pair(&self, jp: usize) -> i32 {
        let (lo, hi) = (self.sum32(2 * jp), self.sum32(2 * jp + 1));
        (lo as u16 as u32 | (hi as u16 as u32) << 16) as i32
    }
}

// The blocks are read straight from GGUF bytes: no padding allowed.
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 38);

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

/// 256 weights in 8 sub-blocks of 32: `d·sc_j·q − dmin·m_j`, q in 0..32: Q4_K's scales and
/// nibbles, and bit 4 of sub-block j's element e in bit j of `qh[e]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

impl Default for BlockQ5K {
    fn default() -> Self {
        BlockQ5K {
            d: 0,
            dmin: 0,
            scales: [0; 12],
            qh: [0; 32],
            qs: [0; 128],
        }
    }
}

/// Element `e` (0..32) of sub-block `j` of a Q5_K block: 0..32.
pub(crate) fn q5_k_value(b: &BlockQ5K, j: usize, e: usize) -> u8 {
    let low = (b.qs[32 * (j / 2) + e] >> (4 * (j % 2))) & 0x0F;
    low | (((b.qh[e] >> j) & 1) << 4)
}

/// 256 weights in 16 groups of 16: `d·sc_g·(q − 32)`, q in 0..64 (6 bits), `sc_g` a signed
/// byte. Element e's low 4 bits and high 2 bits lie as [`q6_k_value`] reads them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: u16,
}

impl Default for BlockQ6K {
    fn default() -> Self {
        BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: 0,
        }
    }
}

/// Where element `e` (0..256) of a Q6_K block keeps its bits: the byte of `ql` and whether its
/// high nibble, and the byte of `qh` and the shift of its two bits. Each half of 128 has 64
/// bytes of `ql` and 32 of `qh`; its quarters of 32 take the low nibbles of the first 32 `ql`
/// bytes, of the next 32, then their high nibbles, and bits 0–1, 2–3, 4–5, 6–7 of `qh`.
fn q6_k_place(e: usize) -> (usize, bool, usize, usize) {
    let (n, t, l) = (e / 128, (e % 128) / 32, e % 32);
    (64 * n + l + 32 * (t % 2), t >= 2, 32 * n + l, 2 * t)
}

/// Element `e`'s 6-bit value (0..64) of a Q6_K block.
pub(crate) fn q6_k_value(b: &BlockQ6K, e: usize) -> u8 {
    let (lo, high, hi, shift) = q6_k_place(e);
    let nibble = if high { b.ql[lo] >> 4 } else { b.ql[lo] & 0x0F };
    nibble | (((b.qh[hi] >> shift) & 3) << 4)
}

/// Sets element `e` of a Q6_K block (whose bits there are zero) to `v` (0..64).
pub(crate) fn set_q6_k_value(b: &mut BlockQ6K, e: usize, v: u8) {
    let (lo, high, hi, shift) = q6_k_place(e);
    b.ql[lo] |= (v & 0x0F) << (if high { 4 } else { 0 });
    b.qh[hi] |= (v >> 4) << shift;
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
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
pub(crate) fn q4_0_as_q4_1(w: &[BlockQ4_0]) -> Vec<BlockQ4_1> {
    w.iter()
        .map(|b| BlockQ4_1 {
            d: b.d,
            m: (f16::from_bits(b.d) * f16::from_f32(-8.0)).to_bits(),
            qs: b.qs,
        })
        .collect()
}

/// Q5_0 is Q8_0 with bytes `q − 16` (exact; 8.5 bits per weight instead of 5.5).
pub(crate) fn q5_0_as_q8_0(w: &[BlockQ5_0]) -> Vec<BlockQ8_0> {
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
pub(crate) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
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
pub(crate) fn q4_k_as_q4_1(w: &[BlockQ4K]) -> Vec<BlockQ4_1> {
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
            sum: 0,
            qs: [0; QK],
        }
    }
}

/// f16 → f32 by table (256 KB, built once): as fast as F16C and the same on every machine.
pub(crate) fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect())
}

#[inline(always)]
pub(crate) fn h(t: &[f32], bits: u16) -> f32 {
    // A table of 65,536 entries indexed by a u16: always in bounds.
    t[bits as usize]
}

/// Copies GGUF block bytes into typed blocks. `T` is one of the `repr(C)` blocks above: plain
/// bytes with no padding (asserted at compile time), so any bit pattern is a valid value.
pub(crate) fn blocks<T: Copy + Default>(bytes: &[u8]) -> Option<Vec<T>> {
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

/// GGUF block bytes as typed blocks, in place where they are aligned for `T` (candle's tensors
/// hold their blocks as such, so a panel is made straight from them), else copied ([`blocks`]).
pub(crate) fn block_slice<T: Copy + Default>(bytes: &[u8]) -> Option<std::borrow::Cow<'_, [T]>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return blocks(bytes).map(std::borrow::Cow::Owned);
    }
    // SAFETY: the pointer is aligned for `T` (checked above), the slice holds exactly
    // `len / size` values' bytes, and `T` is plain old data (see [`blocks`]); the result
    // borrows `bytes`, so it lives no longer than they do.
    let t = unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) };
    Some(std::borrow::Cow::Borrowed(t))
}
