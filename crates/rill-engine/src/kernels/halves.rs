//! F16 and BF16 matrices as the file holds them (two bytes a weight, no repacking), against
//! f32 activations, which are not quantised: the weights are exact, so the product is a plain
//! float dot product.
//!
//! Each (weight row, activation row) pair is summed in eight lanes: lane `l` takes the weights
//! `8c + l`, one fused multiply-add each, in order of `c`, and the eight lanes are added as one
//! tree, `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`. [`dot_half_ref`] is that sum in
//! scalar code (`mul_add` is the same fused, once-rounded operation as `vfmadd`), and the AVX2
//! tiles compute it for several pairs at once (4 weight rows × 1 activation row, or 2 × 4), so
//! every path gives the reference's bits and a row's output never depends on the rows beside
//! it. A tile converts each 8 weights once (`vcvtph2ps`, or a 16-bit shift for BF16) for all of
//! its activation rows.
//!
//! Before this, candle dequantised such a matrix to f32 when the model loaded: twice the file
//! in memory, and twice the bytes a decode step reads.

use super::*;
use half::bf16;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Lanes of one pair's sum.
const LANES: usize = 8;

/// A 16-bit float weight, as the file stores it.
pub(crate) trait Half: Copy + Default + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Eight weights at `p` as f32.
    ///
    /// # Safety
    /// AVX2 and F16C; `p` valid for eight values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Half for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

impl Half for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        // A BF16 is the upper half of an f32: widen and shift (exact).
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
    }
}

/// The eight lanes' tree, in the order the vector reduction takes.
fn reduce(a: [f32; LANES]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// The scalar reference: `Σ w·x` over a row (a multiple of 8 long), in the lanes and order of
/// the module's notes.
pub(crate) fn dot_half_ref<H: Half>(w: &[H], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = [0f32; LANES];
    for (w, x) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = w[l].to_f32().mul_add(x[l], acc[l]);
        }
    }
    reduce(acc)
}

/// The vector's eight lanes added as [`reduce`] adds them.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
}

/// `R` weight rows at `w` × `C` activation rows at `x` (both `k` apart), each pair by the
/// reference's lanes and order.
///
/// # Safety
/// AVX2, FMA and F16C; `R` rows of `k` weights at `w` and `C` rows of `k` values at `x`, `k` a
/// multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<H: Half, const R: usize, const C: usize>(
    w: *const H,
    x: *const f32,
    k: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut xv = [_mm256_setzero_ps(); C];
    for c in (0..k).step_by(LANES) {
        for (i, xv) in xv.iter_mut().enumerate() {
            *xv = _mm256_loadu_ps(x.add(i * k + c));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let wv = H::load8(w.add(r * k + c));
            for (a, xv) in acc.iter_mut().zip(&xv) {
                *a = _mm256_fmadd_ps(wv, *xv, *a);
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (o, a) in o.iter_mut().zip(a) {
            *o = hsum(*a);
        }
    }
    out
}

/// Weight rows `js` × activation rows `is` into `o[(i − is.start)·n_out + j]`.
///
/// # Safety
/// `js` within `w`'s rows and `is` within `x`'s; `o` valid for those outputs and written by no
/// one else meanwhile.
unsafe fn block<H: Half>(
    isa: Isa,
    (w, x, k): (&[H], &[f32], usize),
    js: std::ops::Range<usize>,
    is: std::ops::Range<usize>,
    o: *mut f32,
    n_out: usize,
) {
    assert!(js.end * k <= w.len() && is.end * k <= x.len() && k.is_multiple_of(LANES));
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // One activation row (a decode step): four weight rows a tile, four sums in flight;
        // more: two weight rows × four activation rows (a 4 × 3 tile, which reads fewer
        // activation bytes per product, measured 30% slower in prefill).
        let rows = if is.len() == 1 { 4 } else { 2 };
        // SAFETY: AVX2, FMA and F16C (`avx2()`); every tile's rows are within the bounds
        // asserted above.
        row_tiles!(
            js,
            is,
            rows,
            [(4, 1)(2, 4)(2, 3)(2, 2)(2, 1)(1, 4)(1, 3)(1, 2)(1, 1)],
            (o, 1, n_out),
            |R, C, j, i| tile::<H, R, C>(w.as_ptr().add(j * k), x.as_ptr().add(i * k), k)
        );
        return;
    }
    let _ = isa;
    for j in js {
        for i in is.clone() {
            let v = dot_half_ref(&w[j * k..(j + 1) * k], &x[i * k..(i + 1) * k]);
            *o.add((i - is.start) * n_out + j) = v;
        }
    }
}

