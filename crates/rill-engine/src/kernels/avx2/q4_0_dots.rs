//! Products of Q4_0 as the file holds it (a mixture's experts read in the map): tiles of four
//! weight rows × one to four activation rows, each pair's arithmetic that of [`dot_q4_0_q8_1`]
//! (so its bits, alone or in a batch: each lane's integers less the activations' sum, as
//! ggml's `q − 8` weights give them), with less work per block: the four rows' scales
//! converted by one `vcvtph2ps`, a block's nibbles unpacked from one broadcast load, and the
//! byte products taken by AVX-512's or AVX-VNNI's `vpdpbusd` where the CPU has either (the
//! same integers as `maddubs`). Compiled three times, as the MXFP4 tiles are.

use super::*;

/// The byte products of one block for every instruction set: four per i32 lane.
macro_rules! kernels {
    ($tile:ident, $features:literal, |$u:ident, $s:ident| $dot4:expr) => {
        /// Four Q4_0 weight rows (row r at `w + r·kb`) × `C` Q8_1 activation rows (row c at
        /// `a + c·kb`): each weight block unpacked once for the `C` rows, each activation
        /// block loaded once for the four.
        ///
        /// # Safety
        /// The target features; `4·kb` blocks readable at `w`, `C·kb` at `a`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $tile<const C: usize>(
            w: *const BlockQ4_0,
            kb: usize,
            a: *const BlockQ8_1,
        ) -> [[f32; C]; 4] {
            let low = _mm256_set1_epi8(0x0F);
            // The high nibbles into the upper 128 bits (elements 16..32).
            let shifts = _mm256_setr_epi64x(0, 0, 4, 4);
            let lane = [
                _mm256_set1_epi32(0),
                _mm256_set1_epi32(1),
                _mm256_set1_epi32(2),
                _mm256_set1_epi32(3),
            ];
            let mut acc = [[_mm256_setzero_ps(); C]; 4];
            for b in 0..kb {
                let x = [0, 1, 2, 3].map(|r| &*w.add(r * kb + b));
                for x in x {
                    prefetch_rows_ahead(x, kb);
                }
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
                let mut scales = [_mm256_setzero_ps(); C];
                let mut qy = [_mm256_setzero_si256(); C];
                let mut ay = [_mm256_setzero_si256(); C];
                for c in 0..C {
                    let y = &*a.add(c * kb + b);
                    let dy = two_halves(&y.d);
                    // [d_r·d_y], lane r for row r.
                    scales[c] = _mm256_castps128_ps256(_mm_mul_ps(d, _mm_broadcastss_ps(dy)));
                    qy[c] = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                    ay[c] = _mm256_set1_epi32(y.sum as i32);
                }
                for r in 0..4 {
                    let nibbles =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(x[r].qs.as_ptr() as *const _));
                    let $u = _mm256_and_si256(_mm256_srlv_epi64(nibbles, shifts), low);
                    for c in 0..C {
                        let $s = qy[c];
                        let sums = _mm256_cvtepi32_ps(_mm256_sub_epi32($dot4, ay[c]));
                        let scale = _mm256_permutevar8x32_ps(scales[c], lane[r]);
                        acc[r][c] = _mm256_fmadd_ps(scale, sums, acc[r][c]);
                    }
                }
            }
            let mut out = [[0f32; C]; 4];
            for c in 0..C {
                for r in 0..4 {
                    // `hsum`'s tree, as `dot_nibbles` ends.
                    let v = acc[r][c];
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                    out[r][c] = _mm_cvtss_f32(s);
                }
            }
            out
        }
    };
}

kernels!(tile_avx2, "avx2,fma,f16c", |u, s| {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
});
kernels!(tile_avx_vnni, "avx2,fma,f16c,avxvnni", |u, s| {
    vpdpbusd!(_mm256_setzero_si256(), u, s)
});
kernels!(
    tile_avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    |u, s| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
);

/// Four weight rows × `C` activation rows on the best instruction set `isa` allows.
///
/// # Safety
/// `isa` checked and [`avx2`](Isa::avx2); the bounds of the tiles.
#[inline]
unsafe fn tile<const C: usize>(
    isa: Isa,
    w: *const BlockQ4_0,
    kb: usize,
    a: *const BlockQ8_1,
) -> [[f32; C]; 4] {
    match isa {
        Isa::Avx512Vnni if has_avx512_vl() => tile_avx512::<C>(w, kb, a),
        _ if isa.avx_vnni() => tile_avx_vnni::<C>(w, kb, a),
        _ => tile_avx2::<C>(w, kb, a),
    }
}

/// Every row of `w` (whole rows of `a.len()` blocks) · the one activation row `a` into `out`,
/// four weight rows at a time (a last few rows by [`dot_q4_0_q8_1`]); every output has
/// [`dot_q4_0_q8_1`]'s bits.
///
/// # Safety
/// `isa` checked and [`avx2`](Isa::avx2).
pub(crate) unsafe fn dots_q4_0_q8_1(isa: Isa, w: &[BlockQ4_0], a: &[BlockQ8_1], out: &mut [f32]) {
    let kb = a.len();
    assert_eq!(w.len(), out.len() * kb);
    let done = out.len() / 4 * 4;
    for n in (0..done).step_by(4) {
        let t = tile::<1>(isa, w.as_ptr().add(n * kb), kb, a.as_ptr());
        out[n..n + 4].iter_mut().zip(t).for_each(|(o, [v])| *o = v);
    }
    let vnni = isa.avx_vnni();
    for (r, o) in out[done..].iter_mut().enumerate() {
        let row = &w[(done + r) * kb..(done + r + 1) * kb];
        *o = match vnni {
            true => dot_nibbles::<BlockQ4_0, true>(row, a),
            false => dot_nibbles::<BlockQ4_0, false>(row, a),
        };
    }
}

/// [`Format::rows`] for Q4_0 as the file holds it: four weight rows × up to four activation
/// rows a tile (each pair's arithmetic, so its bits, as [`dots_q4_0_q8_1`]'s), a last few
/// weight rows by [`rows_q4_0`]'s tiles (the same bits again).
///
/// # Safety
/// `isa` checked and [`avx2`](Isa::avx2); the bounds [`Format::rows`] asserts.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_q4_0_file(
    isa: Isa,
    w: &[BlockQ4_0],
    acts: &Acts<BlockQ8_1>,
    is: std::ops::Range<usize>,
    out: &mut [f32],
    sj: usize,
    si: usize,
) {
    let kb = acts.kb;
    let n = w.len() / kb;
    let done = n / 4 * 4;
    row_tiles!(
        0..done,
        is.clone(),
        4,
        [(4, 4)(4, 3)(4, 2)(4, 1)],
        (out.as_mut_ptr(), sj, si),
        |R, C, j, i| tile::<C>(isa, w.as_ptr().add(j * kb), kb, acts.q.as_ptr().add(i * kb))
    );
    if done < n {
        let rest = &mut out[done * sj..];
        match isa.avx_vnni() {
            true => rows_q4_0::<true>(isa, &w[done * kb..], acts, is, rest, sj, si),
            false => rows_q4_0::<false>(isa, &w[done * kb..], acts, is, rest, sj, si),
        }
    }
}
