//! The activation quantisers (as ggml quantises), block dequantisation, and the scalar
//! reference dot products every SIMD path is tested against.

use super::*;

/// A Q4_1 block's 32 weights into `o`.
pub(crate) fn dequantize_q4_1(t: &[f32], b: &BlockQ4_1, o: &mut [f32]) {
    let (d, m) = (h(t, b.d), h(t, b.m));
    for (i, q) in b.qs.iter().enumerate() {
        o[i] = d * (q & 0x0F) as f32 + m;
        o[i + QK / 2] = d * (q >> 4) as f32 + m;
    }
}

/// A Q4_0 block's 32 weights into `o`.
pub(crate) fn dequantize_q4_0(t: &[f32], b: &BlockQ4_0, o: &mut [f32]) {
    let d = h(t, b.d);
    for (i, q) in b.qs.iter().enumerate() {
        o[i] = d * ((q & 0x0F) as i32 - 8) as f32;
        o[i + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// A Q4_K block's 256 weights into `o`, as ggml computes them: `(d·sc)·q − dmin·m`.
pub(crate) fn dequantize_q4_k(t: &[f32], b: &BlockQ4K, o: &mut [f32]) {
    let (d, dmin) = (h(t, b.d), h(t, b.dmin));
    for (j, o) in o.chunks_exact_mut(QK).enumerate() {
        let (sc, m) = scale_min_k4(j, &b.scales);
        let (ds, dm) = (d * sc as f32, dmin * m as f32);
        for (e, v) in o.iter_mut().enumerate() {
            *v = ds * q4_k_nibble(b, j, e) as f32 - dm;
        }
    }
}

/// A Q5_K block's 256 weights into `o`, as ggml computes them: `(d·sc)·q − dmin·m`.
pub(crate) fn dequantize_q5_k(t: &[f32], b: &BlockQ5K, o: &mut [f32]) {
    let (d, dmin) = (h(t, b.d), h(t, b.dmin));
    for (j, o) in o.chunks_exact_mut(QK).enumerate() {
        let (sc, m) = scale_min_k4(j, &b.scales);
        let (ds, dm) = (d * sc as f32, dmin * m as f32);
        for (e, v) in o.iter_mut().enumerate() {
            *v = ds * q5_k_value(b, j, e) as f32 - dm;
        }
    }
}

/// A Q6_K block's 256 weights into `o`, as ggml computes them: `(d·sc)·(q − 32)`.
pub(crate) fn dequantize_q6_k(t: &[f32], b: &BlockQ6K, o: &mut [f32]) {
    let d = h(t, b.d);
    for (e, v) in o.iter_mut().enumerate().take(256) {
        *v = d * b.scales[e / 16] as f32 * (q6_k_value(b, e) as i32 - 32) as f32;
    }
}

/// One row's `blocks` into `out`, `size` weights each, by the format's `dequantize`.
pub(crate) fn dequantize_blocks<B>(
    blocks: impl Iterator<Item = B>,
    out: &mut [f32],
    size: usize,
    dequantize: fn(&[f32], &B, &mut [f32]),
) {
    let t = f16_table();
    for (b, o) in blocks.zip(out.chunks_exact_mut(size)) {
        dequantize(t, &b, o);
    }
}

/// A Q8_0 block's 32 weights into `o`.
pub(crate) fn dequantize_q8_0(t: &[f32], b: &BlockQ8_0, o: &mut [f32]) {
    let d = h(t, b.d);
    for (v, q) in o.iter_mut().zip(&b.qs) {
        *v = d * *q as f32;
    }
}

/// ggml's `quantize_row_q8_0` as its x86 build runs it on activations: `d = amax/127`, each
/// value times `127/amax` (not `1/d`, which its portable reference takes) rounded half to even.
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (d, _) = quantize_q8(xs, &mut b.qs);
        b.d = f16::from_f32(d).to_bits();
    }
}

/// ggml's `quantize_row_q8_1` as its x86 build runs it: [`quantize_q8_0`]'s values, `s` the f32
/// product `d·Σq` rounded once to f16 (candle rounds `d` and `Σq` first), and the exact `Σq`.
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (d, sum) = quantize_q8(xs, &mut b.qs);
        b.d = f16::from_f32(d).to_bits();
        b.s = f16::from_f32(d * sum as f32).to_bits();
        b.sum = sum as i16;
    }
}

/// One block of 32 activations into `qs` as ggml's x86 build quantises them: `(d, Σq)`, `d`
/// in f32.
fn quantize_q8(xs: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    (amax / 127.0, sum)
}

/// The scalar reference: Σ over blocks of d_x·d_y·Σ(q_x·q_y) + m_x·s_y.
pub fn dot_q4_1_q8_1_scalar(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let si = nibbles_times(&x.qs, y);
        sum += si as f32 * h(t, x.d) * h(t, y.d) + h(t, x.m) * h(t, y.s);
    }
    sum
}