/// Every weight row of `w` (`k` wide) dotted with every row of `x` (`m × k`) into `out`
/// (`m × n_out`). A few activation rows split the weight rows across the pool; many split the
/// activation rows, as many per task as keep them in L2 (256 KB) beside the two weight rows
/// each tile reads.
pub(crate) fn half_times<H: Half>(
    isa: Isa,
    w: &[H],
    x: &[f32],
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    let n_out = w.len() / k;
    assert!(x.len() == m * k && out.len() == m * n_out);
    let per_task = ((1 << 16) / k).clamp(TILE_A, ACT_ROWS_PER_TASK);
    if m >= 2 * per_task {
        out.par_chunks_mut(per_task * n_out)
            .enumerate()
            .for_each(|(task, chunk)| {
                let (first, rows) = (task * per_task, chunk.len() / n_out);
                // SAFETY: the task's own output rows, `chunk`, within `x`'s rows.
                unsafe {
                    block(
                        isa,
                        (w, x, k),
                        0..n_out,
                        first..first + rows,
                        chunk.as_mut_ptr(),
                        n_out,
                    )
                };
            });
        return;
    }
    let o = SharedOut(out.as_mut_ptr());
    let o = &o;
    (0..n_out.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|task| {
            let js = task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(n_out);
            // SAFETY: each task writes its own columns `js` of every row, so no two tasks
            // write the same element of `out`, which holds `m × n_out`.
            unsafe { block(isa, (w, x, k), js, 0..m, o.0, n_out) };
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::Lcg;

    /// Every path gives the reference's bits, for any rows beside a row, and the reference is
    /// the f64 product within float rounding.
    fn check<H: Half>(dtype: GgmlDType, from: fn(f32) -> H, bits: fn(H) -> u16) {
        let mut r = Lcg(7);
        for (n_out, k) in [(13, 64), (136, 576), (64, 4096)] {
            let w: Vec<H> = r.vec(n_out * k).into_iter().map(from).collect();
            let bytes: Vec<u8> = w.iter().flat_map(|&h| bits(h).to_le_bytes()).collect();
            for m in [1, 2, 3, 5, 70] {
                let x = r.vec(m * k);
                let pair = |n: usize| (&w[n % n_out * k..][..k], &x[n / n_out * k..][..k]);
                let want: Vec<f32> = (0..m * n_out)
                    .map(|n| dot_half_ref(pair(n).0, pair(n).1))
                    .collect();
                for (n, v) in want.iter().enumerate() {
                    let (w, x) = pair(n);
                    let terms = w.iter().zip(x).map(|(w, x)| w.to_f32() as f64 * *x as f64);
                    let (exact, size) = terms.fold((0f64, 0f64), |(s, a), t| (s + t, a + t.abs()));
                    // k / 8 additions in each lane and three in the tree.
                    let bound = (k / LANES + 3) as f64 * f32::EPSILON as f64 * size;
                    assert!((*v as f64 - exact).abs() <= bound, "{v} vs {exact}");
                }
                for isa in Isa::available() {
                    let lin = QLinear::from_raw(dtype.into(), &[n_out, k], &bytes, isa).unwrap();
                    let got = lin.product(&x, m);
                    assert!(got == want, "{dtype:?} {isa:?} {n_out}×{k}, m={m}");
                    for i in [0, m - 1] {
                        let alone = lin.product(&x[i * k..(i + 1) * k], 1);
                        assert!(alone[..] == want[i * n_out..(i + 1) * n_out]);
                    }
                    let mut row = vec![0f32; k];
                    lin.dequantize_row(n_out - 1, &mut row);
                    assert!(row
                        .iter()
                        .zip(pair(n_out - 1).0)
                        .all(|(a, b)| *a == b.to_f32()));
                }
            }
        }
    }

    #[test]
    fn f16_rows_give_the_references_bits_on_every_path() {
        check(GgmlDType::F16, f16::from_f32, f16::to_bits);
    }

    #[test]
    fn bf16_rows_give_the_references_bits_on_every_path() {
        check(GgmlDType::BF16, bf16::from_f32, bf16::to_bits);
    }

    #[test]
    fn the_vector_loads_convert_exactly() {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            let bits: Vec<u16> = (0..=u16::MAX).collect();
            for chunk in bits.chunks_exact(8) {
                let (h, b): (Vec<f16>, Vec<bf16>) = chunk
                    .iter()
                    .map(|&u| (f16::from_bits(u), bf16::from_bits(u)))
                    .unzip();
                let mut got = [0f32; 8];
                // SAFETY: AVX2 and F16C checked above; eight values each.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), f16::load8(h.as_ptr())) };
                for (g, h) in got.iter().zip(&h) {
                    assert!(g.to_bits() == h.to_f32().to_bits() || g.is_nan() && h.is_nan());
                }
                // SAFETY: as above.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), bf16::load8(b.as_ptr())) };
                for (g, b) in got.iter().zip(&b) {
                    assert!(g.to_bits() == b.to_f32().to_bits() || g.is_nan() && b.is_nan());
                }
            }
        }
    }
}
