//! A one-row step's product for Q4_0 as the file holds it (a mixture's experts read in the
//! map): four weight rows against the one activation row, each row's arithmetic that of
//! [`dot_q4_0_q8_1`] (so its bits, and those of the batch tiles), with less work per block: the
//! four rows' scales converted by one `vcvtph2ps` and their offsets `−8·d·s_y` added as one
//! vector (`(−8·d)·s_y` and `d·(−8·s_y)` are the same single rounding of the same exact
//! product), a block's nibbles unpacked from one broadcast load, and the byte products taken
//! by AVX-512's or AVX-VNNI's `vpdpbusd` where the CPU has either (the same integers as
//! `maddubs`). Compiled three times, as the MXFP4 tiles are.

use super::*;

/// The byte products of one block for every instruction set: four per i32 lane.
macro_rules! kernels {
    ($rows4:ident, $features:literal, |$u:ident, $s:ident| $dot4:expr) => {
        /// Four Q4_0 weight rows at `w` (`a.len()` blocks each) · `a`, into `out`.
        ///
        /// # Safety
        /// The target features; `4·a.len()` blocks readable at `w`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $rows4(w: *const BlockQ4_0, a: &[BlockQ8_1], out: &mut [f32]) {
            let kb = a.len();
            let low = _mm256_set1_epi8(0x0F);
            // The high nibbles into the upper 128 bits (elements 16..32).
            let shifts = _mm256_setr_epi64x(0, 0, 4, 4);
            let lane = [
                _mm256_set1_epi32(0),
                _mm256_set1_epi32(1),
                _mm256_set1_epi32(2),
                _mm256_set1_epi32(3),
            ];
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut offsets = _mm_setzero_ps();
            for (b, y) in a.iter().enumerate() {
                let x = [0, 1, 2, 3].map(|r| &*w.add(r * kb + b));
                let d = _mm_cvtph_ps(_mm_setr_epi16(
                    x[0].d as i16,
                    x[1].d as i16,
                    x[2].d as i16,
                    x[3].d as i16,
                    0,
                    0,
                    0,
                    0,
                ));
                let dy = two_halves(&y.d);
                // [d_r·d_y] and Σ d_r·(−8·s_y), lane r for row r.
                let scales = _mm256_castps128_ps256(_mm_mul_ps(d, _mm_broadcastss_ps(dy)));
                let m8 = _mm_mul_ps(_mm_shuffle_ps(dy, dy, 0b01_01_01_01), _mm_set1_ps(-8.0));
                offsets = _mm_add_ps(offsets, _mm_mul_ps(d, m8));
                let $s = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                for r in 0..4 {
                    let nibbles =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(x[r].qs.as_ptr() as *const _));
                    let $u = _mm256_and_si256(_mm256_srlv_epi64(nibbles, shifts), low);
                    let sums = _mm256_cvtepi32_ps($dot4);
                    let scale = _mm256_permutevar8x32_ps(scales, lane[r]);
                    acc[r] = _mm256_fmadd_ps(scale, sums, acc[r]);
                }
            }
            let mut off = [0f32; 4];
            _mm_storeu_ps(off.as_mut_ptr(), offsets);
            for r in 0..4 {
                // `hsum`'s tree, then the offsets, as `dot_nibbles` adds them.
                let v = acc[r];
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                out[r] = _mm_cvtss_f32(s) + off[r];
            }
        }
    };
}

kernels!(rows4_avx2, "avx2,fma,f16c", |u, s| {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
});
kernels!(rows4_avx_vnni, "avx2,fma,f16c,avxvnni", |u, s| {
    vpdpbusd!(_mm256_setzero_si256(), u, s)
});
kernels!(
    rows4_avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    |u, s| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
);

/// AVX-512's 256-bit forms (VL), which `Isa::Avx512Vnni` does not promise by itself.
fn has_avx512_vl() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512vl"))
}

/// Every row of `w` (whole rows of `a.len()` blocks) · the one activation row `a` into `out`,
/// four weight rows at a time on the best instruction set `isa` allows (a last few rows by
/// [`dot_q4_0_q8_1`]); every output has [`dot_q4_0_q8_1`]'s bits.
///
/// # Safety
/// `isa` checked and [`avx2`](Isa::avx2).
pub(crate) unsafe fn dots_q4_0_q8_1(isa: Isa, w: &[BlockQ4_0], a: &[BlockQ8_1], out: &mut [f32]) {
    let kb = a.len();
    assert_eq!(w.len(), out.len() * kb);
    let done = out.len() / 4 * 4;
    let vnni = isa.avx_vnni();
    for (n, o) in out[..done].chunks_exact_mut(4).enumerate() {
        let wp = w.as_ptr().add(4 * n * kb);
        match isa {
            Isa::Avx512Vnni if has_avx512_vl() => rows4_avx512(wp, a, o),
            _ if vnni => rows4_avx_vnni(wp, a, o),
            _ => rows4_avx2(wp, a, o),
        }
    }
    for (r, o) in out[done..].iter_mut().enumerate() {
        let row = &w[(done + r) * kb..(done + r + 1) * kb];
        *o = match vnni {
            true => dot_nibbles::<BlockQ4_0, true>(row, a),
            false => dot_nibbles::<BlockQ4_0, false>(row, a),
        };
    }
}
