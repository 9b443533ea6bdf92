//! The AVX2 tiles of the K-quant panels (Q4_K, Q5_K, Q6_K): their integer sums from nibbles
//! and bit planes, each sub-block's scale made on the fly, and their panel drivers.

// Tiles index their accumulators by row and column: clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use super::*;

/// Eight sub-block bytes (one per row) as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn byte_lanes(b: &[u8; 8]) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
        b.as_ptr() as *const __m128i
    )))
}

/// One block's integer sums for a panel of eight rows' 5-bit Q5_K values (`bits`: the low
/// nibbles as [`PanelQ4_1`]'s, the fifth bits as [`PanelQ5K`] lays them) × `C` activation
/// rows, as [`nibble_sums`]; `maddubs` pairs are at most 2·31·127 = 7,874, so four add in i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn five_bit_sums<const C: usize, const VNNI: bool>(
    bits: &FiveBits<8>,
    a: *const BlockQ8_1,
    kb: usize,
) -> [__m256i; C] {
    let (low, five) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let h = _mm256_loadu_si256(bits.qh.as_ptr() as *const __m256i);
    // Group g's fifth bits at bit 4 of each byte: bit g moved by 4 − g (16-bit shifts, masked
    // to the byte's own bit).
    let high = [
        _mm256_slli_epi16(h, 4),
        _mm256_slli_epi16(h, 3),
        _mm256_slli_epi16(h, 2),
        _mm256_slli_epi16(h, 1),
        h,
        _mm256_srli_epi16(h, 1),
        _mm256_srli_epi16(h, 2),
        _mm256_srli_epi16(h, 3),
    ];
    let mut w = [_mm256_setzero_si256(); 8];
    for (c4, chunk) in bits.ql.iter().enumerate() {
        let chunk = _mm256_loadu_si256(chunk.as_ptr() as *const __m256i);
        w[c4] = _mm256_and_si256(chunk, low);
        w[c4 + 4] = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low);
    }
    for (w, high) in w.iter_mut().zip(high) {
        *w = _mm256_or_si256(*w, _mm256_and_si256(high, five));
    }
    let mut isum = [_mm256_setzero_si256(); C];
    for (c, sum) in isum.iter_mut().enumerate() {
        let ap = (*a.add(c * kb)).qs.as_ptr() as *const i32;
        let av = |g: usize| _mm256_set1_epi32(ap.add(g).read_unaligned());
        for half in 0..2 {
            let g = 4 * half;
            *sum = if VNNI {
                let s = vpdpbusd!(vpdpbusd!(*sum, w[g], av(g)), w[g + 1], av(g + 1));
                vpdpbusd!(vpdpbusd!(s, w[g + 2], av(g + 2)), w[g + 3], av(g + 3))
            } else {
                let s16 = _mm256_add_epi16(
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[g], av(g)),
                        _mm256_maddubs_epi16(w[g + 1], av(g + 1)),
                    ),
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[g + 2], av(g + 2)),
                        _mm256_maddubs_epi16(w[g + 3], av(g + 3)),
                    ),
                );
                _mm256_add_epi32(*sum, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)))
            };
        }
    }
    isum
}

/// A tile of a K-quant panel with 6-bit sub-block scales and mins (Q4_K, Q5_K): eight weight
/// rows, `kb / 8` super-blocks from `w`, × `C` activation rows, as [`nibble_tile`] with each
/// sub-block's scale and offset made on the fly: `acc += (d_w·sc_j·d_a) · sum` and
/// `acc −= (dmin_w·m_j) · s_a` (both products of an f16 and a 6-bit integer, exact in f32).
/// `$sums` gives sub-block j's integer sums from `p.$bits[j]`.
macro_rules! k_tile {
    ($name:ident, $panel:ty, $sums:ident, $bits:ident) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const C: usize, const VNNI: bool>(
            w: *const $panel,
            kb: usize,
            a: *const BlockQ8_1,
            ad: *const f32,
            s: *const f32,
        ) -> [__m256; C] {
            let mut acc = [_mm256_setzero_ps(); C];
            for sb in 0..kb / 8 {
                let p = &*w.add(sb);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
                let mw = _mm256_cvtph_ps(_mm_loadu_si128(p.dmin.as_ptr() as *const __m128i));
                for j in 0..8 {
                    let b = 8 * sb + j;
                    super::prefetch_part(p, j);
                    let isum = $sums::<C, VNNI>(&p.$bits[j], a.add(b), kb);
                    let ds = _mm256_mul_ps(dw, byte_lanes(&p.sc[j]));
                    let dm = _mm256_mul_ps(mw, byte_lanes(&p.m[j]));
                    for c in 0..C {
                        let dd = _mm256_mul_ps(ds, _mm256_set1_ps(*ad.add(c * kb + b)));
                        acc[c] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[c]), acc[c]);
                        acc[c] = _mm256_fnmadd_ps(dm, _mm256_set1_ps(*s.add(c * kb + b)), acc[c]);
                    }
                }
            }
            acc
        }
    };
}
k_tile!(panel_tile_q4_k, PanelQ4K<8>, nibble_sums, qs);
k_tile!(panel_tile_q5_k, PanelQ5K<8>, five_bit_sums, sub);

