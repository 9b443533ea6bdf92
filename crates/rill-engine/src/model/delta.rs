//! A Gated DeltaNet layer (Qwen3.5's linear attention) on the host: what follows its input
//! projections and comes before its output projection, both of which are ordinary matrices on
//! our kernels (`decoder.rs` runs them as a layer's `qkv` group and `wo`).
//!
//! Per token, as llama.cpp's graph (`src/models/qwen35.cpp`, `delta-net-base.cpp`) and its CPU
//! kernel (`ggml_compute_forward_gated_delta_net`) compute it:
//! 1. a causal depthwise convolution of `conv_kernel` taps over the queries, keys and values
//!    (the last `conv_kernel − 1` inputs are the state's first part), then SiLU;
//! 2. queries and keys L2-normalised per head (`x / √(Σx² + ε)`);
//! 3. per value head `h` (reading key head `h mod k_heads`, as ggml tiles them): the decay
//!    `g = softplus(α + dt) · A`, the write strength `β = σ(β_in)`, and with the head's
//!    `S` (`head × head`, keys by values): `S ← e^g · S`, `δ = β · (v − Sᵀk)`, `S ← S + k ⊗ δ`,
//!    `o = Sᵀq / √head`;
//! 4. each head's output RMS-normalised and multiplied by `silu(z)`, the gate.
//!
//! The recurrence runs token by token in f32, prefill as decode: on a CPU it is a few percent
//! of a step's work (a state of `v_heads · head²` floats read once per token, against every
//! weight of the layer), and llama.cpp's CPU backend runs its fused kernel the same way; the
//! chunked form of the delta rule pays where a GPU needs matrix products. Heads are shared
//! among the pool's threads when the state is large enough to pay for it.

use rayon::prelude::*;

use super::config::DeltaConfig;
use super::kv::KvCache;
use super::parts::Norm;
use crate::error::{Error, Result};
use crate::kernels::Isa;

/// Value heads' states below this many floats are run on the calling thread.
const SERIAL_FLOATS: usize = 1 << 16;

/// A Gated DeltaNet layer's own weights (its projections are the decoder's).
pub(super) struct DeltaNet {
    pub(super) cfg: DeltaConfig,
    /// The convolution's taps, `[channel][tap]`, the oldest input's first.
    pub(super) conv: Vec<f32>,
    /// The decay's bias and `A`, one per value head.
    pub(super) dt: Vec<f32>,
    pub(super) a: Vec<f32>,
    /// The norm of each head's output (before the gate).
    pub(super) norm: Norm,
    /// The L2 norm's `ε` (the model's RMS norm epsilon, as llama.cpp passes it).
    pub(super) eps: f32,
}

/// `x / (1 + e^(−x))`.
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's softplus: `ln(1 + eˣ)`, `x` itself past 20.
fn softplus(x: f32) -> f32 {
    match x > 20.0 {
        true => x,
        false => (1.0 + x.exp()).ln(),
    }
}

