//! MXFP4, the 4-bit format of gpt-oss's expert weights (OCP Microscaling, as ggml stores it:
//! `GGML_TYPE_MXFP4`): blocks of 32 weights, each a 4-bit E2M1 code, sharing one E8M0 scale
//! (a power of two). ggml keeps the E2M1 values doubled as integers (`kvalues_mxfp4`: 0, ±1, ±2,
//! ±3, ±4, ±6, ±8, ±12) and halves the scale instead (`ggml_e8m0_to_fp32_half`), so a weight is
//! `2^(e − 128) · kvalues[q]` and a block's products with 8-bit activations are exact integers.
//!
//! The matrix runs as the file holds it (17 bytes per 32 weights, no repacking), dotted with
//! activations quantised as ggml's Q8_0 (`ggml_vec_dot_mxfp4_q8_0`). Every path sums the same
//! way, so every path gives the scalar reference's bits: per block, eight lanes each take the
//! exact integer sum of four neighbouring products (elements `4l .. 4l+4`), and add it times
//! the block's scale `2^(e−128)·d_y` by one fused multiply-add; the eight lanes are then added
//! as one fixed tree. AVX2 decodes a block's codes with one table lookup (`pshufb`) and takes
//! the byte products with `maddubs`, AVX-VNNI with `vpdpbusd`, AVX-512 with its EVEX form on
//! 256-bit registers; the integers are the same, and so is everything after them. A row's
//! output never depends on the rows beside it (several activation rows share the decoded
//! weight block, nothing else). NEON runs the scalar reference.

use super::*;

/// 32 weights: `2^(e − 128) · KVALUES[q]`; element j in the low nibble of `qs[j]`, element
/// j + 16 in the high nibble (as [`BlockQ4_0`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}

// Read straight from GGUF bytes: no padding allowed (and byte-aligned, so any slice of the
// file's bytes is one).
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// E2M1's values, doubled (ggml's `kvalues_mxfp4`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The scale `2^(e − 128)` of an E8M0 exponent, halved for the doubled values (ggml's
/// `ggml_e8m0_to_fp32_half`): exact for every `e`, subnormal for 0 and 1.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    E8M0_HALF[usize::from(e)]
}

/// [`e8m0_half`] of every exponent, looked up rather than branched on in the kernels.
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = match e {
            0 | 1 => f32::from_bits(0x0020_0000 << e),
            _ => f32::from_bits((e as u32 - 1) << 23),
        };
        e += 1;
    }
    t
};

/// Element `i` of a block as its doubled E2M1 integer.
#[inline(always)]
fn code(b: &BlockMxfp4, i: usize) -> i8 {
    let byte = b.qs[i % (QK / 2)];
    KVALUES_MXFP4[usize::from(if i < QK / 2 { byte & 0x0F } else { byte >> 4 })]
}

/// A block's 32 weights into `o`.
pub(crate) fn dequantize_mxfp4(_: &[f32], b: &BlockMxfp4, o: &mut [f32]) {
    let d = e8m0_half(b.e);
    for (i, v) in o.iter_mut().enumerate().take(QK) {
        *v = d * code(b, i) as f32;
    }
}

/// The eight lanes added as the SIMD paths add them: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline(always)]
fn lanes_sum(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// The scalar reference: per block and lane `l`, the exact Σ of products `4l .. 4l+4` times
/// `2^(e−128)·d_y`, added to the lane by one fused multiply-add; then [`lanes_sum`].
pub fn dot_mxfp4_q8_0_scalar(x: &[BlockMxfp4], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let t = f16_table();
    let mut lanes = [0f32; 8];
    for (x, y) in x.iter().zip(y) {
        let scale = e8m0_half(x.e) * h(t, y.d);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|i| code(x, i) as i32 * y.qs[i] as i32)
                .sum();
            *lane = scale.mul_add(p as f32, *lane);
        }
    }
    lanes_sum(lanes)
}

