//! The panel kernels on 512-bit registers (AVX-512F, BW and VNNI): panels of sixteen weight
//! rows, one per vector lane, read as one stream. Each lane does what a lane of the 256-bit
//! kernels does — the block's exact integer sums by `vpdpbusd` (and the K-quants' scales
//! applied in integers), then the same float multiplies and fused multiply-adds in the same
//! order — so the outputs are theirs bit for bit; only the number of instructions per weight
//! halves.

use std::arch::x86_64::*;

use super::{
    BlockQ8K, BlockQ8_0, BlockQ8_1, FiveBits, Nibbles, Panel, PanelActs, PanelQ4K, PanelQ4_0,
    PanelQ4_1, PanelQ5K, PanelQ6K, PanelQ8_0, SixBits, QK, TILE_A_WIDER,
};

/// A panel's sixteen f16 scales as floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scales(h: &[u16; 16]) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i))
}

/// One block's integer sums for sixteen rows' nibbles × `C` activation rows, as
/// `avx2::nibble_sums` computes them (with `vpdpbusd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn nibble_sums<const C: usize>(
    qs: &[[[u8; 4]; 16]; 4],
    a: *const BlockQ8_1,
    kb: usize,
) -> [__m512i; C] {
    let low = _mm512_set1_epi8(0x0F);
    let mut isum = [_mm512_setzero_si512(); C];
    for (c4, chunk) in qs.iter().enumerate() {
        let chunk = _mm512_loadu_si512(chunk.as_ptr() as *const __m512i);
        let nibbles = [
            _mm512_and_si512(chunk, low),
            _mm512_and_si512(_mm512_srli_epi16::<4>(chunk), low),
        ];
        for (h, wq) in nibbles.into_iter().enumerate() {
            let g = c4 + 4 * h;
            for (c, sum) in isum.iter_mut().enumerate() {
                let ap = (*a.add(c * kb)).qs.as_ptr().add(4 * g) as *const i32;
                *sum = _mm512_dpbusd_epi32(*sum, wq, _mm512_set1_epi32(ap.read_unaligned()));
            }
        }
    }
    isum
}

/// One Q4_1 or Q4_0 panel (`kb` blocks) × `C` activation rows: lane k of result c is weight
/// row k · activation row c, as `avx2::nibble_tile` computes it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn nibble_tile<P: Nibbles<16>, const C: usize>(
    w: *const P,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..kb {
        let p = &*w.add(b);
        super::prefetch_panel_ahead(p);
        let isum = nibble_sums::<C>(p.qs(), a.add(b), kb);
        let dw = scales(p.d());
        let mw = p.m().map(|m| scales(m));
        for (c, (acc, sum)) in acc.iter_mut().zip(isum).enumerate() {
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*ad.add(c * kb + b)));
            match mw {
                Some(mw) => {
                    *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), *acc);
                    *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(*s.add(c * kb + b)), *acc);
                }
                None => {
                    let a8 = _mm512_set1_epi32(8 * (*a.add(c * kb + b)).sum as i32);
                    let sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, a8));
                    *acc = _mm512_fmadd_ps(dd, sums, *acc);
                }
            }
        }
    }
    acc
}

/// Sixteen row bytes (one per row) as unsigned i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn u8_lanes(b: &[u8; 16]) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr() as *const __m128i))
}

/// Sixteen signed row bytes as i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn i8_lanes(b: &[i8; 16]) -> __m512i {
    _mm512_cvtepi8_epi32(_mm_loadu_si128(b.as_ptr() as *const __m128i))
}

/// A sub-block's nibbles for sixteen rows as eight vectors, as `avx2`'s `nibbles`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn nibbles(qs: &[[[u8; 4]; 16]; 4]) -> [__m512i; 8] {
    let low = _mm512_set1_epi8(0x0F);
    let mut w = [_mm512_setzero_si512(); 8];
    for (c4, chunk) in qs.iter().enumerate() {
        let chunk = _mm512_loadu_si512(chunk.as_ptr() as *const __m512i);
        w[c4] = _mm512_and_si512(chunk, low);
        w[c4 + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(chunk), low);
    }
    w
}

/// A Q5_K sub-block's 5-bit values for sixteen rows, as `avx2`'s `five_bits`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn five_bits(bits: &FiveBits<16>) -> [__m512i; 8] {
    let five = _mm512_set1_epi8(0x10);
    let h = _mm512_loadu_si512(bits.qh.as_ptr() as *const __m512i);
    let high = [
        _mm512_slli_epi16::<4>(h),
        _mm512_slli_epi16::<3>(h),
        _mm512_slli_epi16::<2>(h),
        _mm512_slli_epi16::<1>(h),
        h,
        _mm512_srli_epi16::<1>(h),
        _mm512_srli_epi16::<2>(h),
        _mm512_srli_epi16::<3>(h),
    ];
    let mut w = nibbles(&bits.ql);
    for (w, high) in w.iter_mut().zip(high) {
        *w = _mm512_or_si512(*w, _mm512_and_si512(high, five));
    }
    w
}

