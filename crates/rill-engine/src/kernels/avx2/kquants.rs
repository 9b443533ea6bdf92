//! The AVX2 tiles of the K-quant panels (Q4_K, Q5_K, Q6_K) against Q8_K activations: each
//! sub-block's exact integer sums, its 6-bit or 8-bit scale applied in integers, so a
//! super-block ends with one integer per row (two with Q4_K's and Q5_K's mins), converted and
//! scaled once, as ggml's K-quant dot products do.

// Tiles index their accumulators by row and column: clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use super::*;

/// Eight row bytes (one per row) as unsigned i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn u8_lanes(b: &[u8; 8]) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr() as *const __m128i))
}

/// Eight signed row bytes as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8_lanes(b: &[i8; 8]) -> __m256i {
    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr() as *const __m128i))
}

/// A sub-block's nibbles (laid out as [`PanelQ4_1`]'s) as eight vectors: lane k of `w[g]` holds
/// row k's elements `4g..4g+4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(qs: &[[[u8; 4]; 8]; 4]) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut w = [_mm256_setzero_si256(); 8];
    for (c4, chunk) in qs.iter().enumerate() {
        let chunk = _mm256_loadu_si256(chunk.as_ptr() as *const __m256i);
        w[c4] = _mm256_and_si256(chunk, low);
        w[c4 + 4] = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low);
    }
    w
}

/// A Q5_K sub-block's 5-bit values as [`nibbles`] gives them: the low nibbles, and the fifth
/// bits as [`PanelQ5K`] lays them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn five_bits(bits: &FiveBits<8>) -> [__m256i; 8] {
    let five = _mm256_set1_epi8(0x10);
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
    let mut w = nibbles(&bits.ql);
    for (w, high) in w.iter_mut().zip(high) {
        *w = _mm256_or_si256(*w, _mm256_and_si256(high, five));
    }
    w
}

/// A Q6_K sub-block's 6-bit values (0..64) as [`nibbles`] gives them: the low nibbles, and the
/// high two bits as [`SixBits`] lays them, each moved to bits 4–5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn six_bits(bits: &SixBits<8>) -> [__m256i; 8] {
    let mid = _mm256_set1_epi8(0x30);
    let mut w = nibbles(&bits.ql);
    for (v, high) in bits.qh.iter().enumerate() {
        let h = _mm256_loadu_si256(high.as_ptr() as *const __m256i);
        // Bits 2t..2t+2 to bits 4–5 (16-bit shifts, masked to the byte's own bits).
        let hs = [
            _mm256_slli_epi16(h, 4),
            _mm256_slli_epi16(h, 2),
            h,
            _mm256_srli_epi16(h, 2),
        ];
        for (t, h) in hs.into_iter().enumerate() {
            let g = six_bits_group(v, t);
            w[g] = _mm256_or_si256(w[g], _mm256_and_si256(h, mid));
        }
    }
    w
}

/// Per lane, the exact Σ over the groups `w` of `w[g]·a[4g..4g+4]` (unsigned weights, signed
/// activations at `a`). With `VNNI`, a chain of `vpdpbusd`; else `maddubs` pairs added `N` at
/// a time in i16 (the caller's weights keep them in range: `N·2·max_w·127 < 2¹⁵`), then `madd`
/// into i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_groups<const VNNI: bool, const N: usize>(w: &[__m256i], a: *const i8) -> __m256i {
    let ap = a as *const i32;
    let av = |g: usize| _mm256_set1_epi32(ap.add(g).read_unaligned());
    let mut sum = _mm256_setzero_si256();
    if VNNI {
        for (g, w) in w.iter().enumerate() {
            sum = vpdpbusd!(sum, *w, av(g));
        }
        return sum;
    }
    for first in (0..w.len()).step_by(N) {
        let mut s16 = _mm256_maddubs_epi16(w[first], av(first));
        for g in first + 1..first + N {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[g], av(g)));
        }
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
    }
    sum
}