/// One block's integer sums for a panel of eight rows' 6-bit Q6_K values (`bits`: the low
/// nibbles as [`PanelQ4_1`]'s, the high bits as [`PanelQ6K`] lays them) × `C` activation rows:
/// lane k of `[lo, hi][c]` is row k's Σ q_w·q_a over the block's elements 0..16 and 16..32, with q_w
/// unsigned (0..64). `maddubs` pairs are at most 2·63·127 = 16,002, so two add in i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn six_bit_sums<const C: usize, const VNNI: bool>(
    bits: &SixBits<8>,
    a: *const BlockQ8_1,
    kb: usize,
) -> [[__m256i; C]; 2] {
    let (low, three) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    let mut w = [_mm256_setzero_si256(); 8];
    for (c4, chunk) in bits.ql.iter().enumerate() {
        let chunk = _mm256_loadu_si256(chunk.as_ptr() as *const __m256i);
        w[c4] = _mm256_and_si256(chunk, low);
        w[c4 + 4] = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low);
    }
    for (v, high) in bits.qh.iter().enumerate() {
        let h = _mm256_loadu_si256(high.as_ptr() as *const __m256i);
        let hs = [
            h,
            _mm256_srli_epi16(h, 2),
            _mm256_srli_epi16(h, 4),
            _mm256_srli_epi16(h, 6),
        ];
        for (t, h) in hs.into_iter().enumerate() {
            let bits = _mm256_slli_epi16(_mm256_and_si256(h, three), 4);
            w[4 * v + t] = _mm256_or_si256(w[4 * v + t], bits);
        }
    }
    let mut sums = [[_mm256_setzero_si256(); C]; 2];
    for (half, sums) in sums.iter_mut().enumerate() {
        for (c, sum) in sums.iter_mut().enumerate() {
            let ap = (*a.add(c * kb)).qs.as_ptr() as *const i32;
            let av = |g: usize| _mm256_set1_epi32(ap.add(g).read_unaligned());
            for pair in 0..2 {
                let g = 4 * half + 2 * pair;
                *sum = if VNNI {
                    vpdpbusd!(vpdpbusd!(*sum, w[g], av(g)), w[g + 1], av(g + 1))
                } else {
                    let s16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[g], av(g)),
                        _mm256_maddubs_epi16(w[g + 1], av(g + 1)),
                    );
                    _mm256_add_epi32(*sum, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)))
                };
            }
        }
    }
    sums
}

/// Eight signed sub-block bytes (one per row) as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_lanes(b: &[i8; 8]) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
        b.as_ptr() as *const __m128i
    )))
}

/// One panel of Q6_K (eight weight rows, `kb / 8` super-blocks from `w`) × `C` activation
/// rows, whose `s` holds `32·Σq` of each half of each block (`Panel::HALF_SUMS`). Per block
/// and half, `x = Σ q_w·q_a − 32·Σq_a` (the offset of 32 taken out, exact in f32), then
/// `acc += (d_w·d_a) · (sc_lo·x_lo + sc_hi·x_hi)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_tile_q6_k<const C: usize, const VNNI: bool>(
    w: *const PanelQ6K<8>,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m256; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    for sb in 0..kb / 8 {
        let p = &*w.add(sb);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
        for j in 0..8 {
            let b = 8 * sb + j;
            super::prefetch_part(p, j);
            let [lo, hi] = six_bit_sums::<C, VNNI>(&p.sub[j], a.add(b), kb);
            let (sl, sh) = (signed_lanes(&p.sc[2 * j]), signed_lanes(&p.sc[2 * j + 1]));
            for c in 0..C {
                let at = 2 * (c * kb + b);
                let xl = _mm256_sub_ps(_mm256_cvtepi32_ps(lo[c]), _mm256_set1_ps(*s.add(at)));
                let xh = _mm256_sub_ps(_mm256_cvtepi32_ps(hi[c]), _mm256_set1_ps(*s.add(at + 1)));
                let t = _mm256_fmadd_ps(sh, xh, _mm256_mul_ps(sl, xl));
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.add(c * kb + b)));
                acc[c] = _mm256_fmadd_ps(dd, t, acc[c]);
            }
        }
    }
    acc
}

panels!(
    panels_q4_k,
    [VNNI],
    "avx2,fma,f16c",
    panel_tile_q4_k,
    PanelQ4K<8>,
    BlockQ8_1,
    _mm256_storeu_ps
);
panels!(
    panels_q5_k,
    [VNNI],
    "avx2,fma,f16c",
    panel_tile_q5_k,
    PanelQ5K<8>,
    BlockQ8_1,
    _mm256_storeu_ps
);
panels!(
    panels_q6_k,
    [VNNI],
    "avx2,fma,f16c",
    panel_tile_q6_k,
    PanelQ6K<8>,
    BlockQ8_1,
    _mm256_storeu_ps
);