/// Each `n`-wide head of `x` divided by `√(Σx² + ε)`, in ggml's steps (an RMS norm with
/// `ε/n`, then a scale by `1/√n`).
fn l2_norm(x: &mut [f32], n: usize, eps: f32) {
    let inv = 1.0 / (n as f32).sqrt();
    for head in x.chunks_exact_mut(n) {
        let sum: f64 = head.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps / n as f32).sqrt();
        head.iter_mut().for_each(|v| *v = *v * scale * inv);
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight sums side by side, which the compiler keeps in vector registers.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// One value head's step: `state` is its `head × head` matrix stored by value (row `j` holds
/// `S[·][j]`), `q`, `k` its key head's, `v` and `o` its own. With AVX2 and FMA where the CPU
/// has them, each row read twice (decayed and dotted with `k`, then updated and dotted with
/// `q`).
#[allow(clippy::too_many_arguments)]
fn head_step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    o: &mut [f32],
    isa: Isa,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && k.len().is_multiple_of(8) {
        // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2 and FMA; `state` holds
        // `k.len()` rows of `k.len()` values, `q` has `k.len()`, `v` and `o` at least as
        // many, and the rows' width is a multiple of 8.
        unsafe { avx2::head_step(state, q, k, v, decay, beta, o) };
        return;
    }
    let _ = isa;
    let n = k.len();
    let scale = 1.0 / (n as f32).sqrt();
    for (j, row) in state.chunks_exact_mut(n).enumerate() {
        row.iter_mut().for_each(|s| *s *= decay);
        let d = (v[j] - dot(row, k)) * beta;
        row.iter_mut().zip(k).for_each(|(s, k)| *s += d * k);
        o[j] = dot(row, q) * scale;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum(v: __m256) -> f32 {
        let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)))
    }

    /// [`head_step`](super::head_step), eight values at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn head_step(
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: f32,
        beta: f32,
        o: &mut [f32],
    ) {
        let n = k.len();
        let scale = 1.0 / (n as f32).sqrt();
        let g = _mm256_set1_ps(decay);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        for (j, row) in state.chunks_exact_mut(n).enumerate() {
            let p = row.as_mut_ptr();
            let mut sk = _mm256_setzero_ps();
            for c in (0..n).step_by(8) {
                let r = _mm256_mul_ps(_mm256_loadu_ps(p.add(c)), g);
                _mm256_storeu_ps(p.add(c), r);
                sk = _mm256_fmadd_ps(r, _mm256_loadu_ps(kp.add(c)), sk);
            }
            let d = _mm256_set1_ps((v[j] - sum(sk)) * beta);
            let mut sq = _mm256_setzero_ps();
            for c in (0..n).step_by(8) {
                let r = _mm256_fmadd_ps(d, _mm256_loadu_ps(kp.add(c)), _mm256_loadu_ps(p.add(c)));
                _mm256_storeu_ps(p.add(c), r);
                sq = _mm256_fmadd_ps(r, _mm256_loadu_ps(qp.add(c)), sq);
            }
            o[j] = sum(sq) * scale;
        }
    }
}

impl DeltaNet {
    /// The floats of one input row: the convolution's channels, the gate, β and α.
    pub(super) fn row_width(&self) -> usize {
        let c = &self.cfg;
        c.conv_width() + c.value_width() + 2 * c.v_heads
    }

    /// Runs the layer for the batch's rows: `proj` holds each row's projections
    /// (`[channels | z | β | α]`, [`row_width`](Self::row_width) floats), each sequence's
    /// rows in order (`spans`), advancing its state in `layer` of its cache; `out` receives
    /// each row's gated output (`value_width` floats).
    pub(super) fn forward_host(
        &self,
        layer: usize,
        proj: &[f32],
        batch: &mut [(&[u32], &mut KvCache)],
        spans: &[(usize, usize)],
        out: &mut [f32],
        isa: Isa,
    ) -> Result<()> {
        let c = self.cfg;
        let (width, values) = (self.row_width(), c.value_width());
        let mut conv = vec![0f32; c.conv_width()];
        for ((_, cache), &(first, count)) in batch.iter_mut().zip(spans) {
            let at = cache.len();
            for r in first..first + count {
                cache.keep_before(layer, at + r - first);
                let state = cache.state_mut(layer).ok_or_else(|| {
                    Error::Candle(candle_core::Error::Msg(
                        "no recurrent state for a layer".into(),
                    ))
                })?;
                let row = &proj[r * width..][..width];
                self.convolve(state, &row[..c.conv_width()], &mut conv);
                self.recur(
                    state,
                    &mut conv,
                    &row[c.conv_width() + values..],
                    &mut out[r * values..][..values],
                    isa,
                );
            }
        }
        // The gated norm, every row at once.
        let mut heads = vec![0f32; values];
        for (r, o) in out.chunks_exact_mut(values).enumerate() {
            let z = &proj[r * width + c.conv_width()..][..values];
            heads.copy_from_slice(o);
            self.norm.apply(&heads, o);
            o.iter_mut().zip(z).for_each(|(o, z)| *o *= silu(*z));
        }
        Ok(())
    }

