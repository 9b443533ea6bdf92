//! ARM's Advanced SIMD (every AArch64 CPU has it). Each block's integer sum is computed with
//! widening multiplies and pairwise adds, exactly, and then scaled and added in the scalar
//! reference's own order, so the results are the reference's bit for bit.

use super::*;
use std::arch::aarch64::*;

/// Σ a·b over 16 signed bytes, widened to 16 bits (at most 127·128 per product) and
/// accumulated pairwise into 32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot16(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// # Safety
/// NEON; `x` and `y` the same length.
#[target_feature(enable = "neon")]
pub unsafe fn dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let q = vld1q_u8(x.qs.as_ptr());
        let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
        let acc = dot16(vdupq_n_s32(0), lo, vld1q_s8(y.qs.as_ptr()));
        let acc = dot16(acc, hi, vld1q_s8(y.qs.as_ptr().add(QK / 2)));
        let si = vaddvq_s32(acc);
        sum += si as f32 * h(t, x.d) * h(t, y.d) + h(t, x.m) * h(t, y.s);
    }
    sum
}

/// # Safety
/// NEON; `x` and `y` the same length.
#[target_feature(enable = "neon")]
pub unsafe fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let t = f16_table();
    let mut sum = 0f32;
    for (x, y) in x.iter().zip(y) {
        let acc = dot16(
            vdupq_n_s32(0),
            vld1q_s8(x.qs.as_ptr()),
            vld1q_s8(y.qs.as_ptr()),
        );
        let acc = dot16(
            acc,
            vld1q_s8(x.qs.as_ptr().add(16)),
            vld1q_s8(y.qs.as_ptr().add(16)),
        );
        sum += vaddvq_s32(acc) as f32 * h(t, x.d) * h(t, y.d);
    }
    sum
}
