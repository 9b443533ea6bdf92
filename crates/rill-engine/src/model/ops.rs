//! The element-wise parts of the forward pass on the host (issue 6): RMS norm, SwiGLU, the
//! residual add. Plain loops over row-major `f32` buffers, so a CPU step never goes through
//! candle's tensors (whose worker thread spins after each operation, taking a core from the
//! matmuls on a small machine).

use rayon::prelude::*;

use crate::kernels::Isa;

/// Rows below which an operation stays on the calling thread (a decode step's few rows).
const SERIAL_ROWS: usize = 32;

/// `out = x / √(mean(x²) + eps) · w` for each row of `x` (rows of `w.len()`), in candle's
/// order of operations (so its numbers are candle's `rms_norm`'s).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    let row = |(x, out): (&[f32], &mut [f32])| {
        let sum2 = x.iter().map(|v| v * v).sum::<f32>();
        let m = (sum2 / n as f32 + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(x).zip(w) {
            *o = *v / m * *w;
        }
    };
    if x.len() / n <= SERIAL_ROWS {
        x.chunks_exact(n).zip(out.chunks_exact_mut(n)).for_each(row);
    } else {
        x.par_chunks_exact(n)
            .zip(out.par_chunks_exact_mut(n))
            .for_each(row);
    }
}

/// SwiGLU: each row of `gate_up` is `[gate | up]` (`2·width` values); row `r` of the result is
/// `silu(gate) · up`, `silu(g) = g / (1 + e^(−g))`.
pub fn swiglu(gate_up: &[f32], width: usize, isa: Isa) -> Vec<f32> {
    let isa = isa.checked();
    let rows = gate_up.len() / (2 * width);
    let mut out = vec![0f32; rows * width];
    let row = |(gu, out): (&[f32], &mut [f32])| {
        let (gate, up) = gu.split_at(width);
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C; the
            // three slices have `width` values each.
            unsafe { avx2::swiglu(gate, up, out) };
            return;
        }
        let _ = isa;
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = *g / (1.0 + (-*g).exp()) * *u;
        }
    };
    if rows <= SERIAL_ROWS {
        gate_up
            .chunks_exact(2 * width)
            .zip(out.chunks_exact_mut(width))
            .for_each(row);
    } else {
        gate_up
            .par_chunks_exact(2 * width)
            .zip(out.par_chunks_exact_mut(width))
            .for_each(row);
    }
    out
}

/// `x += y`.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// `e^x` for x ≤ 0 (larger x are not needed here), within ε·e^x (tested): `x = n·ln2 + r`, a
    /// degree-6 polynomial for `e^r` on |r| ≤ ln2/2 (Cephes' `expf` coefficients), scaled by 2ⁿ.
    /// Below −87 (where `e^x` leaves the normal floats) the result is 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp(x: __m256) -> __m256 {
        let lo = _mm256_set1_ps(-87.0);
        let tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
        let x = _mm256_max_ps(x, lo);
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let e = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        ));
        _mm256_andnot_ps(tiny, _mm256_mul_ps(e, two_n))
    }

    /// `out = silu(gate) · up`, eight at a time: with `e = e^(−|g|)` (never overflows),
    /// sigmoid(g) is `1 / (1 + e)` for g ≥ 0 and `e / (1 + e)` below.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let sign = _mm256_set1_ps(-0.0);
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let e = exp(_mm256_or_ps(g, sign));
            let neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
            let sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
            let y = _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up.as_ptr().add(i)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            i += 8;
        }
        for j in i..n {
            out[j] = gate[j] / (1.0 + (-gate[j]).exp()) * up[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::Lcg;

    #[test]
    fn rms_norm_is_candles() {
        let mut rng = Lcg(5);
        for rows in [1, 40] {
            let (x, w) = (rng.vec(rows * 72), rng.vec(72));
            let mut ours = vec![0f32; x.len()];
            rms_norm(&x, &w, 1e-5, &mut ours);
            let dev = candle_core::Device::Cpu;
            let xt = candle_core::Tensor::from_slice(&x, (rows, 72), &dev).unwrap();
            let wt = candle_core::Tensor::from_slice(&w, 72, &dev).unwrap();
            let theirs = candle_nn::ops::rms_norm(&xt, &wt, 1e-5)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(ours, theirs, "{rows} rows");
        }
    }

    #[test]
    fn swiglu_is_silu_times_up_on_every_path() {
        let mut rng = Lcg(9);
        // 43 columns: five vectors and a ragged tail; gates out to ±100 (e^100 would overflow a
        // naive sigmoid); 40 rows go to the pool.
        let width = 43;
        let gu: Vec<f32> = rng.vec(40 * 2 * width).iter().map(|v| v * 100.0).collect();
        for isa in Isa::available() {
            let out = swiglu(&gu, width, isa);
            for (r, row) in out.chunks_exact(width).enumerate() {
                for (j, y) in row.iter().enumerate() {
                    let (g, u) = (
                        gu[r * 2 * width + j] as f64,
                        gu[r * 2 * width + width + j] as f64,
                    );
                    let want = g / (1.0 + (-g).exp()) * u;
                    let tol = 4.0 * f32::EPSILON as f64 * want.abs() + 1e-30;
                    assert!(
                        (*y as f64 - want).abs() <= tol,
                        "{isa:?} g {g} u {u}: {y} vs {want}"
                    );
                }
            }
        }
    }
}
