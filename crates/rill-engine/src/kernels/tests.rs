//! The kernels against the scalar reference, on every instruction set the CPU has, and the
//! row independence the flow relies on.

use super::*;

/// A small deterministic generator (the tests need no `rand`).
pub(crate) struct Lcg(pub u64);
impl Lcg {
    /// Uniform in [-1, 1).
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
    /// `n` whole numbers in `[lo, hi]`, each 32-value block's first `top`, so that its
    /// quantisation scale is exactly 1.
    pub fn ints(&mut self, n: usize, lo: i32, hi: i32, top: i32) -> Vec<f32> {
        (0..n)
            .map(|i| match i % 32 {
                0 => top as f32,
                _ => {
                    let u = (self.next() + 1.0) / 2.0; // [0, 1)
                    (lo + ((u * (hi - lo + 1) as f32) as i32).min(hi - lo)) as f32
                }
            })
            .collect()
    }
}

fn q4_1(x: &[f32]) -> Vec<BlockQ4_1> {
    // ggml's quantize_row_q4_1.
    x.chunks_exact(QK)
        .map(|xs| {
            let min = xs.iter().copied().fold(f32::INFINITY, f32::min);
            let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut b = BlockQ4_1 {
                d: f16::from_f32(d).to_bits(),
                m: f16::from_f32(min).to_bits(),
                qs: [0; 16],
            };
            for j in 0..16 {
                let q0 = (((xs[j] - min) * id + 0.5) as u8).min(15);
                let q1 = (((xs[j + 16] - min) * id + 0.5) as u8).min(15);
                b.qs[j] = q0 | (q1 << 4);
            }
            b
        })
        .collect()
}

#[test]
fn every_simd_dot_product_equals_the_scalar_reference() {
    let mut r = Lcg(7);
    // 1, 3 and 18 blocks (this model's 576 columns), 49 (ragged), 96.
    for blocks in [1, 3, 18, 49, 96] {
        let w = r.vec(blocks * QK);
        let x: Vec<f32> = r.vec(blocks * QK).iter().map(|v| v * 3.0).collect();
        let wq = q4_1(&w);
        let mut x1 = vec![BlockQ8_1::default(); blocks];
        quantize_q8_1(&x, &mut x1);
        let mut w8 = vec![BlockQ8_0::default(); blocks];
        let mut x8 = vec![BlockQ8_0::default(); blocks];
        quantize_q8_0(&w, &mut w8);
        quantize_q8_0(&x, &mut x8);
        let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        let (ref41, ref80) = (
            dot_q4_1_q8_1_scalar(&wq, &x1),
            dot_q8_0_q8_0_scalar(&w8, &x8),
        );
        // The reference is the real product, up to quantisation error.
        let scale = (blocks * QK) as f32;
        assert!(
            (ref41 - exact).abs() < 0.1 * scale.sqrt() * 3.0,
            "{ref41} vs {exact}"
        );
        assert!(
            (ref80 - exact).abs() < 0.02 * scale.sqrt() * 3.0,
            "{ref80} vs {exact}"
        );
        for isa in Isa::available() {
            let (a, b) = (isa.dot_q4_1_q8_1(&wq, &x1), isa.dot_q8_0_q8_0(&w8, &x8));
            let tol = |v: f32| 1e-4 * v.abs().max(1.0);
            assert!(
                (a - ref41).abs() <= tol(ref41),
                "{isa:?} q4_1 {blocks}: {a} vs {ref41}"
            );
            assert!(
                (b - ref80).abs() <= tol(ref80),
                "{isa:?} q8_0 {blocks}: {b} vs {ref80}"
            );
            if isa == Isa::Neon {
                // NEON only computes the integer sums; the rest is the reference's own code.
                assert_eq!(
                    (a.to_bits(), b.to_bits()),
                    (ref41.to_bits(), ref80.to_bits())
                );
            }
        }
    }
}

