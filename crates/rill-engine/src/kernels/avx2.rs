//! The AVX2 kernels (with FMA and F16C, and AVX-VNNI's byte dot products where the CPU has
//! them): tiles of weight rows × activation rows, and the 256-bit panel kernels.

// Tiles index their accumulators by row and column: clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use super::*;
use std::arch::x86_64::*;

/// `acc` plus, per 32-bit lane, the sum of the four products of unsigned bytes `u` and
/// signed bytes `s`: one AVX-VNNI `vpdpbusd`, in asm with its VEX encoding spelled out (the
/// form CPUs with AVX-VNNI but no AVX-512 run; the CPU is checked at run time).
macro_rules! vpdpbusd {
    ($acc:expr, $u:expr, $s:expr) => {{
        let (mut acc, u, s): (__m256i, __m256i, __m256i) = ($acc, $u, $s);
        std::arch::asm!(
            "{{vex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    }};
}

/// Per 32-bit lane, the sum of the four products of unsigned bytes `u` and signed bytes `s`
/// (no saturation for the operands here: |products| ≤ 15·127 or 127·127). With `$vnni`,
/// one `vpdpbusd`; else `maddubs` into i16 pairs and `madd` into i32. Both give the same
/// integers, so every path rounds the same floats.
macro_rules! dot4 {
    ($vnni:expr, $u:expr, $s:expr) => {{
        let (u, s): (__m256i, __m256i) = ($u, $s);
        if $vnni {
            vpdpbusd!(_mm256_setzero_si256(), u, s)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
        }
    }};
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The two f16 at the start of a block (`d, m` or `d, s`) as f32, in lanes 0 and 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_halves(p: *const u16) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()))
}

/// One block of 32 activations quantised to 8 bits as the scalar quantisers (and ggml's x86
/// build) do it, bit for bit: `d = max|x| / 127`, `q = x · (127 / max|x|)` rounded half to
/// even. Returns `d`, the bytes and their sum.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block(x: *const f32, qs: *mut i8) -> (f32, i32) {
    let sign = _mm256_set1_ps(-0.0);
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.add(8 * i)));
    let abs = |v: __m256| _mm256_andnot_ps(sign, v);
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|i| {
        let y = _mm256_mul_ps(v[i], id);
        _mm256_cvtps_epi32(_mm256_round_ps(
            y,
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ))
    });
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let sum = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256(sum, 1),
    );
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01)));
    // i32 → i16 → i8 packs work within 128-bit halves; the permute puts the lanes back.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs as *mut __m256i, p);
    (d, sum)
}

/// [`super::quantize_q8_0`], bit for bit.
///
/// # Safety
/// AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (d, _) = quantize_block(xs.as_ptr(), b.qs.as_mut_ptr());
        b.d = f16::from_f32(d).to_bits();
    }
}

/// [`super::quantize_q8_1`], bit for bit.
///
/// # Safety
/// AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (d, sum) = quantize_block(xs.as_ptr(), b.qs.as_mut_ptr());
        b.d = f16::from_f32(d).to_bits();
        b.s = f16::from_f32(d * sum as f32).to_bits();
        b.sum = sum as i16;
    }
}

/// A block of 32 nibbles with a scale and an offset, `d·q + m`: Q4_1's own `m`, taken as
/// `m·s` beside the block's product (ggml's Q4_1), or Q4_0's `−8·d`, taken out of the block's
/// integers, `Σq·a − 8·Σa` (ggml's `q − 8` weights), before its one scaling.
pub(crate) trait Nibbles4: Copy {
    /// Whether the offset is Q4_0's, in integers (the activations' exact `sum`).
    const Q4_0: bool;
    fn nibbles(&self) -> *const u8;
    /// `[d, m, ·, ·]` as f32 (Q4_0: `[d, 0, 0, 0]`, its offset taken in integers).
    ///
    /// # Safety
    /// F16C.
    unsafe fn dm(&self) -> __m128;
}

impl Nibbles4 for BlockQ4_1 {
    const Q4_0: bool = false;
    #[inline(always)]
    fn nibbles(&self) -> *const u8 {
        self.qs.as_ptr()
    }
    #[inline(always)]
    unsafe fn dm(&self) -> __m128 {
        two_halves(&self.d)
    }
}

