//! The panel kernels on 512-bit registers (AVX-512F, BW and VNNI): panels of sixteen weight
//! rows, one per vector lane, read as one stream. Each lane does what a lane of the 256-bit
//! kernels does — the block's exact integer sum by `vpdpbusd`, then the same float multiply
//! and fused multiply-adds in the same order — so the outputs are theirs bit for bit; only the
//! number of instructions per weight halves.

use std::arch::x86_64::*;

use super::{
    BlockQ8_0, BlockQ8_1, FiveBits, Nibbles, Panel, PanelActs, PanelQ4K, PanelQ4_0, PanelQ4_1,
    PanelQ5K, PanelQ6K, PanelQ8_0, SixBits, TILE_A,
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
        let isum = nibble_sums::<C>(p.qs(), a.add(b), kb);
        let dw = scales(p.d());
        let mw = match p.m() {
            Some(m) => scales(m),
            None => _mm512_mul_ps(dw, _mm512_set1_ps(-8.0)),
        };
        for (c, (acc, sum)) in acc.iter_mut().zip(isum).enumerate() {
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*ad.add(c * kb + b)));
            *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), *acc);
            *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(*s.add(c * kb + b)), *acc);
        }
    }
    acc
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q4_1<const C: usize>(
    w: *const PanelQ4_1<16>,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m512; C] {
    nibble_tile::<_, C>(w, kb, a, ad, s)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q4_0<const C: usize>(
    w: *const PanelQ4_0<16>,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m512; C] {
    nibble_tile::<_, C>(w, kb, a, ad, s)
}

/// Sixteen sub-block bytes (one per row) as f32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn byte_lanes(b: &[u8; 16]) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
        b.as_ptr() as *const __m128i
    )))
}

/// One block's integer sums for sixteen rows' 5-bit Q5_K values × `C` activation rows, as
/// `avx2::five_bit_sums` computes them (with `vpdpbusd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn five_bit_sums<const C: usize>(
    bits: &FiveBits<16>,
    a: *const BlockQ8_1,
    kb: usize,
) -> [__m512i; C] {
    let (low, five) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
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
    let mut w = [_mm512_setzero_si512(); 8];
    for (c4, chunk) in bits.ql.iter().enumerate() {
        let chunk = _mm512_loadu_si512(chunk.as_ptr() as *const __m512i);
        w[c4] = _mm512_and_si512(chunk, low);
        w[c4 + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(chunk), low);
    }
    for (w, high) in w.iter_mut().zip(high) {
        *w = _mm512_or_si512(*w, _mm512_and_si512(high, five));
    }
    let mut isum = [_mm512_setzero_si512(); C];
    for (c, sum) in isum.iter_mut().enumerate() {
        let ap = (*a.add(c * kb)).qs.as_ptr() as *const i32;
        for (g, wq) in w.iter().enumerate() {
            let av = _mm512_set1_epi32(ap.add(g).read_unaligned());
            *sum = _mm512_dpbusd_epi32(*sum, *wq, av);
        }
    }
    isum
}

/// A tile of a K-quant panel with 6-bit scales and mins (Q4_K, Q5_K): sixteen rows, `kb / 8`
/// super-blocks, × `C` activation rows, as `avx2`'s `k_tile!` computes it.
macro_rules! k_tile {
    ($name:ident, $panel:ty, $sums:ident, $bits:ident) => {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
        unsafe fn $name<const C: usize>(
            w: *const $panel,
            kb: usize,
            a: *const BlockQ8_1,
            ad: *const f32,
            s: *const f32,
        ) -> [__m512; C] {
            let mut acc = [_mm512_setzero_ps(); C];
            for sb in 0..kb / 8 {
                let p = &*w.add(sb);
                let (dw, mw) = (scales(&p.d), scales(&p.dmin));
                for j in 0..8 {
                    let b = 8 * sb + j;
                    super::prefetch_part(p, j);
                    let isum = $sums::<C>(&p.$bits[j], a.add(b), kb);
                    let ds = _mm512_mul_ps(dw, byte_lanes(&p.sc[j]));
                    let dm = _mm512_mul_ps(mw, byte_lanes(&p.m[j]));
                    for (c, (acc, sum)) in acc.iter_mut().zip(isum).enumerate() {
                        let dd = _mm512_mul_ps(ds, _mm512_set1_ps(*ad.add(c * kb + b)));
                        *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), *acc);
                        *acc = _mm512_fnmadd_ps(dm, _mm512_set1_ps(*s.add(c * kb + b)), *acc);
                    }
                }
            }
            acc
        }
    };
}
k_tile!(tile_q4_k, PanelQ4K<16>, nibble_sums, qs);
k_tile!(tile_q5_k, PanelQ5K<16>, five_bit_sums, sub);

