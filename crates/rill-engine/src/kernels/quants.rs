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

/// The two sums of 16 of a block of 32 signed bytes.
pub(crate) fn half_sums(qs: &[i8; QK]) -> [i32; 2] {
    let sum = |h: &[i8]| h.iter().map(|&q| q as i32).sum();
    [sum(&qs[..QK / 2]), sum(&qs[QK / 2..])]
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

/// ggml's `quantize_row_q8_0`.
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d).to_bits();
        for (q, v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
        }
    }
}

/// ggml's `quantize_row_q8_1` (as candle does it, `s` rounded through f16).
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    for (xs, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d16 = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.d = d16.to_bits();
        b.s = (f16::from_f32(sum as f32) * d16).to_bits();
    }
}

/// The scalar reference: Σ over blocks of d_x·d_y·Σ(q_x·q_y) + m_x·s_y.
pub fn dot_q4_1_q8_1_scalar(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let mut si = 0i32;
        for j in 0..QK / 2 {
            si += (x.qs[j] & 0x0F) as i32 * y.qs[j] as i32;
            si += (x.qs[j] >> 4) as i32 * y.qs[j + QK / 2] as i32;
        }
        sum += si as f32 * h(t, x.d) * h(t, y.d) + h(t, x.m) * h(t, y.s);
    }
    sum
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

/// The scalar reference for Q4_K (super-blocks of 256) against Q8_1 activations (blocks of 32,
/// eight per super-block): Σ over sub-blocks of `(d·sc)·d_y·Σ(q_x·q_y) − (dmin·m)·s_y`. The
/// activations are those of Q4_1, so a Q4_K matrix stacks and runs beside Q4_1 ones.
pub fn dot_q4_k_q8_1_scalar(x: &[BlockQ4K], y: &[BlockQ8_1]) -> f32 {
    let blocks = x.iter().map(|b| (b.d, b.dmin, &b.scales));
    dot_scale_min_k(blocks, y, |n, j, e| q4_k_nibble(&x[n], j, e))
}

/// The scalar reference for Q5_K against Q8_1 activations, as [`dot_q4_k_q8_1_scalar`].
pub fn dot_q5_k_q8_1_scalar(x: &[BlockQ5K], y: &[BlockQ8_1]) -> f32 {
    let blocks = x.iter().map(|b| (b.d, b.dmin, &b.scales));
    dot_scale_min_k(blocks, y, |n, j, e| q5_k_value(&x[n], j, e))
}

/// The K-quants with 6-bit scales and mins: super-blocks `(d, dmin, scales)` whose block n's
/// sub-block j holds `value(n, j, e)`, dotted with Q8_1 activations (eight per super-block).
fn dot_scale_min_k<'a>(
    blocks: impl ExactSizeIterator<Item = (u16, u16, &'a [u8; 12])>,
    y: &[BlockQ8_1],
    value: impl Fn(usize, usize, usize) -> u8,
) -> f32 {
    assert_eq!(8 * blocks.len(), y.len());
    let t = f16_table();
    let mut sum = 0f32;
    for (n, ((d, dmin, scales), ys)) in blocks.zip(y.chunks_exact(8)).enumerate() {
        let (d, dmin) = (h(t, d), h(t, dmin));
        for (j, y) in ys.iter().enumerate() {
            let (sc, m) = scale_min_k4(j, scales);
            let si: i32 = (0..QK)
                .map(|e| value(n, j, e) as i32 * y.qs[e] as i32)
                .sum();
            sum += si as f32 * (d * sc as f32) * h(t, y.d) - dmin * m as f32 * h(t, y.s);
        }
    }
    sum
}

/// The scalar reference for Q6_K (super-blocks of 256, groups of 16) against Q8_1
/// activations: Σ over sub-blocks of 32 of `(d·d_y)·Σ_g sc_g·Σ(q_x − 32)·q_y`, the inner sums
/// exact integers.
pub fn dot_q6_k_q8_1_scalar(x: &[BlockQ6K], y: &[BlockQ8_1]) -> f32 {
    assert_eq!(8 * x.len(), y.len());
    let t = f16_table();
    let mut sum = 0f32;
    for (x, ys) in x.iter().zip(y.chunks_exact(8)) {
        for (j, y) in ys.iter().enumerate() {
            let group = |g: usize| -> i32 {
                (16 * g..16 * g + 16)
                    .map(|e| (q6_k_value(x, 32 * j + e) as i32 - 32) * y.qs[e] as i32)
                    .sum()
            };
            let si = x.scales[2 * j] as i32 * group(0) + x.scales[2 * j + 1] as i32 * group(1);
            sum += (h(t, x.d) * h(t, y.d)) * si as f32;
        }
    }
    sum
}
