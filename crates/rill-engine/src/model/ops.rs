//! The element-wise parts of the forward pass on the host (issue 6): RMS norm, SwiGLU, the
//! residual add. Plain loops over row-major `f32` buffers, so a CPU step never goes through
//! candle's tensors (whose worker thread spins after each operation, taking a core from the
//! matmuls on a small machine).

use rayon::prelude::*;

use half::f16;

use super::family::Activation;
use crate::kernels::Isa;

/// Rows below which an operation stays on the calling thread (a decode step's few rows).
const SERIAL_ROWS: usize = 32;

/// `out = x / √(mean(x²) + eps) · w` for each row of `x` (rows of `w.len()`), in candle's
/// order of operations (so its numbers are candle's `rms_norm`'s).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    each_row(x, n, out, |x, out| {
        let sum2 = x.iter().map(|v| v * v).sum::<f32>();
        let m = (sum2 / n as f32 + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(x).zip(w) {
            *o = *v / m * *w;
        }
    });
}

/// `f(row, out_row)` for each row of `n` values, on the pool past a few rows.
fn each_row(x: &[f32], n: usize, out: &mut [f32], f: impl Fn(&[f32], &mut [f32]) + Sync) {
    rows_into(x, n, out, n, f)
}

/// `f(row, out_row)` for rows of `n_in` values in `x` and of `n_out` in `out`, on the calling
/// thread for a few rows (a decode step's) and on the pool past them.
fn rows_into(
    x: &[f32],
    n_in: usize,
    out: &mut [f32],
    n_out: usize,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) {
    let row = |(x, out): (&[f32], &mut [f32])| f(x, out);
    if x.len() / n_in <= SERIAL_ROWS {
        x.chunks_exact(n_in)
            .zip(out.chunks_exact_mut(n_out))
            .for_each(row);
    } else {
        x.par_chunks_exact(n_in)
            .zip(out.par_chunks_exact_mut(n_out))
            .for_each(row);
    }
}

/// [`rms_norm`] in llama.cpp's arithmetic (ggml's CPU `rms_norm` fused with the weights'
/// multiply): the squares summed in f64, `scale = 1/√(mean + eps)` in f32, then
/// `x · scale · w`. The last bit can differ from candle's order (`x / √… · w`), and when a value
/// then sits on a rounding edge of the next matmul's 8-bit activations, the two engines' logits
/// part by hundredths.
pub fn rms_norm_like_ggml(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    each_row(x, n, out, |x, out| {
        let sum: f64 = x.iter().map(|v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(x).zip(w) {
            *o = *v * scale * *w;
        }
    });
}

/// The gated feed-forward's activation: each row of `gate_up` is `[gate | up]` (`2·width`
/// values); row `r` of `out` (resized to fit) is `act(gate) · up`.
pub fn gated(gate_up: &[f32], width: usize, act: Activation, isa: Isa, out: &mut Vec<f32>) {
    match act {
        Activation::Silu => swiglu(gate_up, width, isa, out),
        Activation::GeluTanh => geglu(gate_up, width, isa, out),
        Activation::SwigluOai => swiglu_oai(gate_up, width, isa, out),
    }
}

/// gpt-oss's clamped SwiGLU, as ggml's `swiglu_oai` computes it (α = 1.702 and the limit 7
/// are llama.cpp's constants for the family): `x = min(gate, 7)`, `y = clamp(up, ±7)`,
/// `x / (1 + e^(−α·x)) · (y + 1)`.
pub fn swiglu_oai(gate_up: &[f32], width: usize, isa: Isa, out: &mut Vec<f32>) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    rows(gate_up, width, isa, out, |gate, up, out, _| {
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            let x = g.min(LIMIT);
            let y = u.clamp(-LIMIT, LIMIT);
            *o = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
        }
    })
}