/// A tile of a K-quant panel with 6-bit sub-block scales and mins (Q4_K, Q5_K): eight weight
/// rows, `kb` super-blocks from `w`, × `C` Q8_K activation rows. Per super-block, the exact
/// integers `t = Σ_j sc_j·Σ(q_w·q_a)` and `s = Σ_j m_j·Σq_a`, then `acc += (d_w·d_a)·t` and
/// `acc −= (dmin_w·d_a)·s`, as `dot_q4_k_q8_k_scalar`. `$weights` gives sub-block j's values
/// from `p.$bits[j]`; `maddubs` pairs are at most 2·31·127, so four add in i16.
macro_rules! k_tile {
    ($name:ident, $panel:ty, $weights:ident, $bits:ident) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const C: usize, const VNNI: bool>(
            w: *const $panel,
            kb: usize,
            a: *const BlockQ8K,
            ad: *const f32,
            _s: *const f32,
        ) -> [__m256; C] {
            let mut acc = [_mm256_setzero_ps(); C];
            for sb in 0..kb {
                let p = &*w.add(sb);
                let mut t = [_mm256_setzero_si256(); C];
                for j in 0..8 {
                    super::prefetch_part(p, j);
                    let wv = $weights(&p.$bits[j]);
                    let sc = u8_lanes(&p.sc[j]);
                    for c in 0..C {
                        let y = &*a.add(c * kb + sb);
                        let sum = dot_groups::<VNNI, 4>(&wv, y.qs.as_ptr().add(QK * j));
                        t[c] = _mm256_add_epi32(t[c], _mm256_mullo_epi32(sum, sc));
                    }
                }
                // The mins by pairs of sub-blocks: one 16-bit product of pairs (`madd`) where
                // two 32-bit multiplies were, the same integers.
                let m: [__m256i; 4] = std::array::from_fn(|jp| {
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.m[jp].as_ptr() as *const __m128i))
                });
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
                let mw = _mm256_cvtph_ps(_mm_loadu_si128(p.dmin.as_ptr() as *const __m128i));
                for c in 0..C {
                    let y = &*a.add(c * kb + sb);
                    let mut mins = _mm256_setzero_si256();
                    for (jp, m) in m.iter().enumerate() {
                        let s = _mm256_set1_epi32(y.sum_pair(jp));
                        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(*m, s));
                    }
                    let da = _mm256_set1_ps(*ad.add(c * kb + sb));
                    let (tf, mf) = (_mm256_cvtepi32_ps(t[c]), _mm256_cvtepi32_ps(mins));
                    acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), tf, acc[c]);
                    acc[c] = _mm256_fnmadd_ps(_mm256_mul_ps(mw, da), mf, acc[c]);
                }
            }
            acc
        }
    };
}
k_tile!(panel_tile_q4_k, PanelQ4K<8>, nibbles, qs);
k_tile!(panel_tile_q5_k, PanelQ5K<8>, five_bits, sub);

/// One panel of Q6_K (eight weight rows, `kb` super-blocks from `w`) × `C` Q8_K activation
/// rows. Per super-block, the exact integer `t = Σ_g sc_g·(Σ q_w·q_a − 32·Σq_a)` over its 16
/// groups of 16 (q_w in 0..64), then `acc += (d_w·d_a)·t`, as `dot_q6_k_q8_k_scalar`.
/// `maddubs` pairs are at most 2·63·127, so two add in i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_tile_q6_k<const C: usize, const VNNI: bool>(
    w: *const PanelQ6K<8>,
    kb: usize,
    a: *const BlockQ8K,
    ad: *const f32,
    _s: *const f32,
) -> [__m256; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    for sb in 0..kb {
        let p = &*w.add(sb);
        let mut t = [_mm256_setzero_si256(); C];
        for j in 0..8 {
            super::prefetch_part(p, j);
            let wv = six_bits(&p.sub[j]);
            let sc = [i8_lanes(&p.sc[2 * j]), i8_lanes(&p.sc[2 * j + 1])];
            for c in 0..C {
                let y = &*a.add(c * kb + sb);
                for (half, sc) in sc.iter().enumerate() {
                    let g = 2 * j + half;
                    let sum = dot_groups::<VNNI, 2>(
                        &wv[4 * half..4 * half + 4],
                        y.qs.as_ptr().add(16 * g),
                    );
                    let x = _mm256_sub_epi32(sum, _mm256_set1_epi32(32 * y.bsums[g] as i32));
                    t[c] = _mm256_add_epi32(t[c], _mm256_mullo_epi32(x, *sc));
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
        for c in 0..C {
            let da = _mm256_set1_ps(*ad.add(c * kb + sb));
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(t[c]), acc[c]);
        }
    }
    acc
}

panels!(
    panels_q4_k,
    [VNNI],
    "avx2,fma,f16c",
    panel_tile_q4_k[],
    PanelQ4K<8>,
    BlockQ8K,
    _mm256_storeu_ps
);
panels!(
    panels_q5_k,
    [VNNI],
    "avx2,fma,f16c",
    panel_tile_q5_k[],
    PanelQ5K<8>,
    BlockQ8K,
    _mm256_storeu_ps
);
panels!(
    panels_q6_k,
    [VNNI],
    "avx2,fma,f16c",
    panel_tile_q6_k[],
    PanelQ6K<8>,
    BlockQ8K,
    _mm256_storeu_ps
);