/// Every tile shape (1–2 weight rows × 1–4 activation rows), both splits of the work and
/// both formats give each output what the scalar dot product of its pair gives.
#[test]
fn every_tile_equals_the_scalar_dot_products() {
    let mut r = Lcg(3);
    // 7 weight rows (a last odd one; no panels), 136 (17 panels of 8 with AVX2: three
    // tasks, the last short) and 144 (9 panels of 16 with AVX-512), 49 blocks (ragged); 1–9
    // rows (decode, batched decode, every remainder of 4) and 70 (prefill, the last task
    // short).
    let k = 49 * QK;
    for (n_out, dtype) in [7, 136, 144]
        .into_iter()
        .flat_map(|n| [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4_0].map(|d| (n, d)))
    {
        let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, dtype).unwrap();
        for m in (1..=9).chain([70]) {
            let x = r.vec(m * k);
            for isa in Isa::available() {
                let lin = QLinear::from_qtensor(&q, isa).unwrap();
                let mut out = vec![0f32; m * n_out];
                lin.matmul(&x, m, &mut out);
                for (i, row) in out.chunks_exact(n_out).enumerate() {
                    let xs = &x[i * k..(i + 1) * k];
                    for (j, &v) in row.iter().enumerate() {
                        let want = lin.reference(j, xs);
                        assert!(
                            (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{dtype:?} {isa:?} m={m} ({i}, {j}): {v} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// A row's output is the same, bit for bit, alone (the dot products) and among others (the
/// tiles, either split): decoding answers together changes none of their numbers, and a
/// prefill chunk's matmuls give each row what a one-row step would.
#[test]
fn an_instruction_set_the_cpu_lacks_runs_the_reference() {
    // The other architecture's SIMD is never available here.
    #[cfg(target_arch = "x86_64")]
    let foreign = Isa::Neon;
    #[cfg(not(target_arch = "x86_64"))]
    let foreign = Isa::AvxVnni;
    assert_eq!(foreign.checked(), Isa::Scalar);
    let mut r = Lcg(5);
    let w = q4_1(&r.vec(4 * QK));
    let mut a = vec![BlockQ8_1::default(); 4];
    quantize_q8_1(&r.vec(4 * QK), &mut a);
    assert_eq!(
        foreign.dot_q4_1_q8_1(&w, &a).to_bits(),
        dot_q4_1_q8_1_scalar(&w, &a).to_bits()
    );
}

#[test]
fn the_vector_quantisers_equal_the_scalar_ones() {
    let mut rng = Lcg(21);
    // Random blocks at several scales, an all-zero block, and blocks whose max is 127 so
    // that x / d lands on halves (rounded away from zero, not to even).
    let mut x: Vec<f32> = [1e-3f32, 1.0, 300.0]
        .iter()
        .flat_map(|s| rng.vec(8 * QK).into_iter().map(move |v| v * s))
        .collect();
    x.extend([0.0; QK]);
    for sign in [1.0f32, -1.0] {
        x.push(127.0 * sign);
        x.extend((1..QK).map(|i| sign * (i as f32 * 4.0 - 0.5)));
    }
    let blocks = x.len() / QK;
    for isa in Isa::available().into_iter().filter(|i| i.avx2()) {
        let (mut a0, mut b0) = (vec![BlockQ8_0 { d: 0, qs: [0; QK] }; blocks], vec![]);
        b0.resize(blocks, a0[0]);
        quantize_q8_0(&x, &mut a0);
        BlockQ8_0::quantize(isa, &x, &mut b0);
        assert_eq!(a0, b0, "{isa:?} q8_0");
        let mut a1 = vec![BlockQ8_1::default(); blocks];
        let mut b1 = vec![BlockQ8_1::default(); blocks];
        quantize_q8_1(&x, &mut a1);
        BlockQ8_1::quantize(isa, &x, &mut b1);
        assert_eq!(a1, b1, "{isa:?} q8_1");
    }
}

#[test]
fn a_row_gives_the_same_bits_alone_and_in_a_batch() {
    let mut r = Lcg(31);
    for n_out in [11, 136, 144] {
        a_row_gives_the_same_bits(&mut r, n_out);
    }
}

/// [`a_row_gives_the_same_bits_alone_and_in_a_batch`] for `n_out` weight rows (136: panels
/// of 8; 144: of 16 with AVX-512).
fn a_row_gives_the_same_bits(r: &mut Lcg, n_out: usize) {
    let k = 576;
    let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
    for dtype in [
        GgmlDType::Q4_1,
        GgmlDType::Q4_0,
        GgmlDType::Q8_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
        GgmlDType::F16,
        GgmlDType::BF16,
    ] {
        let k = if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) {
            512
        } else {
            k
        };
        let wt = wt.narrow(1, 0, k).unwrap().contiguous().unwrap();
        let q = QTensor::quantize(&wt, dtype).unwrap();
        for isa in Isa::available() {
            let lin = QLinear::from_qtensor(&q, isa).unwrap();
            for m in [3, 70] {
                let x = r.vec(m * k);
                let mut together = vec![0f32; m * n_out];
                lin.matmul(&x, m, &mut together);
                for (i, row) in together.chunks_exact(n_out).enumerate() {
                    let mut alone = vec![0f32; n_out];
                    lin.matmul(&x[i * k..(i + 1) * k], 1, &mut alone);
                    assert_eq!(row, &alone[..], "{dtype:?} {isa:?} m={m} row {i}");
                }
            }
        }
    }
}

/// The panel kernels of every instruction set give the same bits: AVX2's (`maddubs`),
/// AVX-VNNI's and AVX-512's (panels of sixteen rows), so a faster CPU changes no answer.
#[test]
fn every_panel_kernel_gives_the_same_bits() {
    let mut r = Lcg(41);
    let k = 576;
    // One panel of eight (AVX-512 runs it with the 256-bit kernels), 17 of eight, 9 of
    // sixteen (the last task short).
    for n_out in [8, 136, 144] {
        let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q4_0, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let panels: Vec<(Isa, QLinear)> = Isa::available()
                .into_iter()
                .map(|isa| (isa, QLinear::from_qtensor(&q, isa).unwrap()))
                .filter(|(_, l)| !matches!(l.weights, Weights::Made(Made::Q4_1(_) | Made::Q8_0(_))))
                .collect();
            for m in [1, 3, 4, 5, 70] {
                let x = r.vec(m * k);
                let run = |l: &QLinear| {
                    let mut out = vec![0f32; m * n_out];
                    l.matmul(&x, m, &mut out);
                    out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                let Some(((first, reference), rest)) = panels.split_first() else {
                    continue;
                };
                let want = run(reference);
                for (isa, l) in rest {
                    assert!(
                        run(l) == want,
                        "{dtype:?} n_out={n_out} m={m}: {isa:?} differs from {first:?}"
                    );
                }
            }
        }
    }
}

/// Every instruction set's kernels, rows and panels, against the integer definition of the
/// product (issue 13: comparing panels with each other checks nothing on a CPU with one
/// instruction set). Weights and activations are integers chosen so that every block's
/// scale is exactly 1 (each block holds the largest magnitude) and every sum is exact in
/// f32: any kernel whose integer block sums are right gives the exact product, bit for bit,
/// whatever its order of additions. What this CPU cannot run is printed as skipped.
fn layout(l: &QLinear) -> &'static str {
    let Weights::Made(made) = &l.weights else {
        return "rows as the file holds them";
    };
    match made {
        Made::Q4_1(_) | Made::Q8_0(_) | Made::F16(_) | Made::Bf16(_) => "rows",
        Made::Q4_1x8(_)
        | Made::Q4_0x8(_)
        | Made::Q4Kx8(_)
        | Made::Q5Kx8(_)
        | Made::Q6Kx8(_)
        | Made::Q8_0x8(_) => "panels of 8",
        _ => "panels of 16",
    }
}

#[test]
fn every_kernel_gives_the_exact_integer_product() {
    let mut r = Lcg(43);
    let k = 576;
    let all = [
        Isa::Scalar,
        Isa::Neon,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
    ];
    let available = Isa::available();
    let skipped: Vec<_> = all.iter().filter(|i| !available.contains(i)).collect();
    eprintln!("instruction sets checked: {available:?}; skipped (not on this CPU): {skipped:?}");
    for n_out in [8, 16, 136, 144] {
        // Q8_0: weights in [-127, 127] (scale 1); Q4_1: in [-8, 7] (scale 1, minimum -8); Q4_0
        // the same (its scale is the largest magnitude over −8).
        // Activations in [x_lo, 127]: Q4_0's also in 64..127, block sums past 2,048, which its
        // offset taken in integers (AVX2's native Q4_0) keeps exact; its repacking into Q4_1
        // (without AVX2) takes an f16 offset sum there, as Q4_1 does, and is left out.
        for (dtype, lo, hi, top, x_lo) in [
            (GgmlDType::Q8_0, -127, 127, 127, -127),
            (GgmlDType::Q4_1, -8, 7, -8, -127),
            (GgmlDType::Q4_0, -8, 7, -8, -127),
            (GgmlDType::Q4_0, -8, 7, -8, 64),
        ] {
            let mut w = r.ints(n_out * k, lo, hi, top);
            if dtype == GgmlDType::Q4_1 {
                // Each block also needs its maximum 7, for a scale of (7 - -8) / 15 = 1.
                for b in w.chunks_mut(32) {
                    b[1] = 7.0;
                }
            }
            let wt = Tensor::from_vec(w.clone(), (n_out, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&wt, dtype).unwrap();
            for m in [1, 4, 5, 70] {
                let x = r.ints(m * k, x_lo, 127, 127);
                let exact: Vec<f32> = (0..m)
                    .flat_map(|i| {
                        let (x, w) = (&x, &w);
                        (0..n_out).map(move |j| {
                            (0..k)
                                .map(|c| x[i * k + c] as i64 * w[j * k + c] as i64)
                                .sum::<i64>() as f32
                        })
                    })
                    .collect();
                for &isa in &available {
                    if x_lo > 0 && !isa.avx2() {
                        continue;
                    }
                    let l = QLinear::from_qtensor(&q, isa).unwrap();
                    let mut out = vec![0f32; m * n_out];
                    l.matmul(&x, m, &mut out);
                    let bad = out
                        .iter()
                        .zip(&exact)
                        .position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(
                        bad.is_none(),
                        "{dtype:?} n_out={n_out} m={m} {isa:?} ({}): element {bad:?} is {} \
                         instead of {}",
                        layout(&l),
                        out[bad.unwrap_or(0)],
                        exact[bad.unwrap_or(0)]
                    );
                }
            }
        }
    }
}

/// candle's own matmul quantises activations as ggml does, so the two agree up to the order of
/// float additions, and for Q4_1 the offset sums: candle rounds `Σq` and `d` to f16 before
/// their product, Rill (as ggml) only the product; that difference, `Σ m·(s − s_candle)`, is
/// taken out exactly.
#[test]
fn the_matmul_equals_candles_on_the_same_weights() {
    let mut r = Lcg(11);
    // 70 rows (no panels), 72 (panels of 8 with AVX2) and 80 (of 16 with AVX-512).
    for n_out in [70, 72, 80] {
        the_matmul_equals_candles(&mut r, n_out);
    }
}

fn the_matmul_equals_candles(r: &mut Lcg, n_out: usize) {
    use candle_core::Module;
    let k = 576;
    let w = r.vec(n_out * k);
    let wt = Tensor::from_vec(w, (n_out, k), &Device::Cpu).unwrap();
    // 1 row (decode), 5 (split by weight rows), 37 (prefill: split by activation rows,
    // the last task short).
    for (m, dtype) in [1, 5, 37]
        .into_iter()
        .flat_map(|m| [(m, GgmlDType::Q4_1), (m, GgmlDType::Q8_0)])
    {
        let xt = Tensor::from_vec(r.vec(m * k), (m, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let theirs =
            candle_core::quantized::QMatMul::from_qtensor(QTensor::quantize(&wt, dtype).unwrap())
                .unwrap()
                .forward(&xt)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
        let offsets = candle_offsets(&q, &xt.to_vec2::<f32>().unwrap());
        for isa in Isa::available() {
            let lin = QLinear::from_qtensor(&q, isa).expect("a supported format");
            let ours = lin.forward(&xt).unwrap().to_vec2::<f32>().unwrap();
            for (a, (b, o)) in ours
                .iter()
                .flatten()
                .zip(theirs.iter().flatten().zip(&offsets))
            {
                assert!(
                    (a - (b + o)).abs() <= 1e-3 * b.abs().max(1.0),
                    "{dtype:?} {isa:?}: {a} vs {b} + {o}"
                );
            }
        }
    }
}

/// Per output (`m × n_out`), what Rill's Q4_1 offset sums add beyond candle's: `Σ_b m_b·(s_b −
/// f16(f16(Σq_b)·f16(d_b)))`; zeros for other formats.
fn candle_offsets(q: &QTensor, xs: &[Vec<f32>]) -> Vec<f32> {
    let n_out = q.shape().dims()[0];
    if q.dtype() != GgmlDType::Q4_1 {
        return vec![0.0; xs.len() * n_out];
    }
    let w: Vec<BlockQ4_1> = blocks(&q.data().unwrap()).unwrap();
    let kb = w.len() / n_out;
    let f = |b: u16| f16::from_bits(b).to_f32();
    xs.iter()
        .flat_map(|x| {
            let mut a = vec![BlockQ8_1::default(); kb];
            quantize_q8_1(x, &mut a);
            let ds: Vec<f32> = a
                .iter()
                .map(|a| f(a.s) - (f16::from_f32(a.sum as f32) * f16::from_bits(a.d)).to_f32())
                .collect();
            let w = &w;
            (0..n_out).map(move |j| {
                let row = &w[j * kb..(j + 1) * kb];
                row.iter().zip(&ds).map(|(b, d)| f(b.m) * d).sum::<f32>()
            })
        })
        .collect()
}

#[test]
fn a_stacked_matrix_gives_each_part_its_own_output() {
    // Panels of eight rows, and of sixteen with AVX-512.
    for rows in [[40, 8, 8], [48, 16, 16]] {
        a_stacked_matrix_gives_each_part(rows);
    }
}

fn a_stacked_matrix_gives_each_part(rows: [usize; 3]) {
    let mut r = Lcg(5);
    let k = 64;
    let parts: Vec<(usize, Tensor)> = rows
        .into_iter()
        .map(|n| {
            (
                n,
                Tensor::from_vec(r.vec(n * k), (n, k), &Device::Cpu).unwrap(),
            )
        })
        .collect();
    let x = Tensor::from_vec(r.vec(3 * k), (3, k), &Device::Cpu).unwrap();
    let lin = |t: &Tensor| {
        QLinear::from_qtensor(
            &QTensor::quantize(t, GgmlDType::Q4_1).unwrap(),
            Isa::detect(),
        )
        .unwrap()
    };
    let alone: Vec<Vec<Vec<f32>>> = parts
        .iter()
        .map(|(_, t)| lin(t).forward(&x).unwrap().to_vec2().unwrap())
        .collect();
    let same: Vec<QLinear> = parts.iter().map(|(_, t)| lin(t)).collect();
    assert!(QLinear::stackable(&same));
    let stacked = QLinear::stack(same).unwrap();
    let widths: Vec<usize> = parts.iter().map(|(n, _)| *n).collect();
    let outs = stacked.forward_parts(&x, &widths).unwrap();
    for (o, a) in outs.iter().zip(&alone) {
        assert_eq!(&o.to_vec2::<f32>().unwrap(), a);
    }
    // Mixed formats do not stack.
    let q8 = QLinear::from_qtensor(
        &QTensor::quantize(&parts[1].1, GgmlDType::Q8_0).unwrap(),
        Isa::detect(),
    )
    .unwrap();
    let mixed = vec![lin(&parts[0].1), q8];
    assert!(!QLinear::stackable(&mixed) && QLinear::stack(mixed).is_none());
}

#[test]
fn rows_dequantise_like_candle() {
    // 16 rows: in panels of 8 with AVX2, of 16 with AVX-512.
    let wt = Tensor::from_vec(Lcg(9).vec(16 * 64), (16, 64), &Device::Cpu).unwrap();
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let theirs = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for isa in Isa::available() {
            let lin = QLinear::from_qtensor(&q, isa).unwrap();
            let ours = lin
                .rows(&[12, 0, 12, 9])
                .unwrap()
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let want = [12, 0, 12, 9].map(|j| theirs[j].clone()).to_vec();
            assert_eq!(ours, want, "{dtype:?} {isa:?}");
            assert!(lin.rows(&[16]).is_none());
        }
    }
}

/// The repacked formats: Q4_0's and Q5_0's rows come back exactly as candle dequantises
/// them, Q4_K's within the f16 rounding of their sub-block scales, Q6_K's within half an
/// 8-bit step.
#[test]
fn repacked_formats_dequantise_like_candle() {
    let (n, k) = (6, 512);
    let wt = Tensor::from_vec(Lcg(21).vec(n * k), (n, k), &Device::Cpu).unwrap();
    for (dtype, tol) in [
        (GgmlDType::Q4_0, 0.0),
        (GgmlDType::Q5_0, 0.0),
        (GgmlDType::Q4K, 1.5e-3),
        (GgmlDType::Q6K, 1.0 / 200.0),
    ] {
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let theirs = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let lin = QLinear::from_qtensor(&q, Isa::detect()).expect("a repacked format");
        let ids: Vec<u32> = (0..n as u32).collect();
        let ours = lin.rows(&ids).unwrap().unwrap().to_vec2::<f32>().unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            let max = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= tol * max, "{dtype:?}: {x} vs {y}");
            }
        }
    }
}

/// Their products against the exact product of the weights as candle dequantises them: off
/// only by the rounding of the 8-bit activations (and Q6_K's requantisation), a small part
/// of Σ|w·x|. A wrong nibble or scale layout would be off by a large part of it.
#[test]
fn the_repacked_formats_multiply_like_their_weights() {
    let mut r = Lcg(23);
    // 16 rows: Q4_0 and Q4_K repacked into Q4_1 go on into panels with AVX2.
    let (n_out, k) = (16, 768);
    let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q5_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ] {
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let w = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for m in [1, 5, 70] {
            let x = r.vec(m * k);
            for isa in Isa::available() {
                let lin = QLinear::from_qtensor(&q, isa).unwrap();
                let mut out = vec![0f32; m * n_out];
                lin.matmul(&x, m, &mut out);
                for (i, row) in out.chunks_exact(n_out).enumerate() {
                    let xs = &x[i * k..(i + 1) * k];
                    for (j, &v) in row.iter().enumerate() {
                        let exact: f32 = w[j].iter().zip(xs).map(|(a, b)| a * b).sum();
                        let size: f32 = w[j].iter().zip(xs).map(|(a, b)| (a * b).abs()).sum();
                        assert!(
                            (v - exact).abs() <= 0.01 * size,
                            "{dtype:?} {isa:?} m={m}: {v} vs {exact} (Σ|w·x| {size})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn unsupported_formats_and_ragged_rows_are_left_to_candle() {
    let wt = Tensor::zeros((8, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
    for dtype in [GgmlDType::Q5K, GgmlDType::Q5_1] {
        let q = QTensor::quantize(&wt, dtype).unwrap();
        assert!(
            QLinear::from_qtensor(&q, Isa::Scalar).is_none(),
            "{dtype:?}"
        );
    }
    // An empty row (a malformed file) is not ours to divide by.
    let empty = Tensor::zeros((8, 0), candle_core::DType::F32, &Device::Cpu).unwrap();
    let q = QTensor::quantize(&empty, GgmlDType::Q8_0).unwrap();
    assert!(QLinear::from_qtensor(&q, Isa::Scalar).is_none());
}