impl Isa {
    /// A row of MXFP4 weights dotted with a row of Q8_0 activations.
    pub fn dot_mxfp4_q8_0(self, x: &[BlockMxfp4], y: &[BlockQ8_0]) -> f32 {
        self.checked().dot_mxfp4_q8_0_checked(x, y)
    }

    /// As [`dot_mxfp4_q8_0`](Self::dot_mxfp4_q8_0), for an `Isa` already checked.
    pub(crate) fn dot_mxfp4_q8_0_checked(self, x: &[BlockMxfp4], y: &[BlockQ8_0]) -> f32 {
        assert_eq!(x.len(), y.len());
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C (and
            // AVX-512 F/BW/VL/VNNI or AVX-VNNI where `simd::tile` picks them); one weight row
            // of `x.len()` blocks against one activation row of as many.
            return unsafe { simd::tile::<1, 1>(self, x.as_ptr(), x.len(), y.as_ptr()) }[0][0];
        }
        dot_mxfp4_q8_0_scalar(x, y)
    }
}

impl Format for BlockMxfp4 {
    type Act = BlockQ8_0;
    // The tiles pick among three instruction sets by the `Isa` they are given.
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, BlockQ8_0>; 2] = [simd::rows_for, simd::rows_for];

    fn dot(isa: Isa, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        isa.dot_mxfp4_q8_0_checked(w, a)
    }

    fn dots(isa: Isa, w: &[Self], a: &[BlockQ8_0], out: &mut [f32]) {
        let kb = a.len();
        assert_eq!(w.len(), out.len() * kb);
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: as in `dot_mxfp4_q8_0_checked`; `out.len()` weight rows of `kb` blocks
            // at `w` (asserted above) against one activation row of `kb`.
            return unsafe { simd::dots_for(isa, w, a, out) };
        }
        for (j, o) in out.iter_mut().enumerate() {
            *o = dot_mxfp4_q8_0_scalar(&w[j * kb..(j + 1) * kb], a);
        }
    }
}