impl Nibbles4 for BlockQ4_0 {
    const Q4_0: bool = true;
    #[inline(always)]
    fn nibbles(&self) -> *const u8 {
        self.qs.as_ptr()
    }
    #[inline(always)]
    unsafe fn dm(&self) -> __m128 {
        _mm_cvtph_ps(_mm_cvtsi32_si128(self.d as i32))
    }
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x` and `y` the same length.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1_q8_1<const VNNI: bool>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    dot_nibbles::<BlockQ4_1, VNNI>(x, y)
}

/// [`dot_q4_1_q8_1`] for Q4_0 as the file holds it: each block's integers less eight times the
/// activations' sum (an eighth of it in each of the eight lanes), then scaled.
///
/// # Safety
/// As [`dot_q4_1_q8_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0_q8_1<const VNNI: bool>(x: &[BlockQ4_0], y: &[BlockQ8_1]) -> f32 {
    dot_nibbles::<BlockQ4_0, VNNI>(x, y)
}

/// # Safety
/// As [`dot_q4_1_q8_1`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_nibbles<B: Nibbles4, const VNNI: bool>(x: &[B], y: &[BlockQ8_1]) -> f32 {
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    // Lane 1 gathers Q4_1's offset terms m_x·s_y.
    let mut offsets = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        // [d_x·d_y, m_x·s_y] in one multiply.
        let scales = _mm_mul_ps(x.dm(), two_halves(&y.d));
        let nibbles = _mm_loadu_si128(x.nibbles() as *const __m128i);
        // Elements 0..16 are the low nibbles, 16..32 the high ones.
        let qx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), low);
        let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
        let mut isum = dot4!(VNNI, qx, qy);
        if B::Q4_0 {
            isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(y.sum as i32));
        } else {
            offsets = _mm_add_ps(offsets, scales);
        }
        let sums = _mm256_cvtepi32_ps(isum);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), sums, acc);
    }
    if B::Q4_0 {
        return hsum(acc);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_shuffle_ps(offsets, offsets, 1))
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x` and `y` the same length.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0_q8_0<const VNNI: bool>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    // The scales by table here: converting them with F16C measured slower for this format.
    let t = f16_table();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let scale = _mm256_set1_ps(h(t, x.d) * h(t, y.d));
        let qx = _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i);
        let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
        // |x| · (y with x's sign): u8 × i8.
        let sums = dot4!(VNNI, _mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc);
    }
    hsum(acc)
}

/// One tile of 4-bit blocks ([`Nibbles4`]: Q4_1, Q4_0) × Q8_1: `R` weight rows from `w` × `C`
/// activation rows from `a` (`kb` blocks each, their scales `ad`, their `s` at
/// `s[b·stride + c]`). Each weight block
/// is unpacked and its scales converted once for the C activation rows, each activation
/// block loaded once for the R weight rows.
///
/// # Safety
/// AVX2, FMA and F16C; every row and scale read lies inside its allocation.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_nibbles<B: Nibbles4, const R: usize, const C: usize, const VNNI: bool>(
    w: *const B,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
    stride: usize,
) -> [[f32; C]; R] {
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    // Lane c of off[r]: Σ_b m_r·s_c, a 4-wide multiply and add per weight block, summed in
    // the order `dot_q4_1_q8_1` sums them, so a row's output is the same alone or in a
    // batch (and everything else in the tile rounds as it does there too).
    let mut off = [_mm_setzero_ps(); R];
    for b in 0..kb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut dx = [_mm256_setzero_ps(); R];
        let sy = _mm_loadu_ps(s.add(b * stride));
        for r in 0..R {
            let x = &*w.add(r * kb + b);
            super::prefetch_rows_ahead(x, kb);
            let nibbles = _mm_loadu_si128(x.nibbles() as *const __m128i);
            qx[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), low);
            let dm = x.dm();
            dx[r] = _mm256_broadcastss_ps(dm);
            if !B::Q4_0 {
                let m = _mm_shuffle_ps(dm, dm, 0b01_01_01_01);
                off[r] = _mm_add_ps(off[r], _mm_mul_ps(m, sy));
            }
        }
        for c in 0..C {
            let y = &*a.add(c * kb + b);
            let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
            let dy = _mm256_broadcast_ss(&*ad.add(c * kb + b));
            // Q4_0: an eighth of −8·Σa in each lane, as `dot_nibbles` takes it.
            let ay = _mm256_set1_epi32(y.sum as i32);
            for r in 0..R {
                let mut isum = dot4!(VNNI, qx[r], qy);
                if B::Q4_0 {
                    isum = _mm256_sub_epi32(isum, ay);
                }
                let sums = _mm256_cvtepi32_ps(isum);
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), sums, acc[r][c]);
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        let mut o = [0f32; 4];
        _mm_storeu_ps(o.as_mut_ptr(), off[r]);
        for c in 0..C {
            out[r][c] = hsum(acc[r][c]) + o[c];
        }
    }
    out
}

/// One tile for Q8_0 × Q8_0, as [`tile_nibbles`] (no offsets: `s` and `stride` unused).
///
/// # Safety
/// As [`tile_nibbles`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q8_0<const R: usize, const C: usize, const VNNI: bool>(
    w: *const BlockQ8_0,
    kb: usize,
    a: *const BlockQ8_0,
    ad: *const f32,
    _s: *const f32,
    _stride: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for b in 0..kb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut ax = [_mm256_setzero_si256(); R];
        let mut dx = [_mm256_setzero_ps(); R];
        for r in 0..R {
            let x = &*w.add(r * kb + b);
            super::prefetch_rows_ahead(x, kb);
            qx[r] = _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i);
            ax[r] = _mm256_sign_epi8(qx[r], qx[r]);
            dx[r] = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(x.d as i32)));
        }
        for c in 0..C {
            let qy = _mm256_loadu_si256((*a.add(c * kb + b)).qs.as_ptr() as *const __m256i);
            let dy = _mm256_broadcast_ss(&*ad.add(c * kb + b));
            for r in 0..R {
                let sums = _mm256_cvtepi32_ps(dot4!(VNNI, ax[r], _mm256_sign_epi8(qy, qx[r])));
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), sums, acc[r][c]);
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum(acc[r][c]);
        }
    }
    out
}

/// One block's integer sums for a panel of eight rows' nibbles (`qs`, as [`PanelQ4_1`]'s)
/// × `C` activation rows (row c's block at `a + c·kb`): lane k of result c is weight row k's
/// exact Σ q_w·q_a. The four-byte groups of the eight rows are dotted with the activation's
/// group broadcast to every lane (VNNI: `vpdpbusd` accumulates in i32; else `maddubs` pairs
/// accumulate in i16, at most 8·2·15·127 = 30,480, then one `madd`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_sums<const C: usize, const VNNI: bool>(
    qs: &[[[u8; 4]; 8]; 4],
    a: *const BlockQ8_1,
    kb: usize,
) -> [__m256i; C] {
    let low = _mm256_set1_epi8(0x0F);
    let mut isum = [_mm256_setzero_si256(); C];
    for c4 in 0..4 {
        let chunk = _mm256_loadu_si256(qs[c4].as_ptr() as *const __m256i);
        let halves = [
            _mm256_and_si256(chunk, low),
            _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low),
        ];
        for (h, wq) in halves.into_iter().enumerate() {
            let g = c4 + 4 * h;
            for c in 0..C {
                let ap = (*a.add(c * kb)).qs.as_ptr().add(4 * g) as *const i32;
                let av = _mm256_set1_epi32(ap.read_unaligned());
                isum[c] = if VNNI {
                    vpdpbusd!(isum[c], wq, av)
                } else {
                    _mm256_add_epi16(isum[c], _mm256_maddubs_epi16(wq, av))
                };
            }
        }
    }
    if !VNNI {
        for v in isum.iter_mut() {
            *v = _mm256_madd_epi16(*v, _mm256_set1_epi16(1));
        }
    }
    isum
}

/// One panel (eight weight rows of Q4_1 or Q4_0, `kb` blocks from `w`) × `C` activation rows
/// (row c's blocks at `a + c·kb`, their `d` and `s` at `ad`/`s + c·kb`): lane k of result c is
/// weight row k · activation row c. Per block, the exact integer sums ([`nibble_sums`]), then
/// Q4_1: `acc += (d_w·d_a) · sum` and `acc += m_w · s_a`; Q4_0: `acc += (d_w·d_a) · (sum −
/// 8·Σa)`, ggml's arithmetic. Each output's arithmetic is the same whatever `C` is.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_tile<P: Nibbles<8>, const C: usize, const VNNI: bool>(
    w: *const P,
    kb: usize,
    a: *const BlockQ8_1,
    ad: *const f32,
    s: *const f32,
) -> [__m256; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..kb {
        let p = &*w.add(b);
        super::prefetch_panel_ahead(p);
        let isum = nibble_sums::<C, VNNI>(p.qs(), a.add(b), kb);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d().as_ptr() as *const __m128i));
        let mw = p
            .m()
            .map(|m| _mm256_cvtph_ps(_mm_loadu_si128(m.as_ptr() as *const __m128i)));
        for c in 0..C {
            let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.add(c * kb + b)));
            match mw {
                Some(mw) => {
                    acc[c] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[c]), acc[c]);
                    acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*s.add(c * kb + b)), acc[c]);
                }
                None => {
                    let a8 = _mm256_set1_epi32(8 * (*a.add(c * kb + b)).sum as i32);
                    let sums = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[c], a8));
                    acc[c] = _mm256_fmadd_ps(dd, sums, acc[c]);
                }
            }
        }
    }
    acc
}