/// `gelu(g)` with the tanh approximation, `½g(1 + tanh(u))` with `u = √(2/π)(g + 0.044715g³)`,
/// written as `g · sigmoid(2u)` (the same thing) so it shares SwiGLU's sigmoid.
fn gelu_tanh(g: f32) -> f32 {
    let z = 2.0 * GELU_C * (g + 0.044_715 * g * g * g);
    g / (1.0 + (-z).exp())
}

/// GELU as llama.cpp's CPU backend computes it: through half precision (`g` rounded to f16, the
/// result rounded to f16: its 64K-entry table), 0 at or below −10 and `g` itself at or above 10.
/// The rounding is a relative 2⁻¹¹ per value; with the exact function instead, a six-layer test
/// model's logits drift from llama.cpp's by 0.04 on average from the first position on, enough
/// to flip its closer choices.
fn gelu_like_llama_cpp(g: f32) -> f32 {
    if g <= -10.0 {
        0.0
    } else if g >= 10.0 {
        g
    } else {
        f16::from_f32(gelu_tanh(f16::from_f32(g).to_f32())).to_f32()
    }
}

/// `√(2/π)`.
const GELU_C: f32 = 0.797_884_6;

/// GeGLU: row `r` of the result is `gelu(gate) · up` (Gemma), GELU as llama.cpp computes it
/// ([`gelu_like_llama_cpp`]).
pub fn geglu(gate_up: &[f32], width: usize, isa: Isa, out: &mut Vec<f32>) {
    rows(gate_up, width, isa, out, |gate, up, out, isa| {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C; the
            // three slices have `width` values each.
            unsafe { avx2::geglu(gate, up, out) };
            return;
        }
        let _ = isa;
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = gelu_like_llama_cpp(*g) * *u;
        }
    })
}

/// `f(gate, up, out)` on each row of `gate_up` (`[gate | up]`) into `out` (resized to fit),
/// on the pool past a few rows.
fn rows(
    gate_up: &[f32],
    width: usize,
    isa: Isa,
    out: &mut Vec<f32>,
    f: impl Fn(&[f32], &[f32], &mut [f32], Isa) + Sync,
) {
    let isa = isa.checked();
    out.resize(gate_up.len() / 2, 0.0);
    rows_into(gate_up, 2 * width, out, width, |gu, out| {
        let (gate, up) = gu.split_at(width);
        f(gate, up, out, isa)
    });
}

/// SwiGLU: each row of `gate_up` is `[gate | up]` (`2·width` values); row `r` of the result is
/// `silu(gate) · up`, `silu(g) = g / (1 + e^(−g))`.
pub fn swiglu(gate_up: &[f32], width: usize, isa: Isa, out: &mut Vec<f32>) {
    rows(gate_up, width, isa, out, |gate, up, out, isa| {
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
    })
}

/// `x += y`.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}

/// `x[i] *= y[i]`.
pub fn mul(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a *= *b;
    }
}

/// GELU in place, as [`geglu`] computes it (an image encoder's feed-forward, `vision/`).
pub fn gelu(x: &mut [f32]) {
    x.par_chunks_mut(4096)
        .for_each(|c| c.iter_mut().for_each(|v| *v = gelu_like_llama_cpp(*v)));
}

/// GELU's quick form `x·sigmoid(1.702x)` in place, as llama.cpp's CPU backend computes it:
/// through half precision (its table), as [`gelu_like_llama_cpp`].
pub fn gelu_quick(x: &mut [f32]) {
    let quick = |g: f32| {
        let g = f16::from_f32(g).to_f32();
        f16::from_f32(g / (1.0 + (-1.702 * g).exp())).to_f32()
    };
    x.par_chunks_mut(4096)
        .for_each(|c| c.iter_mut().for_each(|v| *v = quick(*v)));
}