/// The scalar reference for Q4_0 as the file holds it, as ggml computes it: per block the
/// exact integer `Σ(q_x − 8)·q_y` (here `Σq_x·q_y − 8·Σq_y`), times `d_x·d_y`.
pub fn dot_q4_0_q8_1_scalar(x: &[BlockQ4_0], y: &[BlockQ8_1]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let si = nibbles_times(&x.qs, y) - 8 * y.sum as i32;
        sum = (h(t, x.d) * h(t, y.d)).mul_add(si as f32, sum);
    }
    sum
}

/// A block's 32 nibbles (element j low, j + 16 high) times its activations: the exact Σq·a.
fn nibbles_times(qs: &[u8; QK / 2], y: &BlockQ8_1) -> i32 {
    let mut si = 0i32;
    for (j, q) in qs.iter().enumerate() {
        si += (q & 0x0F) as i32 * y.qs[j] as i32;
        si += (q >> 4) as i32 * y.qs[j + QK / 2] as i32;
    }
    si
}

/// The scalar reference: Σ over blocks of d_x·d_y·Σ(q_x·q_y).
pub fn dot_q8_0_q8_0_scalar(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let si: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
        sum += si as f32 * h(t, x.d) * h(t, y.d);
    }
    sum
}

/// ggml's `quantize_row_q8_K` (what it runs on x86 too): per 256, the value of largest
/// magnitude (the first of them) maps to −127, `d = 1/iscale` in f32, and each 16's sum.
#[inline(always)]
pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    for (xs, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        if amax == 0.0 {
            *b = BlockQ8K::default();
            continue;
        }
        // The first element of largest magnitude, with its sign (ggml's `max`).
        let max = *xs.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

/// [`quantize_q8_k`] compiled for AVX2 (the same operations, so the same bits).
///
/// # Safety
/// Needs AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_q8_k_avx2(x: &[f32], out: &mut [BlockQ8K]) {
    quantize_q8_k(x, out)
}

/// ggml's `nearest_int`: round half to even, by the float trick it uses (|v| < 2²²).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// The scalar reference for Q4_K (super-blocks of 256) against Q8_K activations, as the
/// kernels compute it: per super-block the exact integers `t = Σ_j sc_j·Σ(q_x·q_y)` and
/// `s = Σ_j m_j·Σq_y`, then `sum += (d·d_y)·t` and `sum −= (dmin·d_y)·s`, each one fused
/// multiply-add.
pub fn dot_q4_k_q8_k_scalar(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let blocks = x.iter().map(|b| (b.d, b.dmin, &b.scales));
    dot_scale_min_k(blocks, y, |n, j, e| q4_k_nibble(&x[n], j, e))
}

/// The scalar reference for Q5_K against Q8_K activations, as [`dot_q4_k_q8_k_scalar`].
pub fn dot_q5_k_q8_k_scalar(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let blocks = x.iter().map(|b| (b.d, b.dmin, &b.scales));
    dot_scale_min_k(blocks, y, |n, j, e| q5_k_value(&x[n], j, e))
}

/// The K-quants with 6-bit scales and mins: super-blocks `(d, dmin, scales)` whose block n's
/// sub-block j holds `value(n, j, e)`, dotted with Q8_K activations.
fn dot_scale_min_k<'a>(
    blocks: impl ExactSizeIterator<Item = (u16, u16, &'a [u8; 12])>,
    y: &[BlockQ8K],
    value: impl Fn(usize, usize, usize) -> u8,
) -> f32 {
    assert_eq!(blocks.len(), y.len());
    let t = f16_table();
    let mut sum = 0f32;
    for (n, ((d, dmin, scales), y)) in blocks.zip(y).enumerate() {
        let (mut ts, mut ms) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, scales);
            let p: i32 = (0..QK)
                .map(|e| value(n, j, e) as i32 * y.qs[QK * j + e] as i32)
                .sum();
            ts += sc as i32 * p;
            ms += m as i32 * y.sum32(j);
        }
        sum = (h(t, d) * y.d).mul_add(ts as f32, sum);
        sum = (-(h(t, dmin) * y.d)).mul_add(ms as f32, sum);
    }
    sum
}

/// The scalar reference for Q6_K (super-blocks of 256, groups of 16) against Q8_K
/// activations, as the kernels compute it: per super-block the exact integer
/// `t = Σ_g sc_g·(Σ q_x·q_y − 32·Σq_y)` (q_x in 0..64), then `sum += (d·d_y)·t`.
pub fn dot_q6_k_q8_k_scalar(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let ts: i32 = (0..16)
            .map(|g| {
                let p: i32 = (16 * g..16 * g + 16)
                    .map(|e| q6_k_value(x, e) as i32 * y.qs[e] as i32)
                    .sum();
                x.scales[g] as i32 * (p - 32 * y.bsums[g] as i32)
            })
            .sum();
        sum = (h(t, x.d) * y.d).mul_add(ts as f32, sum);
    }
    sum
}
