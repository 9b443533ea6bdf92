//! The panel kernels on 512-bit registers (AVX-512F, BW and VNNI): panels of sixteen weight
//! rows, one per vector lane, read as one stream. Each lane does what a lane of the 256-bit
//! kernels does — the block's exact integer sum by `vpdpbusd`, then the same float multiply
//! and fused multiply-adds in the same order — so the outputs are theirs bit for bit; only the
//! number of instructions per weight halves.

use std::arch::x86_64::*;

use super::{BlockQ8_0, BlockQ8_1, Panel, PanelActs, PanelQ4_1, PanelQ8_0, TILE_A};

/// A panel's sixteen f16 scales as floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scales(h: &[u16; 16]) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i))
}

/// One Q4_1 panel (`kb` blocks) × `C` activation rows: lane k of result c is weight row k ·
/// activation row c, as `avx2::panel_tile` computes it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q4_1<const C: usize>(
    w: *const PanelQ4_1<16>,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m512; C] {
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..kb {
        let p = &*w.add(b);
        let mut isum = [_mm512_setzero_si512(); C];
        for c4 in 0..4 {
            let chunk = _mm512_loadu_si512(p.qs[c4].as_ptr() as *const __m512i);
            let nibbles = [
                _mm512_and_si512(chunk, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(chunk), low),
            ];
            for (h, wq) in nibbles.into_iter().enumerate() {
                let g = c4 + 4 * h;
                for (c, sum) in isum.iter_mut().enumerate() {
                    let ap = (*a.add(c * kb + b)).qs.as_ptr().add(4 * g) as *const i32;
                    *sum = _mm512_dpbusd_epi32(*sum, wq, _mm512_set1_epi32(ap.read_unaligned()));
                }
            }
        }
        let (dw, mw) = (scales(&p.d), scales(&p.m));
        for (c, (acc, sum)) in acc.iter_mut().zip(isum).enumerate() {
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*ad.add(c * kb + b)));
            *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), *acc);
            *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(*s.add(c * kb + b)), *acc);
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
    panels_q8_0,
    [],
    "avx512f,avx512bw,avx512vnni",
    tile_q8_0,
    PanelQ8_0<16>,
    BlockQ8_0,
    _mm512_storeu_ps
);