/// A Q6_K sub-block's values for sixteen rows, as [`SixBits`] lays them out: groups 0–3 (the
/// low nibbles, beside high bits at 4–5) as they are, 0..64, and groups 4–7 times four (the
/// high nibbles shifted down by two only, beside high bits at 6–7), 0..256. Six shifts, where
/// values of 0..64 throughout took eighteen (shifts share the port `vpdpbusd` runs on).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn six_bits(bits: &SixBits<16>) -> [__m512i; 8] {
    let (low, mid) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let (shifted, top) = (_mm512_set1_epi8(0x3C), _mm512_set1_epi8(-64));
    let mut w = [_mm512_setzero_si512(); 8];
    for (v, high) in bits.qh.iter().enumerate() {
        let h = _mm512_loadu_si512(high.as_ptr() as *const __m512i);
        // Groups v and v + 4 find their high bits in place, v + 2 and v + 6 after a shift by
        // four (16-bit shifts: the bits kept are each byte's own).
        for (g, h) in [(v, h), (v + 2, _mm512_slli_epi16::<4>(h))] {
            let q = _mm512_loadu_si512(bits.ql[g].as_ptr() as *const __m512i);
            let q4 = _mm512_srli_epi16::<2>(q);
            w[g] = _mm512_or_si512(_mm512_and_si512(q, low), _mm512_and_si512(h, mid));
            w[g + 4] = _mm512_or_si512(_mm512_and_si512(q4, shifted), _mm512_and_si512(h, top));
        }
    }
    w
}

/// Per lane, the exact Σ over the groups `w` of `w[g]·a[4g..4g+4]`, by `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_groups(w: &[__m512i], a: *const i8) -> __m512i {
    let ap = a as *const i32;
    let mut sum = _mm512_setzero_si512();
    for (g, w) in w.iter().enumerate() {
        let av = _mm512_set1_epi32(ap.add(g).read_unaligned());
        sum = _mm512_dpbusd_epi32(sum, *w, av);
    }
    sum
}

/// A tile of a K-quant panel with 6-bit scales and mins (Q4_K, Q5_K): sixteen rows, `kb`
/// super-blocks, × `C` Q8_K activation rows, as `avx2`'s `k_tile!` computes it. The mins'
/// integer `Σ_j m_j·Σq_a` is summed by pairs of sub-blocks with `vpdpwssd` (the same integer
/// as by one 32-bit multiply each, in a quarter of the instructions on `vpdpbusd`'s port).
macro_rules! k_tile {
    ($name:ident, $panel:ty, $weights:ident, $bits:ident) => {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
        unsafe fn $name<const C: usize>(
            w: *const $panel,
            kb: usize,
            a: *const BlockQ8K,
            ad: *const f32,
            _s: *const f32,
        ) -> [__m512; C] {
            let mut acc = [_mm512_setzero_ps(); C];
            for sb in 0..kb {
                let p = &*w.add(sb);
                let mut t = [_mm512_setzero_si512(); C];
                for j in 0..8 {
                    super::prefetch_part(p, j);
                    let wv = $weights(&p.$bits[j]);
                    let sc = u8_lanes(&p.sc[j]);
                    for c in 0..C {
                        let y = &*a.add(c * kb + sb);
                        let sum = dot_groups(&wv, y.qs.as_ptr().add(QK * j));
                        t[c] = _mm512_add_epi32(t[c], _mm512_mullo_epi32(sum, sc));
                    }
                }
                let m: [__m512i; 4] = std::array::from_fn(|jp| {
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.m[jp].as_ptr() as *const __m256i))
                });
                let (dw, mw) = (scales(&p.d), scales(&p.dmin));
                for c in 0..C {
                    let y = &*a.add(c * kb + sb);
                    let mut mins = _mm512_setzero_si512();
                    for (jp, m) in m.iter().enumerate() {
                        let s = _mm512_set1_epi32(y.sum_pair(jp));
                        mins = _mm512_dpwssd_epi32(mins, *m, s);
                    }
                    let da = _mm512_set1_ps(*ad.add(c * kb + sb));
                    let (tf, mf) = (_mm512_cvtepi32_ps(t[c]), _mm512_cvtepi32_ps(mins));
                    acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), tf, acc[c]);
                    acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, da), mf, acc[c]);
                }
            }
            acc
        }
    };
}
k_tile!(tile_q4_k, PanelQ4K<16>, nibbles, qs);
k_tile!(tile_q5_k, PanelQ5K<16>, five_bits, sub);