    /// The convolution of the state's last inputs and `x`, then SiLU, into `out`; `x` joins
    /// the state's inputs and the oldest leaves.
    fn convolve(&self, state: &mut [f32], x: &[f32], out: &mut [f32]) {
        let (taps, n) = (self.cfg.conv_kernel, x.len());
        let held = &mut state[..(taps - 1) * n];
        for (ch, o) in out.iter_mut().enumerate() {
            let w = &self.conv[ch * taps..][..taps];
            let mut sum = 0f32;
            for (t, w) in w[..taps - 1].iter().enumerate() {
                sum += held[t * n + ch] * w;
            }
            *o = silu(sum + x[ch] * w[taps - 1]);
        }
        if taps > 1 {
            held.copy_within(n.., 0);
            held[(taps - 2) * n..].copy_from_slice(x);
        }
    }

    /// The delta rule's step for every value head: `qkv` the convolved queries, keys and
    /// values (the first two normalised here), `ba` the row's β and α inputs, `o` the heads'
    /// outputs.
    fn recur(&self, state: &mut [f32], qkv: &mut [f32], ba: &[f32], o: &mut [f32], isa: Isa) {
        let c = self.cfg;
        let n = c.head;
        let (qk, v) = qkv.split_at_mut(2 * c.key_width());
        l2_norm(qk, n, self.eps);
        let (q, k) = qk.split_at(c.key_width());
        let (beta, alpha) = ba.split_at(c.v_heads);
        let states = &mut state[(c.conv_kernel - 1) * c.conv_width()..];
        let head = |(h, (s, o)): (usize, (&mut [f32], &mut [f32]))| {
            let kh = h % c.k_heads;
            let decay = (softplus(alpha[h] + self.dt[h]) * self.a[h]).exp();
            let b = 1.0 / (1.0 + (-beta[h]).exp());
            let (qh, kh) = (&q[kh * n..][..n], &k[kh * n..][..n]);
            head_step(s, qh, kh, &v[h * n..][..n], decay, b, o, isa);
        };
        if states.len() < SERIAL_FLOATS {
            states
                .chunks_exact_mut(n * n)
                .zip(o.chunks_exact_mut(n))
                .enumerate()
                .for_each(head);
        } else {
            states
                .par_chunks_exact_mut(n * n)
                .zip(o.par_chunks_exact_mut(n))
                .enumerate()
                .for_each(head);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step against the rule written out with the state as a matrix `S[key][value]`.
    #[test]
    fn a_head_step_is_the_delta_rule() {
        let n = 16;
        let start: Vec<f32> = (0..n * n).map(|i| (i as f32 * 0.37).sin()).collect();
        let q: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3).cos()).collect();
        let k: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7 + 0.2).sin()).collect();
        let v: Vec<f32> = (0..n).map(|i| i as f32 - 1.5).collect();
        let (decay, beta) = (0.8f32, 0.6f32);
        // S[i][j] = s[j·n + i].
        let mut m = vec![vec![0f64; n]; n];
        for i in 0..n {
            for j in 0..n {
                m[i][j] = start[j * n + i] as f64 * decay as f64;
            }
        }
        let mut want = vec![0f64; n];
        for j in 0..n {
            let sk: f64 = (0..n).map(|i| m[i][j] * k[i] as f64).sum();
            let d = (v[j] as f64 - sk) * beta as f64;
            for i in 0..n {
                m[i][j] += k[i] as f64 * d;
            }
            want[j] = (0..n).map(|i| m[i][j] * q[i] as f64).sum::<f64>() / (n as f64).sqrt();
        }
        // Every instruction set present, from the same start.
        for isa in [Isa::Scalar, Isa::detect()] {
            let (mut s, mut o) = (start.clone(), vec![0f32; n]);
            head_step(&mut s, &q, &k, &v, decay, beta, &mut o, isa);
            for j in 0..n {
                assert!(
                    (o[j] as f64 - want[j]).abs() < 1e-5,
                    "{isa:?}: {o:?} {want:?}"
                );
                for i in 0..n {
                    assert!((s[j * n + i] as f64 - m[i][j]).abs() < 1e-5, "{isa:?}");
                }
            }
        }
    }

    #[test]
    fn l2_norm_gives_unit_heads_and_softplus_is_ggmls() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        l2_norm(&mut x, 4, 0.0);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
        assert!(x[4..].iter().all(|v| (v - 0.5).abs() < 1e-6));
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
    }
}
