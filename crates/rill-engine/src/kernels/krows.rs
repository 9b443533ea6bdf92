//! The K-quants (Q4_K, Q5_K, Q6_K) row by row, as the file holds them: what a mixture's
//! experts run on when they are read in the memory-mapped file (`mapped.rs`), where the
//! interleaved panels of `kpanels.rs` cannot be made without copying them.
//!
//! A row's super-blocks are dotted with activations quantised as ggml's Q8_K. Per super-block
//! and activation row the kernels take the scalar reference's exact integers (Q4_K and Q5_K:
//! `t = Σ_j sc_j·Σ(q_x·q_y)` and `s = Σ_j m_j·Σq_y`; Q6_K: `t = Σ_g sc_g·(Σ q_x·q_y − 32·Σq_y)`)
//! and add them with the reference's fused multiply-adds in its order, so every path gives the
//! reference's bits, whatever rows are beside it. AVX2 unpacks a super-block's 6-bit scales
//! and mins with four 32-bit masks and shifts, its weights with byte masks, and takes the
//! products with `maddubs` (|pairs| ≤ 2·63·127) and `madd` by the sub-block's scale; a weight
//! super-block is unpacked once for up to four activation rows. NEON runs the scalar reference.

use super::*;

/// A K-quant super-block format on the row kernels.
pub(crate) trait KBlock: Copy + Sync {
    /// Whether it subtracts mins (`dmin·Σ m_j·Σq_y`): Q4_K and Q5_K.
    const MINS: bool;
    fn d(&self) -> u16;
    fn dmin(&self) -> u16;
    /// The scalar reference's dot product.
    fn scalar(x: &[Self], y: &[BlockQ8K]) -> f32;
}

/// Q4_K and Q5_K: 6-bit scales and mins, `d` and `dmin`.
macro_rules! scale_min_block {
    ($b:ty, $scalar:ident) => {
        impl KBlock for $b {
            const MINS: bool = true;
            fn d(&self) -> u16 {
                self.d
            }
            fn dmin(&self) -> u16 {
                self.dmin
            }
            fn scalar(x: &[Self], y: &[BlockQ8K]) -> f32 {
                $scalar(x, y)
            }
        }
    };
}

scale_min_block!(BlockQ4K, dot_q4_k_q8_k_scalar);
scale_min_block!(BlockQ5K, dot_q5_k_q8_k_scalar);

impl KBlock for BlockQ6K {
    const MINS: bool = false;
    fn d(&self) -> u16 {
        self.d
    }
    fn dmin(&self) -> u16 {
        0
    }
    fn scalar(x: &[Self], y: &[BlockQ8K]) -> f32 {
        dot_q6_k_q8_k_scalar(x, y)
    }
}

/// The row-kernel [`Format`] of a K-quant block.
macro_rules! k_format {
    ($b:ty) => {
        impl Format for $b {
            type Act = BlockQ8K;
            #[cfg(target_arch = "x86_64")]
            const ROWS_AVX2: [RowsFn<Self, BlockQ8K>; 2] = [simd::rows::<$b>, simd::rows::<$b>];

            fn dot(isa: Isa, w: &[Self], a: &[BlockQ8K]) -> f32 {
                assert_eq!(w.len(), a.len());
                #[cfg(target_arch = "x86_64")]
                if isa.avx2() {
                    // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and
                    // F16C; one weight row of `w.len()` super-blocks against one activation
                    // row of as many.
                    return unsafe { simd::tile::<$b, 1>(w.as_ptr(), w.len(), a.as_ptr()) }[0][0];
                }
                let _ = isa;
                <$b as KBlock>::scalar(w, a)
            }
        }
    };
}

k_format!(BlockQ4K);
k_format!(BlockQ5K);
k_format!(BlockQ6K);

#[cfg(target_arch = "x86_64")]
mod simd {
    // Tiles index their sums by activation row: clearer than zipped iterators here.
    #![allow(clippy::needless_range_loop)]

    use super::*;
    use std::arch::x86_64::*;

    /// A super-block's exact integers against `C` activation rows, on AVX2.
    pub(crate) trait KSums: KBlock {
        /// Per activation row: `(t, s)` of the scalar reference (`s` = 0 without mins).
        ///
        /// # Safety
        /// AVX2 (the caller's target features; this is inlined into it).
        unsafe fn sums<const C: usize>(&self, y: [&BlockQ8K; C]) -> [(i32, i32); C];
    }