/// One panel of Q8_0 (eight weight rows) × `C` activation rows (as [`nibble_tile`]; the
/// activations' bytes offset by 128, see `Panel::prepare`; AVX-VNNI only, since `maddubs`
/// pairs of 255·127 would saturate i16): lane k sums `(a + 128)·w` over the block with
/// `vpdpbusd`, takes `128·Σw` back out (exact integers), then `acc += (d_w·d_a) · sum`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_tile_q8_0<const C: usize>(
    w: *const PanelQ8_0<8>,
    kb: usize,
    a: *const BlockQ8_0,
    ad: *const f32,
    _s: *const f32,
) -> [__m256; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..kb {
        let p = &*w.add(b);
        super::prefetch_panel_ahead(p);
        let mut isum = [_mm256_setzero_si256(); C];
        for g in 0..8 {
            let wq = _mm256_loadu_si256(p.qs[g].as_ptr() as *const __m256i);
            for c in 0..C {
                let ap = (*a.add(c * kb + b)).qs.as_ptr().add(4 * g) as *const i32;
                let av = _mm256_set1_epi32(ap.read_unaligned());
                isum[c] = vpdpbusd!(isum[c], av, wq);
            }
        }
        let offset = _mm256_slli_epi32(
            _mm256_cvtepi16_epi32(_mm_loadu_si128(p.sum.as_ptr() as *const __m128i)),
            7,
        );
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.d.as_ptr() as *const __m128i));
        for c in 0..C {
            let sums = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[c], offset));
            let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.add(c * kb + b)));
            acc[c] = _mm256_fmadd_ps(dd, sums, acc[c]);
        }
    }
    acc
}