/// One block's half sums for sixteen rows' 6-bit Q6_K values × `C` activation rows, as
/// `avx2::six_bit_sums` computes them (with `vpdpbusd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn six_bit_sums<const C: usize>(
    bits: &SixBits<16>,
    a: *const BlockQ8_1,
    kb: usize,
) -> [[__m512i; C]; 2] {
    let (low, three) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
    let mut w = [_mm512_setzero_si512(); 8];
    for (c4, chunk) in bits.ql.iter().enumerate() {
        let chunk = _mm512_loadu_si512(chunk.as_ptr() as *const __m512i);
        w[c4] = _mm512_and_si512(chunk, low);
        w[c4 + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(chunk), low);
    }
    for (v, high) in bits.qh.iter().enumerate() {
        let h = _mm512_loadu_si512(high.as_ptr() as *const __m512i);
        let hs = [
            h,
            _mm512_srli_epi16::<2>(h),
            _mm512_srli_epi16::<4>(h),
            _mm512_srli_epi16::<6>(h),
        ];
        for (t, h) in hs.into_iter().enumerate() {
            let bits = _mm512_slli_epi16::<4>(_mm512_and_si512(h, three));
            w[4 * v + t] = _mm512_or_si512(w[4 * v + t], bits);
        }
    }
    let mut sums = [[_mm512_setzero_si512(); C]; 2];
    for (half, sums) in sums.iter_mut().enumerate() {
        for (c, sum) in sums.iter_mut().enumerate() {
            let ap = (*a.add(c * kb)).qs.as_ptr() as *const i32;
            for (g, wq) in w.iter().enumerate().skip(4 * half).take(4) {
                let av = _mm512_set1_epi32(ap.add(g).read_unaligned());
                *sum = _mm512_dpbusd_epi32(*sum, *wq, av);
            }
        }
    }
    sums
}

/// Sixteen signed sub-block bytes (one per row) as f32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn signed_lanes(b: &[i8; 16]) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
        b.as_ptr() as *const __m128i
    )))
}

/// One Q6_K panel (`kb / 8` super-blocks) × `C` activation rows, as
/// `avx2::panel_tile_q6_k` computes it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q6_k<const C: usize>(
    w: *const PanelQ6K<16>,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for sb in 0..kb / 8 {
        let p = &*w.add(sb);
        let dw = scales(&p.d);
        for j in 0..8 {
            let b = 8 * sb + j;
            super::prefetch_part(p, j);
            let [lo, hi] = six_bit_sums::<C>(&p.sub[j], a.add(b), kb);
            let (sl, sh) = (signed_lanes(&p.sc[2 * j]), signed_lanes(&p.sc[2 * j + 1]));
            for (c, acc) in acc.iter_mut().enumerate() {
                let at = 2 * (c * kb + b);
                let xl = _mm512_sub_ps(_mm512_cvtepi32_ps(lo[c]), _mm512_set1_ps(*s.add(at)));
                let xh = _mm512_sub_ps(_mm512_cvtepi32_ps(hi[c]), _mm512_set1_ps(*s.add(at + 1)));
                let t = _mm512_fmadd_ps(sh, xh, _mm512_mul_ps(sl, xl));
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*ad.add(c * kb + b)));
                *acc = _mm512_fmadd_ps(dd, t, *acc);
            }
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
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q4_1,
    PanelQ4_1<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q4_0,
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q4_0,
    PanelQ4_0<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q4_k,
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q4_k,
    PanelQ4K<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q5_k,
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q5_k,
    PanelQ5K<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q6_k,
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q6_k,
    PanelQ6K<16>,
    BlockQ8_1,
    _mm512_storeu_ps
);
panels!(
    panels_q8_0,
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q8_0,
    PanelQ8_0<16>,
    BlockQ8_0,
    _mm512_storeu_ps
);
