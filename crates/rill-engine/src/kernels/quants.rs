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

/// One row's `blocks` into `out`, 32 weights each, by the format's `dequantize`.
pub(crate) fn dequantize_blocks<B>(
    blocks: impl Iterator<Item = B>,
    out: &mut [f32],
    dequantize: fn(&[f32], &B, &mut [f32]),
) {
    let t = f16_table();
    for (b, o) in blocks.zip(out.chunks_exact_mut(QK)) {
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