/// The x86 paths: one tile shape (weight rows × activation rows, each count a constant)
/// compiled three times, for AVX2's `maddubs`, AVX-VNNI's `vpdpbusd` and AVX-512's.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;
    use std::arch::x86_64::*;

    /// The byte products of one block, for every instruction set: four per i32 lane.
    macro_rules! kernels {
        ($wtile:ident, $features:literal, |$u:ident, $s:ident| $dot4:expr) => {
            /// `R` MXFP4 weight rows (row r at `w + r·kb`) × `C` Q8_0 activation rows (row c
            /// at `a + c·kb`). Each weight block is decoded once for the `C` rows and each
            /// activation block loaded once for the `R`, and the `R·C` independent sums keep
            /// the FMA units busy; each pair's arithmetic is the same for every `R` and `C`,
            /// so its bits are those of the pair alone.
            ///
            /// # Safety
            /// The target features; `R·kb` blocks readable at `w`, `C·kb` at `a`.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $wtile<const R: usize, const C: usize>(
                w: *const BlockMxfp4,
                kb: usize,
                a: *const BlockQ8_0,
            ) -> [[f32; C]; R] {
                let t = f16_table();
                let table = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
                let low = _mm_set1_epi8(0x0F);
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                for b in 0..kb {
                    let mut qx = [_mm256_setzero_si256(); R];
                    let mut dx = [0f32; R];
                    for r in 0..R {
                        let x = &*w.add(r * kb + b);
                        super::super::prefetch_rows_ahead(x, kb);
                        let nibbles = _mm_loadu_si128(x.qs.as_ptr() as *const __m128i);
                        // Elements 0..16 from the low nibbles, 16..32 from the high ones.
                        let lo = _mm_shuffle_epi8(table, _mm_and_si128(nibbles, low));
                        let hi =
                            _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(nibbles, 4), low));
                        qx[r] = _mm256_set_m128i(hi, lo);
                        dx[r] = e8m0_half(x.e);
                    }
                    for c in 0..C {
                        let y = &*a.add(c * kb + b);
                        let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                        let dy = h(t, y.d);
                        for r in 0..R {
                            // |x| · (y with x's sign): u8 × i8, |products| ≤ 12·127.
                            let ($u, $s) =
                                (_mm256_sign_epi8(qx[r], qx[r]), _mm256_sign_epi8(qy, qx[r]));
                            let sums = _mm256_cvtepi32_ps($dot4);
                            let scale = _mm256_set1_ps(dx[r] * dy);
                            acc[r][c] = _mm256_fmadd_ps(scale, sums, acc[r][c]);
                        }
                    }
                }
                let mut out = [[0f32; C]; R];
                for r in 0..R {
                    for c in 0..C {
                        // `lanes_sum`'s tree.
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

    kernels!(wtile_avx2, "avx2,fma,f16c", |u, s| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    });
    kernels!(wtile_avx_vnni, "avx2,fma,f16c,avxvnni", |u, s| {
        let mut acc = _mm256_setzero_si256();
        // AVX-VNNI's VEX form (the CPU is checked at run time).
        std::arch::asm!(
            "{{vex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    });
    kernels!(
        wtile_avx512,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        |u, s| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    );

    /// Weight rows per one-row tile.
    const W_ROWS: usize = 4;

    /// [`Format::dots`] for MXFP4: the weight rows [`W_ROWS`] at a time against the one
    /// activation row.
    ///
    /// # Safety
    /// `isa` checked and [`avx2`](Isa::avx2); `out.len()` rows of `a.len()` blocks at `w`.
    pub(super) unsafe fn dots_for(isa: Isa, w: &[BlockMxfp4], a: &[BlockQ8_0], out: &mut [f32]) {
        let kb = a.len();
        for (n, o) in out.chunks_mut(W_ROWS).enumerate() {
            let (wp, ap) = (w.as_ptr().add(n * W_ROWS * kb), a.as_ptr());
            match o.len() {
                4 => {
                    let t = tile::<4, 1>(isa, wp, kb, ap);
                    o.iter_mut().zip(t).for_each(|(o, [v])| *o = v);
                }
                // The last few rows one at a time.
                _ => {
                    for (r, o) in o.iter_mut().enumerate() {
                        *o = tile::<1, 1>(isa, wp.add(r * kb), kb, ap)[0][0];
                    }
                }
            }
        }
    }

    /// A tile of weight rows × activation rows on the best instruction set `isa` allows.
    ///
    /// # Safety
    /// `isa` checked and [`avx2`](Isa::avx2); the bounds of the tiles.
    #[inline]
    pub(super) unsafe fn tile<const R: usize, const C: usize>(
        isa: Isa,
        w: *const BlockMxfp4,
        kb: usize,
        a: *const BlockQ8_0,
    ) -> [[f32; C]; R] {
        match isa {
            Isa::Avx512Vnni if has_avx512_vl() => wtile_avx512::<R, C>(w, kb, a),
            _ if isa.avx_vnni() => wtile_avx_vnni::<R, C>(w, kb, a),
            _ => wtile_avx2::<R, C>(w, kb, a),
        }
    }

    /// [`Format::rows`] for MXFP4: the weight rows two at a time against the activation rows
    /// four at a time, each weight block decoded once for the four and each activation block
    /// loaded once for the two (a last odd weight row alone).
    ///
    /// # Safety
    /// `isa` checked and [`avx2`](Isa::avx2); the bounds [`Format::rows`] asserts.
    pub(super) unsafe fn rows_for(
        isa: Isa,
        w: &[BlockMxfp4],
        acts: &Acts<BlockQ8_0>,
        is: std::ops::Range<usize>,
        out: &mut [f32],
        sj: usize,
        si: usize,
    ) {
        let kb = acts.kb;
        row_tiles!(
            0..w.len() / kb,
            is,
            2,
            [(2, 4)(2, 3)(2, 2)(2, 1)(1, 4)(1, 3)(1, 2)(1, 1)],
            (out.as_mut_ptr(), sj, si),
            |R, C, j, i| tile::<R, C>(isa, w.as_ptr().add(j * kb), kb, acts.q.as_ptr().add(i * kb))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::Lcg;

    /// Blocks quantised from `x` as gguf-py's `MXFP4.quantize_blocks` does: the exponent from
    /// the block's largest magnitude, each value the nearest code.
    fn quantize(x: &[f32]) -> Vec<BlockMxfp4> {
        x.chunks_exact(QK)
            .map(|xs| {
                let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
                let e = match amax > 0.0 {
                    true => (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8,
                    false => 0,
                };
                let d = e8m0_half(e);
                let nearest = |v: f32| {
                    (0..16u8)
                        .min_by(|&a, &b| {
                            let err = |q: u8| (d * KVALUES_MXFP4[q as usize] as f32 - v).abs();
                            err(a).total_cmp(&err(b))
                        })
                        .unwrap_or(0)
                };
                let mut b = BlockMxfp4 { e, qs: [0; 16] };
                for j in 0..16 {
                    b.qs[j] = nearest(xs[j]) | (nearest(xs[j + 16]) << 4);
                }
                b
            })
            .collect()
    }

    fn bytes(b: &[BlockMxfp4]) -> Vec<u8> {
        b.iter()
            .flat_map(|b| std::iter::once(b.e).chain(b.qs))
            .collect()
    }

    #[test]
    fn the_scale_is_a_power_of_two_for_every_exponent() {
        for e in 0..=255u8 {
            let want = 2f64.powi(e as i32 - 128);
            assert_eq!(f64::from(e8m0_half(e)), want, "e = {e}");
        }
    }

    /// Every path gives the reference's bits, and the reference is the f64 product of the
    /// dequantised weights and activations within float rounding.
    #[test]
    fn every_path_equals_the_scalar_reference_and_the_reference_the_exact_product() {
        let mut r = Lcg(11);
        for blocks in [1, 3, 18, 49, 90] {
            // Weights and activations of very different sizes per block, and exponents far
            // from 127 (the expert weights of real files are small).
            let w: Vec<f32> = r
                .vec(blocks * QK)
                .iter()
                .enumerate()
                .map(|(i, v)| v * 2f32.powi((i / QK) as i32 % 9 - 12))
                .collect();
            let x: Vec<f32> = r.vec(blocks * QK).iter().map(|v| v * 3.0).collect();
            let wq = quantize(&w);
            let mut xq = vec![BlockQ8_0::default(); blocks];
            quantize_q8_0(&x, &mut xq);
            let reference = dot_mxfp4_q8_0_scalar(&wq, &xq);
            // Exact: the dequantised values multiplied and added in f64.
            let (mut wd, mut xd) = (vec![0f32; blocks * QK], vec![0f32; blocks * QK]);
            dequantize_blocks(wq.iter().copied(), &mut wd, QK, dequantize_mxfp4);
            dequantize_blocks(xq.iter().copied(), &mut xd, QK, dequantize_q8_0);
            let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let magnitude: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            // Each product is exact in f32 (a power of two times small integers); the
            // roundings are one per block and lane and seven more.
            let bound = magnitude * f64::from(f32::EPSILON) * (blocks as f64 + 8.0);
            assert!(
                (reference as f64 - exact).abs() <= bound,
                "{blocks} blocks: {reference} vs {exact} (bound {bound})"
            );
            // The quantised product is near the real one.
            let real: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
            let scale: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            assert!(
                (reference - real).abs() <= 0.2 * scale,
                "{reference} vs {real}"
            );
            for isa in Isa::available() {
                let got = isa.dot_mxfp4_q8_0(&wq, &xq);
                assert_eq!(
                    got.to_bits(),
                    reference.to_bits(),
                    "{isa:?} {blocks}: {got} vs {reference}"
                );
            }
        }
    }

    /// The matrix from a tensor's bytes: every instruction set, every split (one row, a few,
    /// a prefill's many) gives each output the reference's bits, so a row is the same alone
    /// and in any batch.
    #[test]
    fn the_matmul_gives_every_output_the_reference_bits() {
        let mut r = Lcg(5);
        let (n_out, k) = (75, 9 * QK);
        let w = quantize(&r.vec(n_out * k));
        let raw = bytes(&w);
        for m in (1..=6).chain([70]) {
            let x = r.vec(m * k);
            for isa in Isa::available() {
                let lin = QLinear::from_raw(TensorType::Mxfp4, &[n_out, k], &raw, isa)
                    .expect("MXFP4 runs on our kernels");
                assert_eq!(lin.file_bytes(), raw.len());
                assert_eq!(lin.bytes(), raw.len(), "held as the file holds it");
                let mut out = vec![0f32; m * n_out];
                lin.matmul(&x, m, &mut out);
                for (i, row) in out.chunks_exact(n_out).enumerate() {
                    let mut a = vec![BlockQ8_0::default(); k / QK];
                    quantize_q8_0(&x[i * k..(i + 1) * k], &mut a);
                    for (j, &v) in row.iter().enumerate() {
                        let want = dot_mxfp4_q8_0_scalar(&w[j * k / QK..(j + 1) * k / QK], &a);
                        assert_eq!(v.to_bits(), want.to_bits(), "{isa:?} m={m} ({i}, {j})");
                    }
                }
                // Rows dequantise to the blocks' values.
                let mut row = vec![0f32; k];
                lin.dequantize_row(3, &mut row);
                let mut want = vec![0f32; k];
                dequantize_blocks(
                    w[3 * k / QK..4 * k / QK].iter().copied(),
                    &mut want,
                    QK,
                    dequantize_mxfp4,
                );
                assert_eq!(row, want);
            }
        }
    }

    /// Read in place from a map of the file (at odd offsets, a gate and an up far apart and
    /// stacked into one matrix, as an expert's are): every output has the bits of the same
    /// matrix copied into memory, for one row and for batches, on every instruction set; only
    /// bytes that are the map's own are read there.
    #[test]
    fn a_matrix_read_in_the_map_gives_the_copys_bits() {
        use std::io::Write;
        use std::sync::Arc;
        let mut r = Lcg(9);
        let (n, k) = (40, 5 * QK);
        let (gate, up) = (
            bytes(&quantize(&r.vec(n * k))),
            bytes(&quantize(&r.vec(n * k))),
        );
        let mut file = tempfile::tempfile().unwrap();
        let (at_gate, at_up) = (5, 5 + gate.len() + 3);
        file.write_all(&[7; 5]).unwrap();
        file.write_all(&gate).unwrap();
        file.write_all(&[1, 2, 3]).unwrap();
        file.write_all(&up).unwrap();
        // SAFETY: the test's own temporary file, only read.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
        let whole = [gate.clone(), up.clone()].concat();
        for isa in Isa::available() {
            let raw = |at: usize, len: usize| {
                let bytes = &map[at..at + len];
                QLinear::from_raw_in(
                    TensorType::Mxfp4,
                    &[n, k],
                    bytes,
                    isa,
                    Some((&map, at)),
                    false,
                )
                .unwrap()
            };
            let mapped = QLinear::stack(vec![raw(at_gate, gate.len()), raw(at_up, up.len())])
                .expect("MXFP4 parts stack");
            assert_eq!(mapped.mapped_bytes(), whole.len());
            assert_eq!(mapped.bytes(), whole.len());
            let copy = QLinear::from_raw(TensorType::Mxfp4, &[2 * n, k], &whole, isa).unwrap();
            assert_eq!(copy.mapped_bytes(), 0);
            for m in [1, 2, 3, 70] {
                let x = r.vec(m * k);
                let (a, b) = (mapped.product(&x, m), copy.product(&x, m));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{isa:?} m={m}");
            }
            let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
            mapped.dequantize_row(n + 3, &mut a);
            copy.dequantize_row(n + 3, &mut b);
            assert_eq!(a, b);
            // Bytes that are not the map's at that offset are copied, not read there.
            let elsewhere = QLinear::from_raw_in(
                TensorType::Mxfp4,
                &[n, k],
                &gate,
                isa,
                Some((&map, at_gate)),
                false,
            )
            .unwrap();
            assert_eq!(elsewhere.mapped_bytes(), 0);
        }
    }
}