    /// The sum of the eight i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// Q4_K's and Q5_K's 12 bytes of 6-bit scales and mins as 16 bytes: the eight scales, then
    /// the eight mins ([`scale_min_k4`]'s values), by 32-bit masks and shifts.
    #[inline(always)]
    fn scales_mins(q: &[u8; 12]) -> [u8; 16] {
        let word =
            |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
        let (u0, u1, u2) = (word(0), word(1), word(2));
        let (six, four, two) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x0303_0303);
        let parts = [
            u0 & six,
            (u2 & four) | (((u0 >> 6) & two) << 4),
            u1 & six,
            ((u2 >> 4) & four) | (((u1 >> 6) & two) << 4),
        ];
        let mut out = [0u8; 16];
        for (o, p) in out.chunks_exact_mut(4).zip(parts) {
            o.copy_from_slice(&p.to_le_bytes());
        }
        out
    }

    /// `(Σ lanes of t, Σ_j m_j·Σq_y)`: `mins` the eight mins as i16, `y`'s sub-block sums
    /// paired from its `bsums` (each |Σ| ≤ 32·127, an i16), multiplied and added in pairs, and
    /// both reductions done together.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sums_and_mins(t: __m256i, mins: __m128i, y: &BlockQ8K) -> (i32, i32) {
        let bsums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        // Lane j: bsums[2j] + bsums[2j + 1], sub-block j's Σq_y.
        let sums = _mm_hadd_epi16(
            _mm256_castsi256_si128(bsums),
            _mm256_extracti128_si256(bsums, 1),
        );
        let m = _mm_madd_epi16(sums, mins);
        let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        // [t0+t1, t2+t3, m0+m1, m2+m3], then [t, m, t, m].
        let both = _mm_hadd_epi32(t, m);
        let both = _mm_hadd_epi32(both, both);
        (_mm_cvtsi128_si32(both), _mm_extract_epi32(both, 1))
    }

    /// Bits `shift ..` of each byte of `v` under `mask` (0x01 or 0x03), moved up to bit 4.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bits_at_4(v: __m256i, shift: i32, mask: __m256i) -> __m256i {
        let b = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), mask);
        _mm256_slli_epi16(b, 4)
    }

    /// The 4-bit K-quants' sums, with Q5_K's fifth bits from `qh` where given.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale_min_sums<const C: usize>(
        scales: &[u8; 12],
        qs: &[u8; 128],
        qh: Option<&[u8; 32]>,
        y: [&BlockQ8K; C],
    ) -> [(i32, i32); C] {
        let sm = scales_mins(scales);
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let high = qh.map(|h| _mm256_loadu_si256(h.as_ptr() as *const __m256i));
        let mut acc = [_mm256_setzero_si256(); C];
        for p in 0..4 {
            let q = _mm256_loadu_si256(qs.as_ptr().add(32 * p) as *const __m256i);
            let mut lo = _mm256_and_si256(q, low);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            if let Some(h) = high {
                // Bit j of each byte is sub-block j's fifth bit (j = 2p, 2p + 1).
                lo = _mm256_or_si256(lo, bits_at_4(h, 2 * p as i32, one));
                hi = _mm256_or_si256(hi, bits_at_4(h, 2 * p as i32 + 1, one));
            }
            let s_lo = _mm256_set1_epi16(i16::from(sm[2 * p]));
            let s_hi = _mm256_set1_epi16(i16::from(sm[2 * p + 1]));
            for c in 0..C {
                let yq = y[c].qs.as_ptr().add(64 * p);
                let yl = _mm256_loadu_si256(yq as *const __m256i);
                let yh = _mm256_loadu_si256(yq.add(32) as *const __m256i);
                let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, yl), s_lo);
                let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yh), s_hi);
                acc[c] = _mm256_add_epi32(acc[c], _mm256_add_epi32(pl, ph));
            }
        }
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr().add(8) as *const __m128i));
        let mut out = [(0, 0); C];
        for c in 0..C {
            out[c] = sums_and_mins(acc[c], mins, y[c]);
        }
        out
    }

    impl KSums for BlockQ4K {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn sums<const C: usize>(&self, y: [&BlockQ8K; C]) -> [(i32, i32); C] {
            scale_min_sums(&self.scales, &self.qs, None, y)
        }
    }

    impl KSums for BlockQ5K {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn sums<const C: usize>(&self, y: [&BlockQ8K; C]) -> [(i32, i32); C] {
            scale_min_sums(&self.scales, &self.qs, Some(&self.qh), y)
        }
    }

    impl KSums for BlockQ6K {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn sums<const C: usize>(&self, y: [&BlockQ8K; C]) -> [(i32, i32); C] {
            let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x03));
            let mut acc = [_mm256_setzero_si256(); C];
            for n in 0..2 {
                let q0 = _mm256_loadu_si256(self.ql.as_ptr().add(64 * n) as *const __m256i);
                let q1 = _mm256_loadu_si256(self.ql.as_ptr().add(64 * n + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(self.qh.as_ptr().add(32 * n) as *const __m256i);
                // The four quarters of 32: a nibble of `ql` and two bits of `qh` each.
                let quarters = [
                    _mm256_or_si256(_mm256_and_si256(q0, low), bits_at_4(qh, 0, two)),
                    _mm256_or_si256(_mm256_and_si256(q1, low), bits_at_4(qh, 2, two)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(q0, 4), low),
                        bits_at_4(qh, 4, two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(q1, 4), low),
                        bits_at_4(qh, 6, two),
                    ),
                ];
                for (t, q) in quarters.into_iter().enumerate() {
                    // Groups g and g + 1 of 16: the low and high halves of the quarter.
                    let g = 8 * n + 2 * t;
                    let sc = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(self.scales[g + 1])),
                        _mm_set1_epi16(i16::from(self.scales[g])),
                    );
                    for c in 0..C {
                        let yq = y[c].qs.as_ptr().add(128 * n + 32 * t) as *const __m256i;
                        let p = _mm256_maddubs_epi16(q, _mm256_loadu_si256(yq));
                        acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, sc));
                    }
                }
            }
            let scales =
                _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr() as *const __m128i));
            let mut out = [(0, 0); C];
            for c in 0..C {
                let bsums = _mm256_loadu_si256(y[c].bsums.as_ptr() as *const __m256i);
                let offset = hsum_i32(_mm256_madd_epi16(bsums, scales));
                out[c] = (hsum_i32(acc[c]) - 32 * offset, 0);
            }
            out
        }
    }

    /// One weight row (`kb` super-blocks at `w`) × `C` activation rows (row c at `a + c·kb`),
    /// each super-block unpacked once for the `C` rows; the reference's fused multiply-adds in
    /// its order, so each output is the reference's bits.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `kb` blocks readable at `w`, `C·kb` at `a`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile<B: KSums, const C: usize>(
        w: *const B,
        kb: usize,
        a: *const BlockQ8K,
    ) -> [[f32; C]; 1] {
        let t = f16_table();
        let mut sum = [0f32; C];
        for b in 0..kb {
            let x = &*w.add(b);
            super::super::prefetch_rows_ahead(x, kb);
            let y: [&BlockQ8K; C] = std::array::from_fn(|c| &*a.add(c * kb + b));
            let s = x.sums(y);
            let (d, dmin) = (h(t, x.d()), h(t, x.dmin()));
            for c in 0..C {
                sum[c] = (d * y[c].d).mul_add(s[c].0 as f32, sum[c]);
                if B::MINS {
                    sum[c] = (-(dmin * y[c].d)).mul_add(s[c].1 as f32, sum[c]);
                }
            }
        }
        [sum]
    }

    /// [`Format::rows`] for a K-quant: each weight row against the activation rows four at a
    /// time.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; the bounds [`Format::rows`] asserts.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows<B: KSums>(
        _isa: Isa,
        w: &[B],
        acts: &Acts<BlockQ8K>,
        is: std::ops::Range<usize>,
        out: &mut [f32],
        sj: usize,
        si: usize,
    ) {
        let kb = acts.kb;
        row_tiles!(
            0..w.len() / kb,
            is,
            1,
            [(1, 4)(1, 3)(1, 2)(1, 1)],
            (out.as_mut_ptr(), sj, si),
            |R, C, j, i| tile::<B, C>(w.as_ptr().add(j * kb), kb, acts.q.as_ptr().add(i * kb))
        );
    }
}