/// One Q6_K panel (`kb` super-blocks) × `C` Q8_K activation rows, as
/// `avx2::panel_tile_q6_k` computes it: [`six_bits`]' second half comes times four, so the
/// first half's scales are taken times four as well, and each super-block's exact integer sum,
/// four times the one the 256-bit kernel finds, is shifted back (exactly) before it is scaled.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q6_k<const C: usize>(
    w: *const PanelQ6K<16>,
    kb: usize,
    a: *const BlockQ8K,
    ad: *const f32,
    _s: *const f32,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for sb in 0..kb {
        let p = &*w.add(sb);
        let mut t = [_mm512_setzero_si512(); C];
        for j in 0..8 {
            super::prefetch_part(p, j);
            let wv = six_bits(&p.sub[j]);
            let sc = [
                _mm512_slli_epi32::<2>(i8_lanes(&p.sc[2 * j])),
                i8_lanes(&p.sc[2 * j + 1]),
            ];
            for (c, t) in t.iter_mut().enumerate() {
                let y = &*a.add(c * kb + sb);
                for (half, sc) in sc.iter().enumerate() {
                    let g = 2 * j + half;
                    let sum = dot_groups(&wv[4 * half..4 * half + 4], y.qs.as_ptr().add(16 * g));
                    // The values' offset of 32 (128 in the half times four).
                    let offset = (32 << (2 * half)) * y.bsums[g] as i32;
                    let x = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset));
                    *t = _mm512_add_epi32(*t, _mm512_mullo_epi32(x, *sc));
                }
            }
        }
        let dw = scales(&p.d);
        for (c, (acc, t)) in acc.iter_mut().zip(t).enumerate() {
            let da = _mm512_set1_ps(*ad.add(c * kb + sb));
            let t = _mm512_cvtepi32_ps(_mm512_srai_epi32::<2>(t));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), t, *acc);
        }
    }
    acc
}

/// One Q8_0 panel × `C` activation rows (offset by 128, see `Panel::prepare`), as
/// `avx2::panel_tile_q8_0`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q8_0<const C: usize>(
    w: *const PanelQ8_0<16>,
    kb: usize,
    a: *const BlockQ8_0,
    ad: *const f32,
    _s: *const f32,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..kb {
        let p = &*w.add(b);
        super::prefetch_panel_ahead(p);
        let mut isum = [_mm512_setzero_si512(); C];
        for g in 0..8 {
            let wq = _mm512_loadu_si512(p.qs[g].as_ptr() as *const __m512i);
            for (c, sum) in isum.iter_mut().enumerate() {
                let ap = (*a.add(c * kb + b)).qs.as_ptr().add(4 * g) as *const i32;
                *sum = _mm512_dpbusd_epi32(*sum, _mm512_set1_epi32(ap.read_unaligned()), wq);
            }
        }
        let sums = _mm256_loadu_si256(p.sum.as_ptr() as *const __m256i);
        let offset = _mm512_slli_epi32::<7>(_mm512_cvtepi16_epi32(sums));
        let dw = scales(&p.d);
        for (c, (acc, sum)) in acc.iter_mut().zip(isum).enumerate() {
            let sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset));
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*ad.add(c * kb + b)));
            *acc = _mm512_fmadd_ps(dd, sums, *acc);
        }
    }
    acc
}

panels!(
    panels_q4_1,
    wider,
    "avx512f,avx512bw,avx512vnni",
    nibble_tile[PanelQ4_1<16>],
    PanelQ4_1<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q4_0,
    wider,
    "avx512f,avx512bw,avx512vnni",
    nibble_tile[PanelQ4_0<16>],
    PanelQ4_0<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q4_k,
    wider,
    "avx512f,avx512bw,avx512vnni",
    tile_q4_k[],
    PanelQ4K<16>,
    BlockQ8K,
    _mm512_storeu_ps
);
panels!(
    panels_q5_k,
    wider,
    "avx512f,avx512bw,avx512vnni",
    tile_q5_k[],
    PanelQ5K<16>,
    BlockQ8K,
    _mm512_storeu_ps
);
panels!(
    panels_q6_k,
    wider,
    "avx512f,avx512bw,avx512vnni",
    tile_q6_k[],
    PanelQ6K<16>,
    BlockQ8K,
    _mm512_storeu_ps
);
panels!(
    panels_q8_0,
    wider,
    "avx512f,avx512bw,avx512vnni",
    tile_q8_0[],
    PanelQ8_0<16>,
    BlockQ8_0,
    _mm512_storeu_ps
);