/// SiLU `x·sigmoid(x)` in place, in f32.
pub fn silu(x: &mut [f32]) {
    x.par_chunks_mut(4096)
        .for_each(|c| c.iter_mut().for_each(|v| *v /= 1.0 + (-*v).exp()));
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

    /// `sigmoid(z)` eight at a time, with `e = e^(−|z|)` (never overflows): `1 / (1 + e)` for
    /// z ≥ 0, `e / (1 + e)` below.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sigmoid(z: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let e = exp(_mm256_or_ps(z, _mm256_set1_ps(-0.0)));
        let neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
        _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e))
    }

    /// `f32 → f16 → f32`, rounding to nearest even.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn through_f16(x: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT))
    }

    /// `out = gelu(gate) · up` eight at a time, GELU through f16 as in `gelu_like_llama_cpp`,
    /// computed as `g · sigmoid(2u)` (see `gelu_tanh`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let c2 = _mm256_set1_ps(2.0 * super::GELU_C);
        let c3 = _mm256_set1_ps(0.044_715);
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let g = through_f16(x);
            // 2u = 2√(2/π) · (g + 0.044715 g³) = 2√(2/π) · g · (1 + 0.044715 g²).
            let inner = _mm256_fmadd_ps(_mm256_mul_ps(c3, g), g, _mm256_set1_ps(1.0));
            let z = _mm256_mul_ps(_mm256_mul_ps(c2, g), inner);
            let y = through_f16(_mm256_mul_ps(g, sigmoid(z)));
            let y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
            let y = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LE_OQ), y);
            let y = _mm256_mul_ps(y, _mm256_loadu_ps(up.as_ptr().add(i)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            i += 8;
        }
        for j in i..n {
            out[j] = super::gelu_like_llama_cpp(gate[j]) * up[j];
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
    fn the_ggml_rms_norm_is_ggmls_arithmetic() {
        let mut rng = Lcg(13);
        for rows in [1, 40] {
            let (x, w) = (rng.vec(rows * 72), rng.vec(72));
            let mut ours = vec![0f32; x.len()];
            rms_norm_like_ggml(&x, &w, 1e-6, &mut ours);
            for (r, row) in x.chunks_exact(72).enumerate() {
                // ggml's loop, written out: f32 squares summed in f64, one f32 scale.
                let mut sum = 0f64;
                for v in row {
                    sum += (v * v) as f64;
                }
                let scale = 1.0 / ((sum / 72.0) as f32 + 1e-6).sqrt();
                for (j, v) in row.iter().enumerate() {
                    assert_eq!(ours[r * 72 + j], v * scale * w[j], "{rows} rows, row {r}");
                }
            }
        }
    }

    #[test]
    fn geglu_is_gelu_through_f16_times_up_on_every_path() {
        let mut rng = Lcg(11);
        let width = 43;
        // Gates out to ±20: past both of the cut-offs at ±10.
        let gu: Vec<f32> = rng.vec(40 * 2 * width).iter().map(|v| v * 20.0).collect();
        for isa in Isa::available() {
            let mut out = Vec::new();
            geglu(&gu, width, isa, &mut out);
            for (r, row) in out.chunks_exact(width).enumerate() {
                for (j, y) in row.iter().enumerate() {
                    let (x, u) = (gu[r * 2 * width + j], gu[r * 2 * width + width + j] as f64);
                    // The textbook form in f64, on the gate rounded to f16 as llama.cpp does;
                    // the result is an f16, so within half an f16 step (2⁻¹¹ relative) of it.
                    let g = f16::from_f32(x).to_f64();
                    let c = (2.0 / std::f64::consts::PI).sqrt();
                    let gelu = match x {
                        x if x <= -10.0 => 0.0,
                        x if x >= 10.0 => x as f64,
                        _ => 0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()),
                    };
                    let want = gelu * u;
                    let tol = 1.01 * 2f64.powi(-11) * want.abs() + 1e-6 * u.abs();
                    assert!(
                        (*y as f64 - want).abs() <= tol,
                        "{isa:?} g {x} u {u}: {y} vs {want}"
                    );
                }
            }
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
            let mut out = Vec::new();
            swiglu(&gu, width, isa, &mut out);
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