panels!(
    panels_q4_1,
    [VNNI],
    "avx2,fma,f16c",
    nibble_tile[PanelQ4_1<8>],
    PanelQ4_1<8>,
    BlockQ8_1,
    _mm256_storeu_ps
);
panels!(
    panels_q4_0,
    [VNNI],
    "avx2,fma,f16c",
    nibble_tile[PanelQ4_0<8>],
    PanelQ4_0<8>,
    BlockQ8_1,
    _mm256_storeu_ps
);
panels!(
    panels_q8_0,
    [],
    "avx2,fma,f16c",
    panel_tile_q8_0[],
    PanelQ8_0<8>,
    BlockQ8_0,
    _mm256_storeu_ps
);

/// The tiles of [`Format::rows`] for one format (`row_tiles!`): weight rows `R` at a time
/// (its tile's height), activation rows [`TILE_A`] at a time, the last tiles of each smaller.
/// `$tile[$g…]` is the generic tile function and the types it is given before `R`, `C` and
/// `VNNI`.
macro_rules! rows {
    ($name:ident, $tile:ident [$($g:ty),*], $w:ty, $a:ty, $r:literal) => {
        /// # Safety
        /// AVX2, FMA and F16C; the bounds [`Format::rows`] asserts.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name<const VNNI: bool>(
            _isa: Isa,
            w: &[$w],
            acts: &Acts<$a>,
            is: std::ops::Range<usize>,
            out: &mut [f32],
            sj: usize,
            si: usize,
        ) {
            let kb = acts.kb;
            row_tiles!(
                0..w.len() / kb,
                is,
                $r,
                [(2, 4) (2, 3) (2, 2) (2, 1) (1, 4) (1, 3) (1, 2) (1, 1)],
                (out.as_mut_ptr(), sj, si),
                |R, C, j, i| $tile::<$($g,)* R, C, VNNI>(
                    w.as_ptr().add(j * kb),
                    kb,
                    acts.q.as_ptr().add(i * kb),
                    acts.d.as_ptr().add(i * kb),
                    acts.s.as_ptr().add(i),
                    acts.stride,
                )
            );
        }
    };
}
// Two Q4_1 rows per tile; one Q8_0 row (two spill registers and measured slower).
rows!(rows_q4_1, tile_nibbles[BlockQ4_1], BlockQ4_1, BlockQ8_1, 2);
rows!(rows_q4_0, tile_nibbles[BlockQ4_0], BlockQ4_0, BlockQ8_1, 2);
rows!(rows_q8_0, tile_q8_0[], BlockQ8_0, BlockQ8_0, 1);

// The K-quants' tiles, in a file of their own (after the macros above, which they use).
mod kquants;
pub use kquants::*;

// Products of Q4_0 as the file holds it, four weight rows a tile.
mod q4_0_dots;
pub(crate) use q4_0_dots::{dots_q4_0_q8_1, rows_q4_0_file};
